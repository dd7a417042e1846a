"""The example project migrates and runs its demo, as `make demo` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "example_project"


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_runs_on_a_fresh_sqlite_database(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'example.sqlite3'}"
    for args in (
        ["check"],
        ["migrate", "--no-input", "-v", "0"],
        ["lease_demo", "--ttl-ms", "600"],
    ):
        done = run(args, env)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "LeaseTakenError" in done.stdout
    assert "LeaseLostError" in done.stdout
    assert "token 2" in done.stdout


def test_order_workflow_finishes_under_pikku_worker(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'example.sqlite3'}"
    for args in (
        ["migrate", "--no-input", "-v", "0"],
        ["place_order", "7", "500"],
        ["place_order", "7", "500"],  # the same order again: the same run
        # An idle grace longer than the order's 2 s pause, not the default 10 s.
        ["pikku_worker", "--until-idle", "--poll-interval", "0.2", "--idle-grace", "3"],
    ):
        done = run(args, env)
        assert done.returncode == 0, done.stdout + done.stderr
    status = run(["order_status"], env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("Run ") == 1
    assert ": completed" in status.stdout
    assert "TRACK-PARCEL-7" in status.stdout


def test_the_story_runs_from_a_signed_push_to_an_approved_deploy(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'story.sqlite3'}"
    done = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "story", "--approve", "--port", str(port)],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "{'received': 1}" in out
    assert "run  suspended: Approve shop:" in out
    assert "The deploy completed" in out
    assert '"released": {"environment": "production"' in out
