"""Three processes calling start_due_ticks on the same ticks, one SIGKILLed mid-tick.

Each process stands in for a worker: it walks the same clock (one minute a step)
and calls start_due_ticks at each step. The first one is killed inside a tick's
transaction, after it claimed the tick and while it inserts the run; the tick
must still get exactly one run, started by one of the others. Its main() is that
process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from pikku_django.models import WorkflowRun
from pikku_django.schedules import start_due_ticks, sync_schedules, tick_key
from tests.conftest import database_alias, on_databases
from tests.test_schedules import plain_workflow  # noqa: F401  (the autouse fixture)
from tests.test_worker import ROOT, finish, wait_for

START = datetime(2026, 1, 1, tzinfo=UTC)
TICKS = 15
NAMES = ("race-a", "race-b", "race-c")
CHILD = (
    "import sys, django; django.setup(); "
    "from tests.test_schedules_race import main; main(*sys.argv[1:3])"
)


def ticker(alias: str, role: str, out: Path) -> subprocess.Popen[str]:
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
        "PIKKU_TEST_ALIAS": alias,
        "PIKKU_TEST_DB_NAME": str(connections[alias].settings_dict["NAME"]),
        "PIKKU_TEST_DEFAULT_NAME": str(connections["default"].settings_dict["NAME"]),
    }
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", CHILD, role, str(out)],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def started_by(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line]


@on_databases("sqlite", "postgres", "mariadb")
def test_each_tick_starts_exactly_one_run_under_three_racing_processes(
    vendor: str, settings: Any, tmp_path: Path
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {
        "WORKFLOW_DATABASE": alias,
        "SCHEDULES": {
            name: {"workflow": "testapp.slow_one", "cron": "* * * * *", "missed": "all"}
            for name in NAMES
        },
    }
    sync_schedules(START - timedelta(seconds=30), using=alias)
    victim_out, marker = tmp_path / "victim", tmp_path / "victim.marker"
    victim = ticker(alias, "victim", victim_out)
    others: list[subprocess.Popen[str]] = []
    try:
        wait_for(lambda: marker.exists() or victim.poll() is not None, 60, "a claimed tick")
        if not marker.exists():
            pytest.fail(f"the first process ended without claiming a tick:\n{finish(victim)[1]}")
        others = [ticker(alias, "ticker", tmp_path / f"ticker{i}") for i in range(2)]
        time.sleep(3)  # both are up and waiting on the claimed tick
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate(timeout=30)
        outputs = [finish(proc, 120) for proc in others]
    finally:
        for proc in (victim, *others):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for code, out in outputs:
        assert code == 0, out

    claimed_by_victim = marker.read_text()
    assert started_by(victim_out) == []  # killed before its transaction committed
    reported = started_by(tmp_path / "ticker0") + started_by(tmp_path / "ticker1")
    expected = {tick_key(n, START + timedelta(minutes=k)) for n in NAMES for k in range(TICKS)}
    assert sorted(reported) == sorted(expected)  # each tick reported by one process only
    assert claimed_by_victim in expected
    keys = list(
        WorkflowRun.objects.using(alias)
        .filter(idempotency_key__startswith="schedule:race-")
        .values_list("idempotency_key", flat=True)
    )
    assert sorted(keys) == sorted(expected)


def main(role: str, out: str) -> None:
    """Walk the clock through the ticks, recording the tick keys this process started."""
    if role == "victim":
        from pikku_django.workflows.engine import WorkflowEngine

        def stall(self: Any, workflow: Any, input: Any = None, **options: Any) -> Any:
            Path(f"{out}.marker").write_text(options["idempotency_key"])
            time.sleep(600)  # killed here, inside the tick's transaction

        WorkflowEngine.start = stall  # type: ignore[method-assign]
    with open(out, "a") as log:
        for step in range(TICKS):
            now = START + timedelta(minutes=step, seconds=1)
            for start in start_due_ticks(now, sync=False).started:
                log.write(tick_key(start.schedule, start.tick) + "\n")
                log.flush()
