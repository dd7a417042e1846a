"""What the Makefile's targets install, read from `make -n` (nothing is run)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def planned(target: str, tmp_path: Path) -> list[str]:
    """The commands `make TARGET` would run from scratch, in fresh virtualenv paths."""
    done = subprocess.run(  # noqa: S603
        [  # noqa: S607
            "make",
            "-n",
            "-B",
            # Under `make test` this runs in a sub-make, which would print "Entering
            # directory" lines among the commands.
            "--no-print-directory",
            target,
            f"VENV={tmp_path / 'venv'}",
            f"VENV_LATEST={tmp_path / 'venv-latest'}",
            "PYTHON=python3",
            "PYTHON_LATEST=python3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def installs(commands: list[str]) -> list[str]:
    """The `pip install` commands that install this checkout (with its extras)."""
    return [c for c in commands if re.search(r"\bpip install\b.* -e ", c)]


def test_make_docs_installs_the_docs_extra_only(tmp_path: Path) -> None:
    commands = planned("docs", tmp_path)
    assert [c.split()[-1] for c in installs(commands)] == ['".[docs]"'], commands
    assert "mkdocs build --strict" in commands[-1]


def test_make_test_still_builds_the_docs_with_the_dev_extra_installed(tmp_path: Path) -> None:
    commands = planned("test", tmp_path)
    extras = [c.split()[-1] for c in installs(commands)]
    assert '".[dev]"' in extras
    assert '".[docs]"' in extras
    assert any("mkdocs build --strict" in c for c in commands)
