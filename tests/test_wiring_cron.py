"""Cron schedules ticked by the workers themselves: no separate process.

Two real ``pikku_worker`` processes share an every-second schedule; each tick
gets exactly one run, and no tick between the first and the last is left out.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime, timedelta
from typing import Any

from django.core import checks

from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.schedules.intake import ScheduleIntake
from pikku_django.workflows.worker.intake import intakes
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

NAME = "wiring-every-second"
SCHEDULES = {
    NAME: {
        "workflow": "testapp.webhook_event",
        "cron": "* * * * * *",
        "input": {"data": "tick"},
        "missed": "all",
    }
}


def test_the_app_registers_the_schedule_intake_and_check() -> None:
    assert any(isinstance(intake, ScheduleIntake) for intake in intakes())
    registered = {check.__name__ for check in checks.registry.registry.get_checks()}
    assert "check_schedules" in registered


@on_databases("postgres")
def test_two_workers_start_exactly_one_run_per_tick(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "SCHEDULES": SCHEDULES}
    env = {"DJANGO_SETTINGS_MODULE": "tests.wiring_worker_settings"}
    env["PIKKU_TEST_SCHEDULES"] = json.dumps(SCHEDULES)
    runs = WorkflowRun.objects.using(alias).filter(idempotency_key__startswith=f"schedule:{NAME}:")
    procs = [worker_process(alias, "--concurrency", "2", **env) for _ in range(2)]
    try:
        wait_for(lambda: runs.count() >= 5, 60, "five ticks' runs")
        time.sleep(1.5)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outputs = [finish(proc, 60) for proc in procs]
    for code, out in outputs:
        assert code == 0, out
    keys = sorted(runs.values_list("idempotency_key", flat=True))
    prefix = f"schedule:{NAME}:"
    ticks = [datetime.strptime(k.removeprefix(prefix), "%Y-%m-%dT%H:%M:%SZ") for k in keys]
    assert len(set(ticks)) == len(ticks) == runs.count()
    expected = [ticks[0] + timedelta(seconds=i) for i in range(len(ticks))]
    assert ticks == expected, "a tick between the first and the last got no run"
    # Both workers took part, or at least one did every tick: either way one run each.
    finished = runs.filter(status=RunStatus.COMPLETED).count()
    assert finished >= len(ticks) - 2  # the last ticks may still be running at SIGTERM
