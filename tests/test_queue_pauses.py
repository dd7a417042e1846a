"""Pausing a queue, in-process on SQLite, PostgreSQL and MariaDB: every route that
claims a queued step leaves a paused queue's steps alone (fresh steps, due retries,
lapsed claims, a claim by id, the step a pass reaches, even where the pass's look at
the pauses is stale), other queues are claimed as usual, an inline run is driven by
its caller, and the resume makes the steps claimable again.
tests/test_queue_pauses_workers.py runs the pause against worker processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from pikku_django.dbclock import EpochMs
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import QueuePause, RunStatus, StepStatus, WorkflowStep
from pikku_django.workflows import (
    FakeClock,
    PauseChange,
    WorkflowContext,
    WorkflowEngine,
    pause_queue,
    paused_queues,
    resume_queue,
    step,
    workflow,
)
from pikku_django.workflows.control._pause_conditions import paused_look
from pikku_django.workflows.engine import StepClaimer
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")
CLAIMER = StepClaimer("host:1:2")


@step(name="qpa_echo", retries=2, retry_delay=0)
def qpa_echo(data: Any) -> Any:
    return data


@workflow(name="qpa_one")
def qpa_one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("work", qpa_echo, inp)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    paused_look.forget()
    yield database_alias(request.param)
    paused_look.forget()


@pytest.fixture
def engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


def _stored(engine: WorkflowEngine, queue: str) -> WorkflowStep:
    """A run on ``queue`` passed once without a claimer: its step stored, scheduled."""
    run = engine.start(qpa_one, queue, queue=queue)
    assert engine.orchestrate(run.id) is None
    return engine.steps().get(run_id=run.id)


def _claimed_queues(engine: WorkflowEngine, *, busy: bool) -> list[str]:
    return [c.queue for c in engine.claim_due_steps(None, 10, "w", busy=busy)]


@pytest.mark.parametrize("busy", [False, True], ids=["look", "busy"])
def test_fresh_steps_of_a_paused_queue_are_not_claimed(
    engine: WorkflowEngine, alias: str, busy: bool
) -> None:
    held, free = _stored(engine, "held"), _stored(engine, "free")
    pause_queue("held", using=alias)
    assert _claimed_queues(engine, busy=busy) == ["free"]
    assert _claimed_queues(engine, busy=busy) == []
    assert engine.claim_step(held.id) is None  # nor by its id
    held.refresh_from_db(using=alias)
    assert (held.status, held.attempt) == (StepStatus.SCHEDULED, 0)
    assert resume_queue("held", using=alias).change is PauseChange.RESUMED
    [claimed] = engine.claim_due_steps(None, 10, "w", busy=busy)
    assert claimed.step_id == held.id
    assert free.id != held.id


def test_due_retries_and_lapsed_claims_of_a_paused_queue_wait(
    engine: WorkflowEngine, alias: str
) -> None:
    retry, lapsed = _stored(engine, "held"), _stored(engine, "held")
    now = engine.clock.now()
    engine.steps().filter(id=retry.id).update(status=StepStatus.FAILED, attempt=1, available_at=now)
    engine.steps().filter(id=lapsed.id).update(
        status=StepStatus.RUNNING, attempt=1, lease_expires_at=EpochMs() - 1000
    )
    pause_queue("held", using=alias)
    for busy in (False, True, False):
        assert engine.claim_due_steps(None, 10, "w", busy=busy) == []
    assert engine.claim_step(retry.id) is None
    assert engine.claim_step(lapsed.id) is None
    assert not engine.attempts().filter(step__queue="held", attempt=2).exists()
    resume_queue("held", using=alias)
    claimed = engine.claim_due_steps(None, 10, "w")
    assert sorted(c.step_id for c in claimed) == sorted([retry.id, lapsed.id])
    assert {c.attempt for c in claimed} == {2}


def test_a_pass_stores_a_paused_queues_step_waiting(engine: WorkflowEngine, alias: str) -> None:
    pause_queue("held", using=alias)
    run = engine.start(qpa_one, 1, queue="held")
    assert engine.claim_due_runs(1) == [run.id]
    assert engine.orchestrate(run.id, claimer=CLAIMER) is None
    row = engine.steps().get(run_id=run.id)
    assert (row.status, row.attempt) == (StepStatus.SCHEDULED, 0)
    assert not engine.attempts().filter(step_id=row.id).exists()
    # Another queue's step is stored claimed by the pass, as ever.
    other = engine.start(qpa_one, 2, queue="free")
    assert engine.claim_due_runs(1) == [other.id]
    claimed = engine.orchestrate(other.id, claimer=CLAIMER)
    assert claimed is not None
    assert claimed.queue == "free"


def test_a_pass_whose_look_is_stale_claims_nothing_and_looks_again(
    engine: WorkflowEngine, alias: str
) -> None:
    pause_queue("held", using=alias)
    # Another process paused it after this one looked: the claim itself refuses.
    paused_look._seen[alias] = (time.monotonic(), frozenset())
    run = engine.start(qpa_one, 1, queue="held")
    assert engine.claim_due_runs(1) == [run.id]
    assert engine.orchestrate(run.id, claimer=CLAIMER) is None
    assert not engine.steps().filter(run_id=run.id).exists()
    assert engine.attempts().count() == 0
    # The refusal woke the run and made this process look again: the next pass
    # stores the step waiting on its queue.
    assert engine.claim_due_runs(1) == [run.id]
    assert engine.orchestrate(run.id, claimer=CLAIMER) is None
    row = engine.steps().get(run_id=run.id)
    assert (row.status, row.attempt) == (StepStatus.SCHEDULED, 0)


def test_an_inline_run_goes_on_through_a_paused_queue(engine: WorkflowEngine, alias: str) -> None:
    pause_queue("held", using=alias)
    run = engine.start(qpa_one, 7, queue="held", inline=True)
    assert (run.status, run.output) == (RunStatus.COMPLETED, 7)


def test_pausing_and_resuming_say_what_changed(alias: str) -> None:
    first = pause_queue("held", reason="partner API down", paused_by="ops", using=alias)
    assert first.change is PauseChange.PAUSED
    assert first.pause is not None
    again = pause_queue("held", reason="other", paused_by="someone", using=alias)
    assert again.change is PauseChange.ALREADY_PAUSED
    assert again.pause == first.pause  # the pause in force is kept as it was
    [shown] = paused_queues(alias)
    assert (shown.queue, shown.reason, shown.paused_by) == ("held", "partner API down", "ops")
    assert resume_queue("held", using=alias).change is PauseChange.RESUMED
    assert resume_queue("held", using=alias).change is PauseChange.NOT_PAUSED
    assert paused_queues(alias) == []


@pytest.mark.parametrize("name", ["", "x" * 101])
def test_a_bad_queue_name_is_refused(alias: str, name: str) -> None:
    with pytest.raises(ValueError, match="queue name"):
        pause_queue(name, using=alias)
    with pytest.raises(TypeError, match="queue name"):
        pause_queue(5, using=alias)  # type: ignore[arg-type]
    assert not QueuePause.objects.using(alias).exists()
