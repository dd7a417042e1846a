"""Events sent to runs (``send_event`` / ``ctx.wait_for_event``) and published values.

On SQLite, PostgreSQL and MariaDB: an event sent before, during or after its wait,
duplicated, or after the wait timed out, reaches the run once; replayed passes
return what the first one did; published values are read and streamed.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepKind, StepStatus, WorkflowEvent, WorkflowStep
from pikku_django.workflows import (
    TIMED_OUT,
    EventOutcome,
    FakeClock,
    NotSerializableError,
    RunKey,
    WorkflowContext,
    WorkflowEngine,
    WorkflowRunNotFoundError,
    step,
    workflow,
)
from pikku_django.workflows.errors import WorkflowDefinitionError
from pikku_django.workflows.runs.status import snapshot
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")


@step(name="ev_echo")
def ev_echo(data: Any) -> Any:
    return data


@workflow(name="ev_checkout")
def ev_checkout(ctx: WorkflowContext, inp: Any) -> Any:
    ctx.set_progress("waiting for payment")
    paid = ctx.wait_for_event("payment", timeout=inp.get("timeout") if inp else None)
    if paid is TIMED_OUT:
        ctx.set_event("state", "expired")
        return {"paid": None}
    ctx.set_progress("paid")
    shipped = ctx.do("ship", ev_echo, {"order": paid["order"]})
    return {"paid": paid, "shipped": shipped}


@workflow(name="ev_twice")
def ev_twice(ctx: WorkflowContext, inp: Any) -> Any:
    first = ctx.wait_for_event("ping", timeout="1min")
    second = ctx.wait_for_event("ping")
    return {"first": None if first is TIMED_OUT else first, "second": second}


@workflow(name="ev_loop")
def ev_loop(ctx: WorkflowContext, inp: Any) -> Any:
    total = 0
    for i in range(3):
        total += ctx.do("add", ev_echo, i)
        ctx.set_progress({"done": i + 1})
    return total


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine(alias: str, clock: FakeClock) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=clock)


def _steps(engine: WorkflowEngine, run_id: uuid.UUID) -> dict[str, WorkflowStep]:
    return {s.name: s for s in engine.steps().filter(run_id=run_id).order_by("id")}


def _events(engine: WorkflowEngine, run_id: uuid.UUID) -> list[WorkflowEvent]:
    return list(WorkflowEvent.objects.using(engine.using).filter(run_id=run_id).order_by("id"))


def _replays_alike(engine: WorkflowEngine, run_id: uuid.UUID) -> None:
    """A fresh engine's passes over the ended run (no memo) write nothing and change
    nothing: every step answers from its recorded outcome."""
    before = _steps(engine, run_id)
    run = engine.get_run(run_id)
    engine.runs().filter(id=run_id).update(status=RunStatus.RUNNING, output=None)
    again = WorkflowEngine(engine.using, leases=InMemoryLeaseService(), clock=engine.clock)
    again.orchestrate(run_id)
    after = _steps(engine, run_id)
    assert {n: (s.status, s.result) for n, s in after.items()} == {
        n: (s.status, s.result) for n, s in before.items()
    }
    replayed = engine.get_run(run_id)
    assert replayed.status == RunStatus.COMPLETED
    assert replayed.output == run.output


def test_an_event_sent_to_a_waiting_run_wakes_it(engine: WorkflowEngine) -> None:
    run = engine.start(ev_checkout, {})
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.RUNNING
    wait = _steps(engine, run.id)["event:payment"]
    assert (wait.kind, wait.status, wait.available_at) == (
        StepKind.EVENT,
        StepStatus.SCHEDULED,
        None,
    )
    assert engine.claim_due_runs(5) == []  # parked on the wait

    sent = engine.events.send(run.id, "payment", {"order": 7}, event_id="pi_1")
    assert (sent.outcome, sent.run_id, sent.event_id) == (EventOutcome.DELIVERED, run.id, "pi_1")
    engine.run_until_idle()
    done = engine.get_run(run.id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output == {"paid": {"order": 7}, "shipped": {"order": 7}}
    [event] = _events(engine, run.id)
    assert event.step_id == _steps(engine, run.id)["event:payment"].id
    _replays_alike(engine, run.id)


def test_an_event_sent_before_its_wait_is_kept_for_it(engine: WorkflowEngine) -> None:
    run = engine.start(ev_checkout, {}, idempotency_key="order-1")
    sent = engine.events.send(RunKey("ev_checkout", "order-1"), "payment", {"order": 1})
    assert sent.outcome == EventOutcome.KEPT
    assert _events(engine, run.id)[0].step_id is None
    engine.run_until_idle()
    done = engine.get_run(run.id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output["paid"] == {"order": 1}
    _replays_alike(engine, run.id)


def test_a_duplicated_event_reaches_the_run_once(engine: WorkflowEngine) -> None:
    run = engine.start(ev_twice)
    engine.run_until_idle()
    assert engine.events.send(run, "ping", 1, event_id="a").outcome == EventOutcome.DELIVERED
    assert engine.events.send(run, "ping", 1, event_id="a").outcome == EventOutcome.DUPLICATE
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.RUNNING  # the second wait still waits
    assert len(_events(engine, run.id)) == 1
    assert engine.events.send(run, "ping", 2, event_id="b").outcome == EventOutcome.DELIVERED
    engine.run_until_idle()
    done = engine.get_run(run.id)
    assert done.output == {"first": 1, "second": 2}
    _replays_alike(engine, run.id)


def test_a_wait_times_out_and_a_later_event_is_kept(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    run = engine.start(ev_twice)
    engine.run_until_idle()
    wait = _steps(engine, run.id)["event:ping"]
    assert wait.available_at == clock.now() + timedelta(minutes=1)
    clock.advance(timedelta(seconds=59))
    assert engine.run_until_idle() == 0
    clock.advance(timedelta(seconds=1))
    engine.run_until_idle()
    steps = _steps(engine, run.id)
    assert steps["event:ping"].result == {"timed_out": True}
    assert steps["event:ping#1"].status == StepStatus.SCHEDULED
    # After the timeout: the event goes to the next wait of its name, not the expired one.
    assert engine.events.send(run.id, "ping", "late").outcome == EventOutcome.DELIVERED
    engine.run_until_idle()
    assert engine.get_run(run.id).output == {"first": None, "second": "late"}
    _replays_alike(engine, run.id)


def test_the_timeout_marker_and_published_values(engine: WorkflowEngine, clock: FakeClock) -> None:
    run = engine.start(ev_checkout, {"timeout": "10s"})
    engine.run_until_idle()
    assert engine.events.published_values(run.id) == {"progress": "waiting for payment"}
    clock.advance(timedelta(seconds=10))
    engine.run_until_idle()
    done = engine.get_run(run.id)
    assert done.output == {"paid": None}
    assert engine.events.published_values(run.id) == {
        "progress": "waiting for payment",
        "state": "expired",
    }
    assert engine.events.send(run.id, "payment", {}).outcome == EventOutcome.RUN_ENDED
    assert _events(engine, run.id) == []
    _replays_alike(engine, run.id)


def test_published_values_are_written_once_and_streamed(engine: WorkflowEngine) -> None:
    run = engine.start(ev_loop)
    engine.run_until_idle()
    done = engine.get_run(run.id)
    assert done.output == 3
    assert engine.events.published_values(run.id) == {"progress": {"done": 3}}
    publishes = [s for s in _steps(engine, run.id).values() if s.kind == StepKind.PUBLISH]
    assert [s.result for s in publishes] == [{"done": 1}, {"done": 2}, {"done": 3}]
    found = snapshot(run.id, engine.using)
    assert found is not None
    assert found.as_dict()["published"] == {"progress": {"done": 3}}
    _replays_alike(engine, run.id)
    assert engine.events.published_values(run.id) == {"progress": {"done": 3}}


def test_bad_events_are_refused_and_store_nothing(engine: WorkflowEngine) -> None:
    run = engine.start(ev_checkout, {})
    engine.run_until_idle()
    with pytest.raises(NotSerializableError):
        engine.events.send(run.id, "payment", {"when": object()})
    with pytest.raises(WorkflowDefinitionError):
        engine.events.send(run.id, "pay#ment", {})
    with pytest.raises(ValueError, match="event_id"):
        engine.events.send(run.id, "payment", {}, event_id="")
    with pytest.raises(WorkflowRunNotFoundError):
        engine.events.send(uuid.uuid4(), "payment", {})
    with pytest.raises(WorkflowRunNotFoundError):
        engine.events.send("not-a-uuid", "payment", {})
    with pytest.raises(WorkflowRunNotFoundError):
        engine.events.send(RunKey("ev_checkout", "no-such-key"), "payment", {})
    with pytest.raises(WorkflowRunNotFoundError):
        engine.events.published_values(uuid.uuid4())
    assert _events(engine, run.id) == []
    assert _steps(engine, run.id)["event:payment"].status == StepStatus.SCHEDULED


def test_an_event_sent_in_a_rolled_back_transaction_is_not_kept(engine: WorkflowEngine) -> None:
    run = engine.start(ev_checkout, {})
    engine.run_until_idle()

    class Refused(Exception):
        pass

    with pytest.raises(Refused), transaction.atomic(using=engine.using):
        engine.events.send(run.id, "payment", {"order": 1}, event_id="pi_9")
        raise Refused
    assert _events(engine, run.id) == []
    assert _steps(engine, run.id)["event:payment"].status == StepStatus.SCHEDULED
    assert engine.events.send(run.id, "payment", {"order": 1}, event_id="pi_9").outcome == (
        EventOutcome.DELIVERED
    )


def test_inline_runs_carry_on_when_their_event_comes(engine: WorkflowEngine) -> None:
    run = engine.start(ev_checkout, {}, inline=True)
    assert run.status == RunStatus.RUNNING
    engine.events.send(run.id, "payment", {"order": 3})
    done = engine.get_run(run.id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output["shipped"] == {"order": 3}


@pytest.mark.parametrize(
    "vendor",
    [pytest.param(v, marks=db_mark(v), id=v) for v in ("postgres", "mariadb")],
)
def test_events_racing_their_waits_each_reach_the_run(vendor: str) -> None:
    """Events sent from other threads while the runs' passes store their waits:
    every run gets its event, whichever came first."""
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    runs = [engine.start(ev_checkout, {}) for _ in range(12)]
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def send_all() -> None:
        try:
            go.wait(60)
            for i, run in enumerate(runs):
                engine.events.send(run.id, "payment", {"order": i}, event_id=f"e{i}")
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    sender = threading.Thread(target=send_all)
    sender.start()
    go.wait(60)
    for run in runs:
        engine.orchestrate(run.id)
    sender.join(60)
    assert not errors, errors
    engine.run_until_idle()
    for i, run in enumerate(runs):
        done = engine.get_run(run.id)
        assert done.status == RunStatus.COMPLETED, (i, done.status, done.error)
        assert done.output["paid"] == {"order": i}
        assert [e.step_id is not None for e in _events(engine, run.id)] == [True]


class _Refused(Exception):
    pass


@step(name="ev_notify_other")
def ev_notify_other(data: Any) -> Any:
    """Sends an event to another run, then fails when told to (a transactional step)."""
    other = WorkflowEngine(data["alias"], leases=InMemoryLeaseService())
    sent = other.events.send(data["run"], "payment", {"order": 9}, event_id=data["event_id"])
    if data["fail"]:
        raise _Refused("after sending")
    return str(sent.outcome)


@workflow(name="ev_handler")
def ev_handler(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("notify", ev_notify_other, inp, transactional=True, retries=0)


def test_a_transactional_step_sends_its_event_with_its_result_or_not_at_all(
    engine: WorkflowEngine, alias: str
) -> None:
    waiting = engine.start(ev_checkout, {})
    engine.run_until_idle()
    failed = engine.start(
        ev_handler, {"alias": alias, "run": str(waiting.id), "event_id": "x1", "fail": True}
    )
    engine.run_until_idle()
    assert engine.get_run(failed.id).status == RunStatus.FAILED
    assert _events(engine, waiting.id) == []  # rolled back with the step
    assert engine.get_run(waiting.id).status == RunStatus.RUNNING
    handled = engine.start(
        ev_handler, {"alias": alias, "run": str(waiting.id), "event_id": "x1", "fail": False}
    )
    engine.run_until_idle()
    assert engine.get_run(handled.id).output == "delivered"
    engine.wake_run(waiting.id)  # woken on the step's clock, not this test's fake one
    engine.run_until_idle()
    assert engine.get_run(waiting.id).output["shipped"] == {"order": 9}
