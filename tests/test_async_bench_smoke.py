"""``benchmarks/async_steps.py --quick`` runs end to end on PostgreSQL and its last line
is one JSON object with the async figure beside its plain-step baseline. Never a speed:
figures of a run on a shared machine mean nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_service

#: A benchmark script's run does not depend on Django's version: the newest-Django job
#: leaves it out.
pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://postgres@127.0.0.1:5432"
NAME = f"pikku_smoke_async_{os.getpid()}"


def _drop() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(NAME))
        )


def test_async_steps_quick_prints_both_figures() -> None:
    require_service("postgres")
    try:
        done = subprocess.run(  # noqa: S603 - this interpreter on a script of the repository
            [sys.executable, str(ROOT / "benchmarks" / "async_steps.py"), "--quick"],
            cwd=ROOT,
            env={**os.environ, "PIKKU_BENCH_WORKFLOWS_URL": f"{PG}/{NAME}"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        _drop()
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["benchmark"], report["quick"], report["runs"]) == ("async_steps", True, 20)
    figures = report["figures"]
    assert set(figures) == {
        "async_steps_per_s",
        "sync_steps_per_s",
        "sync_ideal_steps_per_s",
        "speedup",
        "async_most_at_once",
        "sync_most_at_once",
    }
    assert figures["async_steps_per_s"] > 0
    assert figures["sync_steps_per_s"] > 0
    # The plain steps never overlap more than the worker has threads.
    assert figures["sync_most_at_once"] <= report["threads"]
