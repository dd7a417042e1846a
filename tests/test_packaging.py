"""The wheel builds, passes `twine check`, and runs the demo from a fresh virtualenv
that has only the demo extra: no database driver, so nothing to compile."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DRIVERS = ("MySQLdb", "psycopg", "psycopg2", "redis", "django_redis")


def run(args: list[str | Path], **options: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(  # noqa: S603
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        **options,  # type: ignore[arg-type]
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from it, as `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", out, ROOT])
    return out


def wheel_of(dist: Path) -> Path:
    (wheel,) = dist.glob("pikku_django-*.whl")
    return wheel


def test_the_demo_extra_has_no_database_driver() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert extras["demo"] == ["pikku-django[webhooks]"]
    assert not any(
        name in requirement for requirement in extras["demo"] for name in ("mysql", "psycopg")
    )


def test_twine_check_passes(dist: Path) -> None:
    files = sorted(dist.iterdir())
    assert {f.suffix for f in files} >= {".whl", ".gz"}
    done = run([sys.executable, "-m", "twine", "check", "--strict", *files])
    assert done.stdout.count("PASSED") == len(files), done.stdout


def test_the_wheel_holds_the_licence_templates_and_static_files(dist: Path) -> None:
    names = zipfile.ZipFile(wheel_of(dist)).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert "pikku_django/py.typed" in names
    assert any(n.startswith("pikku_django/templates/") for n in names)
    assert any(n.startswith("pikku_django/static/") for n in names)
    assert any(n.startswith("pikku_django/migrations/0001") for n in names)
    assert not any(n.startswith(("tests/", "example_project/", "docs/")) for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel_of(dist)).read(metadata).decode()
    for field in ("License-Expression: MIT", "Classifier: "):
        assert field in text, field
    assert "Provides-Extra: demo" in text


def test_a_fresh_venv_with_the_demo_extra_runs_the_demo(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    # This virtualenv's pip installs into the new one: no pip bootstrap to wait for.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            "--disable-pip-version-check",
            f"{wheel_of(dist)}[demo]",
        ]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTHON"))}
    env.pop("DATABASE_URL", None)
    missing = run(
        [
            python,
            "-c",
            "import importlib.util as u, sys; "
            f"print([m for m in {DRIVERS!r} if u.find_spec(m)]); "
            "import pikku_django, cryptography; print(pikku_django.__file__)",
        ],
        cwd=tmp_path,
        env=env,
    )
    found, location = missing.stdout.splitlines()
    assert found == "[]", f"the demo extra installed database drivers: {found}"
    assert location.startswith(str(venv)), f"pikku_django imported from {location}"

    project = tmp_path / "example_project"
    shutil.copytree(
        ROOT / "example_project",
        project,
        ignore=shutil.ignore_patterns("*.sqlite3*", "__pycache__", ".pikku-dev-webhooks.json"),
    )
    story = run(
        [python, "manage.py", "story", "--approve", "--port", free_port(), "--timeout", "60"],
        cwd=project,
        env=env,
    )
    assert "1. Database migrated." in story.stdout
    assert "The deploy completed" in story.stdout, story.stdout[-3000:]
