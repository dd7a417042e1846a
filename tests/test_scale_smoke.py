"""``benchmarks/scale.py --quick`` runs end to end on PostgreSQL and its last line is
one JSON object with every figure beside its baseline. Never a speed: figures of a
run on a shared machine mean nothing."""

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
pytestmark = [pytest.mark.once, pytest.mark.long]

ROOT = Path(__file__).resolve().parent.parent
PG = "postgres://postgres@127.0.0.1:5432"
NAME = f"pikku_smoke_scale_{os.getpid()}"
FIGURES = {
    "steps_per_s_empty",
    "steps_per_s_with_completed",
    "steps_per_s_with_sleeping",
    "steps_per_s_with_failed",
    "blocks_per_step_with_completed",
    "blocks_per_step_with_sleeping",
    "blocks_per_step_with_failed",
    "transactions_per_step_with_completed",
    "transactions_per_step_with_sleeping",
    "transactions_per_step_with_failed",
    "per_step_100_steps",
    "per_step_200_steps",
    "latency_p50_empty",
    "latency_p95_empty",
    "latency_p50_loaded",
    "latency_p95_loaded",
    "cma0_steps_per_s_loaded",
    "cma0_latency_p50_loaded",
    "cma0_latency_p95_loaded",
    "idle_tx_per_s_loaded",
    "prune_rows_per_s",
    "inline_registered_runs_per_s",
    "inline_registered_sql_per_run",
}


def _drop() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(NAME))
        )


def test_scale_quick_prints_every_figure_with_its_baseline() -> None:
    require_service("postgres")
    # --no-single: the single-step pairing is throughput.py's, which its smoke test runs.
    try:
        done = subprocess.run(  # noqa: S603 - this interpreter on a script of the repository
            [
                sys.executable,
                str(ROOT / "benchmarks" / "scale.py"),
                "--quick",
                "--no-checkpoint",
                "--no-single",
            ],
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
    assert report["benchmark"] == "scale"
    assert report["quick"] is True
    assert set(report["sizes"]) == {
        "runs",
        "completed",
        "sleeping",
        "failed",
        "long1",
        "long2",
        "latency",
        "inline",
        "repeats",
    }
    assert "server_version" in report["server"]
    # The same VACUUM ANALYZE before every steps/s phase, the empty tables' too; no
    # CHECKPOINT, which would stall the commits of the other tests on this server.
    assert set(report["maintenance"]) == {"empty", "completed", "sleeping", "failed", "cma0"}
    assert {m["command"] for m in report["maintenance"].values()} == {"VACUUM (ANALYZE)"}
    assert set(report["figures"]) == FIGURES
    for name, fig in report["figures"].items():
        assert set(fig) == {"value", "baseline", "ratio", "unit", "target"}, name
        assert isinstance(fig["value"], float | int), name
        if fig["baseline"] is not None:
            assert isinstance(fig["ratio"], float | int), name
