"""The files by which a step in a worker process tells its test that it started."""

from __future__ import annotations

import os
from pathlib import Path


def mark_started(path: Path) -> None:
    """Write this process's pid to ``path`` at once: a test that sees the file exist
    reads the whole pid, never an empty file still being written."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(str(os.getpid()))
    os.replace(partial, path)
