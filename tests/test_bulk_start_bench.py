"""``benchmarks/bulk_start.py --quick`` runs end to end on PostgreSQL and its last line
is one JSON object with the bulk start's figure beside its one-by-one baseline and
the server's transactions per run. Never a speed: figures of a run on a shared
machine mean nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_service

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://postgres@127.0.0.1:5432"
NAME = f"pikku_smoke_bulk_{os.getpid()}"
SUMMARY = {"median", "min", "max", "spread_pct", "repeats"}


def _drop() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(NAME))
        )


def test_bulk_start_quick_prints_its_figure_with_its_baseline() -> None:
    require_service("postgres")
    try:
        done = subprocess.run(  # noqa: S603 - this interpreter on a script of the repository
            [sys.executable, str(ROOT / "benchmarks" / "bulk_start.py"), "--quick"],
            cwd=ROOT,
            env={**os.environ, "PIKKU_BENCH_WORKFLOWS_URL": f"{PG}/{NAME}"},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        _drop()
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "bulk_start"
    assert (report["quick"], report["runs"], report["repeats"]) == (True, 1000, 1)
    assert "server_version" in report["server"]
    (figure,) = report["figures"].values()
    assert set(figure["baseline"]) == SUMMARY
    assert figure["min"] <= figure["median"] <= figure["max"]
    assert figure["ratio"] == pytest.approx(
        figure["baseline"]["median"] / figure["median"], rel=0.05
    )
    # One transaction for the whole bulk start; at least one a run one by one.
    assert figure["server_transactions_per_run"] < 0.1
    assert figure["baseline_server_transactions_per_run"] >= 1
    assert figure["target"] == ">= 10"
