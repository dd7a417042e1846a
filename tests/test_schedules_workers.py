"""A cron schedule ticking every second under three pikku_worker processes, one of
them SIGKILLed inside a tick.

The first worker is started alone, with its engine's ``start`` made to stall when
a tick starts its run: it claims the schedule's first tick, then waits inside the
tick's transaction (its ``main()`` is that process). Two plain workers are
started beside it, and the first is SIGKILLed there. Its tick is rolled back
with it, so one of the others starts that tick, and every tick from the first to
the last one started has exactly one run.
"""

from __future__ import annotations

import json
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

from pikku_django.models import WorkerHeartbeat, WorkflowRun
from pikku_django.schedules import tick_key
from tests.conftest import database_alias, on_databases
from tests.test_worker import ROOT, finish, wait_for, worker_process

#: Worker processes killed, frozen or racing: their subject does not depend on Django's
#: version (the in-process tests of the same code run in both jobs), so the newest-Django
#: job leaves them out.
pytestmark = pytest.mark.once

NAME = "every-second"
#: Seconds the two other workers run on after the kill.
AFTER_KILL = 4.0
CHILD = (
    "import sys, django; django.setup(); "
    "from tests.test_schedules_workers import main; main(sys.argv[1])"
)


def _env(alias: str, out: Path) -> dict[str, str]:
    schedule = {
        "workflow": "testapp.slow_one",
        "cron": "* * * * * *",  # every second
        "input": {"started": str(out / "ran"), "seconds": 0},
        "missed": "all",
    }
    return {
        "PIKKU_TEST_SCHEDULES": json.dumps({NAME: schedule}),
        "PIKKU_TEST_POLL": "0.1",
    }


def stalling_worker(alias: str, marker: Path, **env: str) -> subprocess.Popen[str]:
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
        "PIKKU_TEST_ALIAS": alias,
        "PIKKU_TEST_DB_NAME": str(connections[alias].settings_dict["NAME"]),
        "PIKKU_TEST_DEFAULT_NAME": str(connections["default"].settings_dict["NAME"]),
        **env,
    }
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", CHILD, str(marker)],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _tick_of(key: str) -> datetime:
    """The tick whose run has the idempotency key ``key``."""
    moment = datetime.strptime(key[len(f"schedule:{NAME}:") :], "%Y-%m-%dT%H:%M:%SZ")
    return moment.replace(tzinfo=UTC)


@on_databases("postgres", "mariadb")
def test_each_tick_has_one_run_under_three_workers_with_one_killed_mid_tick(
    vendor: str, tmp_path: Path
) -> None:
    alias = database_alias(vendor)
    WorkflowRun.objects.using(alias).filter(idempotency_key__startswith="schedule:").delete()
    WorkerHeartbeat.objects.using(alias).all().delete()
    env = _env(alias, tmp_path)
    marker = tmp_path / "victim.marker"
    victim = stalling_worker(alias, marker, **env)
    others: list[subprocess.Popen[str]] = []
    try:
        wait_for(lambda: marker.exists() or victim.poll() is not None, 60, "a claimed tick")
        if not marker.exists():
            pytest.fail(f"the first worker ended without claiming a tick:\n{finish(victim)[1]}")
        others = [worker_process(alias, "--concurrency", "2", **env) for _ in range(2)]
        pids = {proc.pid for proc in others}
        wait_for(lambda: _up(alias) >= pids, 60, "the other two workers to start")
        time.sleep(2)  # both look for the tick the first one holds
        assert _runs(alias) == []  # nothing started past the held tick meanwhile
        os.kill(victim.pid, signal.SIGKILL)
        victim.communicate(timeout=30)
        killed_at = datetime.now(UTC)
        time.sleep(AFTER_KILL)
        # Under load the survivors may still be catching up: wait for ticks past the kill.
        wait_for(
            lambda: any(
                _tick_of(key) >= killed_at.replace(microsecond=0) + timedelta(seconds=2)
                for key in _runs(alias)
            ),
            60,
            "ticks after the kill",
        )
        for proc in others:
            proc.send_signal(signal.SIGTERM)
        outputs = [finish(proc, 60) for proc in others]
    finally:
        for proc in (victim, *others):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for code, out in outputs:
        assert code == 0, out

    held = _tick_of(marker.read_text())
    keys = _runs(alias)
    ticks = sorted(_tick_of(key) for key in keys)
    assert len(ticks) == len(set(ticks))  # one run a tick
    assert ticks[0] == held  # the killed worker's tick was started by another
    assert ticks[-1] >= killed_at.replace(microsecond=0) + timedelta(seconds=2)
    seconds = int((ticks[-1] - held).total_seconds())
    expected = [held + timedelta(seconds=n) for n in range(seconds + 1)]
    assert ticks == expected  # none missing
    assert sorted(keys) == sorted(tick_key(NAME, tick) for tick in expected)


def _up(alias: str) -> set[int]:
    """The process ids of the workers whose heartbeat says they are up."""
    beats = WorkerHeartbeat.objects.using(alias).filter(stopped_at__isnull=True)
    return set(beats.values_list("pid", flat=True))


def _runs(alias: str) -> list[str]:
    return list(
        WorkflowRun.objects.using(alias)
        .filter(idempotency_key__startswith=f"schedule:{NAME}:")
        .values_list("idempotency_key", flat=True)
    )


def main(marker: str) -> None:
    """A pikku_worker whose first tick stalls inside the tick's transaction."""
    from django.core.management import call_command

    from pikku_django.workflows.engine import WorkflowEngine

    start = WorkflowEngine.start

    def stall(self: Any, workflow: Any, input: Any = None, **options: Any) -> Any:
        key = str(options.get("idempotency_key") or "")
        if key.startswith(f"schedule:{NAME}:"):
            Path(marker).write_text(key)
            time.sleep(600)  # killed here, inside the tick's transaction
        return start(self, workflow, input, **options)

    WorkflowEngine.start = stall  # type: ignore[method-assign]
    call_command("pikku_worker", "--concurrency", "2")
