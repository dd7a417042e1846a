"""A worker looks for due cron ticks at the tick, not up to a poll interval after it.

The schedules' intake tells the worker when the next tick falls due; the worker's
next look (and its idle threads' wait) is then no later than that.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from pikku_django.leases import InMemoryLeaseService
from pikku_django.schedules import sync_schedules
from pikku_django.schedules.intake import ScheduleIntake
from pikku_django.workflows import WorkflowEngine
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases
from tests.test_schedules import (
    WORKFLOW,
    declare,
    plain_workflow,  # noqa: F401  (the autouse fixture)
)

ALL = ("sqlite", "postgres", "mariadb")


@on_databases(*ALL)
def test_the_intake_names_the_next_tick_and_the_worker_looks_by_then(
    vendor: str, settings: Any
) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, minutely={"workflow": WORKFLOW, "cron": "* * * * *"})
    sync_schedules(timezone.now() - timedelta(seconds=1), using=alias)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    intake = ScheduleIntake()
    assert intake.seconds_until_due(engine) is None  # before its first look it knows nothing
    intake.start_waiting(engine, 100)
    hint = intake.seconds_until_due(engine)
    assert hint is not None
    assert 0 < hint <= 60  # the next whole minute
    worker = Worker(engine, concurrency=1, poll_interval=300)
    worker._start_waiting_runs()
    assert worker._seconds_until_next_due() <= hint + 1  # not the 300 s poll


@on_databases("sqlite")
def test_no_schedule_leaves_the_poll_interval(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    declare(settings, alias)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    intake = ScheduleIntake()
    intake.start_waiting(engine, 100)
    assert intake.seconds_until_due(engine) is None
