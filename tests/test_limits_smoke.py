"""``benchmarks/limits.py --quick`` runs end to end on PostgreSQL and its last line is
one JSON object with every figure beside its baseline and target. Never a speed:
figures of a run on a shared machine mean nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_service

pytestmark = [pytest.mark.once, pytest.mark.long]

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://postgres@127.0.0.1:5432"
NAME = f"pikku_smoke_limits_{os.getpid()}"
FIGURES = {
    "claims_per_s_concurrency_8",
    "claims_per_s_rate_10000_per_1s",
    "claims_per_s_rate_100000_per_1m",
    "steps_per_s_100_priorities",
}


def _drop() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(NAME))
        )


def test_limits_quick_prints_every_figure_with_its_baseline() -> None:
    require_service("postgres")
    try:
        done = subprocess.run(  # noqa: S603 - this interpreter on a script of the repository
            [sys.executable, str(ROOT / "benchmarks" / "limits.py"), "--quick"],
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
    assert report["benchmark"] == "limits"
    assert report["quick"] is True
    assert "server_version" in report["server"]
    assert set(report["figures"]) == FIGURES
    for name, fig in report["figures"].items():
        assert set(fig) == {
            "value",
            "value_range",
            "baseline",
            "baseline_range",
            "ratio",
            "unit",
            "target",
            "met",
        }, name
        assert fig["value_range"][0] <= fig["value"] <= fig["value_range"][1], name
        assert fig["value"] > 0, name
        assert fig["baseline"] > 0, name
        assert fig["ratio"] == pytest.approx(fig["value"] / fig["baseline"], rel=0.05), name
