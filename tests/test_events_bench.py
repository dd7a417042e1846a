"""benchmarks/events.py --quick runs end to end and prints its figures beside their
baselines (never a speed: figures of a shared machine mean nothing here)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import require_service
from tests.test_benchmarks_smoke import PG, drop_pg, run_script

pytestmark = pytest.mark.once


def test_events_quick() -> None:
    require_service("postgres")
    name = f"pikku_smoke_events_{os.getpid()}"
    try:
        result = run_script(
            "events.py", "--quick", env={"PIKKU_BENCH_POSTGRES_URL": f"{PG}/{name}"}, timeout=300
        )
    finally:
        drop_pg([name])
    assert result["benchmark"] == "event_round_trip"
    figures = [
        result["event_round_trip_ms"],
        result["baselines"]["resume_workflow_ms"],
        result["baselines"]["start_to_first_step_ms"],
    ]
    for figure in figures:
        assert figure["n"] == result["samples"]
        assert 0 < figure["p50_ms"] <= figure["p95_ms"] <= figure["max_ms"]
    assert result["machine"]["postgresql"]
