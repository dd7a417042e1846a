"""The README's quickstart, pasted into a project made by `startproject`, works: the
project migrates, passes `check` without a warning, runs a worker, and runs the first
workflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import readme_support as support

ROOT = Path(__file__).resolve().parent.parent


def quickstart_blocks() -> dict[str, str]:
    """The quickstart's python samples: the files it names, and its first snippet."""
    text = support.section("Quickstart: add it to your project")
    files: dict[str, str] = {}
    for block in support.read_blocks(text):
        if block.language != "python":
            continue
        name = block.path or "snippet"
        files.setdefault(name, block.code)  # the first settings.py is SQLite's
    return files


def manage(project: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PIKKU_DEV"))}
    env["PYTHONPATH"] = str(ROOT)  # pikku_django from this checkout
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args],
        cwd=project,
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_pasted_quickstart_runs_in_a_new_project(tmp_path: Path) -> None:
    files = quickstart_blocks()
    assert {"settings.py", "urls.py", "orders/workflows.py", "orders/webhooks.py"} <= set(files)
    project = tmp_path / "shop"
    project.mkdir()
    made = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "django", "startproject", "mysite", str(project)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    settings = project / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + files["settings.py"] + "\n")
    (project / "mysite" / "urls.py").write_text(files["urls.py"] + "\n")
    app = project / "orders"
    app.mkdir()
    (app / "__init__.py").write_text("")
    for name in ("workflows.py", "webhooks.py"):
        (app / name).write_text(files[f"orders/{name}"] + "\n")

    for args, stdin in (
        (["migrate", "--no-input", "-v", "0"], None),
        (["check", "--fail-level", "WARNING"], None),
        (
            ["pikku_sources", "enable", "github", "--base-url", "https://shop.example.com/pikku/"],
            None,
        ),
        (["pikku_credentials", "set", "githubWebhookSecret"], "a-secret-of-some-length\n"),
        (["check", "--fail-level", "WARNING", "--database", "default"], None),
        (["pikku_worker", "--until-idle", "--idle-grace", "0"], None),
        (["shell", "-c", files["snippet"]], None),
    ):
        done = manage(project, *args, stdin=stdin)
        assert done.returncode == 0, f"manage.py {args[0]}:\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
    assert (project / "db.sqlite3").exists()
