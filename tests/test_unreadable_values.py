"""A stored JSON value this process cannot read back (an integer written by a process
with a higher ``sys.set_int_max_str_digits``, or by another program) fails the one
run it belongs to, with the reason, and never stops a worker's batch."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, WorkflowEvent, WorkflowRun, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.registry import call_step_function
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")
#: More digits than Python reads by default (4,300).
BIG = 10**4400


@contextmanager
def any_digits() -> Iterator[None]:
    """Write as a process started with ``PYTHONINTMAXSTRDIGITS=0`` would."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(before)


@step(name="uv_one")
def uv_one() -> int:
    return 1


@workflow(name="uv_add")
def uv_add(ctx: WorkflowContext, inp: Any) -> Any:
    return inp["n"] + ctx.do("one", uv_one)


@workflow(name="uv_then_wait")
def uv_then_wait(ctx: WorkflowContext, inp: Any) -> Any:
    first = ctx.do("one", uv_one)
    ctx.wait_for_event("go")
    return first


@workflow(name="uv_wait")
def uv_wait(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.wait_for_event("go")


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


def engine_on(alias: str) -> WorkflowEngine:
    """A fresh engine: nothing it replays is kept from an earlier pass."""
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


def status_and_error(alias: str, run: WorkflowRun) -> tuple[str, str]:
    row = WorkflowRun.objects.using(alias).get(id=run.id)
    return row.status, (row.error or {}).get("message", "")


def test_a_run_whose_input_cannot_be_read_fails_and_the_others_run(alias: str) -> None:
    engine = engine_on(alias)
    bad = engine.start(uv_add, {"n": 1})
    good = engine.start(uv_add, {"n": 2})
    with any_digits():
        WorkflowRun.objects.using(alias).filter(id=bad.id).update(input={"n": BIG})
    engine.run_until_idle()
    assert status_and_error(alias, good) == (RunStatus.COMPLETED, "")
    status, message = status_and_error(alias, bad)
    assert status == RunStatus.FAILED
    assert message.startswith("The run's input cannot be read back from the database: ")
    assert "4300 digits" in message


def test_a_step_result_that_cannot_be_read_fails_its_run_on_replay(alias: str) -> None:
    engine = engine_on(alias)
    bad = engine.start(uv_then_wait, {})
    good = engine.start(uv_then_wait, {})
    engine.run_until_idle()
    with any_digits():
        WorkflowStep.objects.using(alias).filter(run_id=bad.id, name="one").update(result=BIG)
    engine = engine_on(alias)
    for run in (bad, good):
        engine.events.send(run.id, "go", None, event_id=f"go-{run.id}")
    engine.run_until_idle()
    assert WorkflowRun.objects.using(alias).get(id=good.id).output == 1
    status, message = status_and_error(alias, bad)
    assert status == RunStatus.FAILED
    assert message.startswith("The result of step 'one' cannot be read back")


def test_an_event_whose_data_cannot_be_read_fails_the_run_waiting_for_it(alias: str) -> None:
    engine = engine_on(alias)
    bad = engine.start(uv_wait, {})
    good = engine.start(uv_wait, {})
    with any_digits():  # kept for the waits the runs have yet to reach
        engine.events.send(bad.id, "go", {"n": BIG}, event_id="big")
    engine.events.send(good.id, "go", {"n": 2}, event_id="small")
    engine = engine_on(alias)
    engine.run_until_idle()
    assert WorkflowRun.objects.using(alias).get(id=good.id).output == {"n": 2}
    status, message = status_and_error(alias, bad)
    assert status == RunStatus.FAILED
    assert message.startswith("The data of event 'go' 'big' cannot be read back")
    assert WorkflowEvent.objects.using(alias).filter(run_id=bad.id).exists()  # kept


def test_a_step_is_not_called_with_an_input_that_cannot_be_read() -> None:
    from pikku_django.models.fields import UnreadableJSON, UnreadableValueError

    called = []
    with pytest.raises(UnreadableValueError, match="The step's input cannot be read back"):
        call_step_function(called.append, UnreadableJSON("[1]", "too long"))
    assert called == []


@workflow(name="uv_wait_then_step")
def uv_wait_then_step(ctx: WorkflowContext, inp: Any) -> Any:
    data = ctx.wait_for_event("go")
    return [data, ctx.do("one", uv_one)]


def test_a_settled_wait_that_cannot_be_read_fails_its_run_not_reads_none(alias: str) -> None:
    engine = engine_on(alias)
    run = engine.start(uv_wait_then_step, {})
    engine.run_until_idle()
    with any_digits():
        engine.events.send(run.id, "go", {"n": BIG}, event_id="big")  # settles the wait
    engine = engine_on(alias)
    engine.run_until_idle()
    status, message = status_and_error(alias, run)
    assert status == RunStatus.FAILED
    assert message.startswith("The result of step 'event:go' cannot be read back")


@pytest.mark.django_db(transaction=True)
def test_pages_of_a_run_with_an_unreadable_value_answer(admin_client: Any) -> None:
    from django.urls import reverse

    from pikku_django.workflows.api import reset_engine

    reset_engine()
    engine = engine_on("default")
    run = engine.start(uv_then_wait, {})
    engine.run_until_idle()
    with any_digits():
        WorkflowRun.objects.filter(id=run.id).update(input={"n": BIG}, output=BIG, status="failed")
        WorkflowStep.objects.filter(run_id=run.id).update(result=BIG)
    page = admin_client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.id]))
    assert page.status_code == 200
    assert "cannot read back" in page.content.decode()
    step_id = WorkflowStep.objects.filter(run_id=run.id).values_list("id", flat=True)[0]
    assert (
        admin_client.get(
            reverse("admin:pikku_django_workflowstep_change", args=[step_id])
        ).status_code
        == 200
    )
    assert admin_client.get(reverse("admin:pikku_django_workflowrun_changelist")).status_code == 200
    status = admin_client.get(reverse("pikku_django:run-status", args=[run.id]))
    assert status.status_code == 200
    assert "cannot read back" in status.json()["output"]


def test_a_schedule_whose_input_cannot_be_read_fails_its_tick_with_the_reason(
    alias: str, settings: Any
) -> None:
    from datetime import UTC, datetime

    from pikku_django.models import Schedule
    from pikku_django.schedules import start_due_ticks, sync_schedules
    from pikku_django.schedules.ticks import forget_process_state

    every = {"workflow": "uv_add", "cron": "*/10 * * * *"}
    settings.PIKKU = {
        "WORKFLOW_DATABASE": alias,
        "SCHEDULES": {
            "uv-bad": {**every, "input": {"n": 1}},
            "uv-good": {**every, "input": {"n": 2}},
        },
    }
    forget_process_state()
    sync_schedules(datetime(2026, 1, 1, 0, 1, tzinfo=UTC), using=alias)
    with any_digits():
        Schedule.objects.using(alias).filter(name="uv-bad").update(input={"n": BIG})
    try:
        report = start_due_ticks(
            datetime(2026, 1, 1, 0, 10, 1, tzinfo=UTC), using=alias, sync=False
        )
    finally:
        forget_process_state()
    assert [s.schedule for s in report.started if s.schedule.startswith("uv-")] == ["uv-good"]
    (failure,) = [f for f in report.failed if f.schedule.startswith("uv-")]
    assert failure.schedule == "uv-bad"
    assert "The input of schedule 'uv-bad' cannot be read back from the database" in failure.error
