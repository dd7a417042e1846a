"""Delayed starts: ``start_at`` / ``delay`` on start_workflow and @workflow.

On SQLite, PostgreSQL and MariaDB a delayed run's first pass is not claimed
before its time and is claimed once due; bad values are refused and start
nothing.
"""

from __future__ import annotations

import time
import zoneinfo
from datetime import datetime, timedelta
from typing import Any

import pytest

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.store import NewRun
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")


@step(name="dlt_echo")
def dlt_echo(data: Any) -> Any:
    return data


@workflow(name="dlt_now")
def dlt_now(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("echo", dlt_echo, inp)


@workflow(name="dlt_later", delay="5min")
def dlt_later(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("echo", dlt_echo, inp)


def _passed(engine: WorkflowEngine) -> set[Any]:
    """The runs due now, each passed and run to its end."""
    due = engine.claim_due_runs(10)
    for run_id in due:
        engine.orchestrate(run_id)
    engine.run_until_idle()
    return set(due)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine(alias: str, clock: FakeClock) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=clock)


def _claimed_only_at(
    engine: WorkflowEngine, clock: FakeClock, run: WorkflowRun, at: datetime
) -> None:
    """Not claimed just before ``at``, claimed once at it, and run to its end."""
    clock.advance(at - clock.now() - timedelta(milliseconds=1))
    assert engine.claim_due_runs(5) == []
    assert engine.run_until_idle() == 0
    assert not WorkflowStep.objects.using(engine.using).filter(run_id=run.id).exists()
    clock.advance(timedelta(milliseconds=1))
    assert engine.claim_due_runs(5) == [run.id]
    assert engine.claim_due_runs(5) == []  # once: pushed back while its pass runs
    engine.orchestrate(run.id)
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error


def test_a_delay_holds_the_first_pass_until_due(engine: WorkflowEngine, clock: FakeClock) -> None:
    started = clock.now()
    run = engine.start(dlt_now, {"a": 1}, delay="10min")
    assert run.start_at == started + timedelta(minutes=10)
    assert run.wake_at == run.start_at
    _claimed_only_at(engine, clock, run, started + timedelta(minutes=10))
    assert run.output == {"a": 1}


@pytest.mark.parametrize("delay", [90, 90.0, timedelta(seconds=90), "1m30s"])
def test_each_form_of_a_delay(engine: WorkflowEngine, clock: FakeClock, delay: Any) -> None:
    run = engine.start(dlt_now, None, delay=delay)
    assert run.start_at == clock.now() + timedelta(seconds=90)


def test_start_at_in_any_time_zone(engine: WorkflowEngine, clock: FakeClock) -> None:
    helsinki = zoneinfo.ZoneInfo("Europe/Helsinki")
    at = (clock.now() + timedelta(hours=2)).astimezone(helsinki)
    run = engine.start(dlt_now, "x", start_at=at)
    assert run.start_at == at
    _claimed_only_at(engine, clock, run, at)


def test_a_start_at_already_past_is_due_at_once(engine: WorkflowEngine, clock: FakeClock) -> None:
    run = engine.start(dlt_now, "x", start_at=clock.now() - timedelta(days=1))
    assert engine.claim_due_runs(1) == [run.id]


def test_the_workflows_delay_and_the_call_overriding_it(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    now = clock.now()
    later = engine.start(dlt_later, 1)
    assert later.start_at == now + timedelta(minutes=5)
    at_once = engine.start(dlt_later, 2, delay=0)
    moved = engine.start(dlt_later, 3, start_at=now + timedelta(minutes=1))
    assert moved.start_at == now + timedelta(minutes=1)
    plain = engine.start(dlt_now, 4)
    assert plain.start_at is None
    assert _passed(engine) == {at_once.id, plain.id}
    clock.advance(59)
    assert _passed(engine) == set()
    clock.advance(1)
    assert _passed(engine) == {moved.id}
    clock.advance(239)
    assert _passed(engine) == set()
    clock.advance(1)
    assert _passed(engine) == {later.id}


def test_a_delayed_run_is_the_idle_workers_next_due(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    run = engine.start(dlt_now, None, delay=30)
    assert engine.store.next_due(clock.now(), []).run_due == run.start_at


def test_an_inline_start_ignores_the_workflows_delay(engine: WorkflowEngine) -> None:
    run = engine.start(dlt_later, {"b": 2}, inline=True)
    assert run.status == RunStatus.COMPLETED
    assert run.start_at is None


def test_intakes_runs_get_the_workflows_delay(engine: WorkflowEngine, clock: FakeClock) -> None:
    with engine.store.atomic():
        later, now = engine.create_runs([NewRun("dlt_later", {"c": 3}, "k1"), NewRun("dlt_now", 4)])
    runs = {r.id: r for r in WorkflowRun.objects.using(engine.using).all()}
    assert runs[later].start_at == clock.now() + timedelta(minutes=5)
    assert runs[later].wake_at == runs[later].start_at
    assert runs[now].start_at is None
    assert _passed(engine) == {now}
    clock.advance(299)
    assert _passed(engine) == set()
    clock.advance(1)
    assert _passed(engine) == {later}


def test_a_short_delay_on_the_real_clock(alias: str) -> None:
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    run = engine.start(dlt_now, "r", delay=0.5)
    assert engine.run_until_idle() == 0
    time.sleep(0.6)
    assert engine.run_until_idle() > 0
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"delay": 5, "start_at": "NOW"}, ValueError, "start_at or delay, not both"),
        ({"start_at": datetime(2030, 1, 1)}, ValueError, "must be timezone-aware"),
        ({"start_at": "2030-01-01T00:00:00Z"}, TypeError, "timezone-aware datetime, not str"),
        ({"start_at": 1_900_000_000}, TypeError, "timezone-aware datetime, not int"),
        ({"delay": -1}, ValueError, "0 or more"),
        ({"delay": "soon"}, ValueError, "is not a duration"),
        ({"delay": True}, ValueError, "not a bool"),
        ({"delay": 5, "inline": True}, ValueError, "cannot start later"),
    ],
)
def test_bad_start_times_are_refused_and_start_nothing(
    engine: WorkflowEngine, clock: FakeClock, options: dict[str, Any], error: Any, message: str
) -> None:
    if options.get("start_at") == "NOW":
        options["start_at"] = clock.now()
    with pytest.raises(error, match=message):
        engine.start(dlt_now, 1, **options)
    assert not WorkflowRun.objects.using(engine.using).exists()


def test_a_workflow_declared_with_a_bad_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="0 or more"):
        workflow(name="dlt_bad", delay=-5)
    with pytest.raises(ValueError, match="is not a duration"):
        workflow(name="dlt_bad", delay="tomorrow")
