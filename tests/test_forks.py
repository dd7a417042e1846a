"""``fork_run``: a finished run re-run from its first, a middle and its last step on
SQLite, PostgreSQL and MariaDB (kept steps not called again, the rest called, the
output a fresh run's, the original untouched), and what is refused."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from django.forms.models import model_to_dict

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, WorkflowEvent, WorkflowRun, WorkflowStep
from pikku_django.workflows import (
    ForkRefusal,
    ForkRefusedError,
    WorkflowEngine,
    WorkflowRunNotFoundError,
    fork_run,
    registry,
)
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, db_mark
from tests.fork_defs import CALLS, FANOUT, ORDER

VENDORS = ("sqlite", "postgres", "mariadb")

#: The order workflow's steps as recorded, and the step functions each one calls.
ORDER_STEPS = ["charge", "publish:charged", "record", "child", "event:approve", "ship"]


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def engine(alias: str) -> Iterator[WorkflowEngine]:
    reset_engine()
    CALLS.clear()
    yield WorkflowEngine(alias, leases=InMemoryLeaseService())
    reset_engine()


def finish(engine: WorkflowEngine, run_id: Any, *, approve: bool) -> WorkflowRun:
    engine.run_until_idle()
    if approve:
        engine.events.send(run_id, "approve", {"by": "ada"}, event_id="approval-1")
        engine.run_until_idle()
    return engine.get_run(run_id)


def snapshot(engine: WorkflowEngine, run_id: Any) -> dict[str, Any]:
    """Every column of the run, its steps, their attempts and its events."""
    steps = WorkflowStep.objects.using(engine.using).filter(run_id=run_id).order_by("id")
    return {
        "run": model_to_dict(engine.get_run(run_id))
        | {"updated": engine.get_run(run_id).updated_at},
        "steps": [model_to_dict(s) | {"updated": s.updated_at} for s in steps],
        "attempts": list(engine.attempts().filter(step__run_id=run_id).order_by("id").values()),
        "events": list(
            WorkflowEvent.objects.using(engine.using).filter(run_id=run_id).order_by("id").values()
        ),
    }


def names(engine: WorkflowEngine, run_id: Any) -> list[str]:
    steps = WorkflowStep.objects.using(engine.using).filter(run_id=run_id).order_by("id")
    return [s.name for s in steps]


#: The fork point, the calls the fork makes, and whether it must be sent the event.
POINTS = {
    "first": ("charge", {"charge": 1, "record": 1, "double": 1, "ship": 1}, True),
    "middle": ("child", {"double": 1, "ship": 1}, True),
    "last": ("ship", {"ship": 1}, False),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_fork_reruns_from_the_step_and_keeps_the_rest(engine: WorkflowEngine, point: str) -> None:
    original = engine.start(ORDER, {"n": 4})
    done = finish(engine, original.id, approve=True)
    assert done.status == RunStatus.COMPLETED, done.error
    assert names(engine, original.id) == ORDER_STEPS
    before = snapshot(engine, original.id)
    original_child = engine.steps().get(run_id=original.id, name="child").child_run_id

    step, calls, needs_event = POINTS[point]
    CALLS.clear()
    fork = fork_run(original.id, step, using=engine.using)
    assert fork.id != original.id
    assert fork.forked_from_id == original.id
    assert fork.forked_at_step == step
    assert fork.input == original.input
    forked = finish(engine, fork.id, approve=needs_event)

    assert forked.status == RunStatus.COMPLETED, forked.error
    assert forked.output == done.output  # what a fresh run of the same input returns
    assert dict(CALLS) == calls  # the kept steps did not run again; the rest did, once
    assert names(engine, fork.id) == ORDER_STEPS
    assert forked.published == done.published
    assert snapshot(engine, original.id) == before  # the original as it was

    child = engine.steps().get(run_id=fork.id, name="child").child_run_id
    if point == "last":
        assert child == original_child  # a kept child step points at the original child
    else:
        assert child not in (None, original_child)  # a new child run
        assert engine.get_run(child).status == RunStatus.COMPLETED
    assert list(WorkflowRun.objects.using(engine.using).get(pk=original.id).forks.all()) == [
        WorkflowRun.objects.using(engine.using).get(pk=fork.id)
    ]


def test_a_kept_wait_keeps_its_event_and_a_rerun_wait_waits_for_a_new_one(
    engine: WorkflowEngine,
) -> None:
    original = engine.start(ORDER, {"n": 1})
    finish(engine, original.id, approve=True)
    events = WorkflowEvent.objects.using(engine.using)

    kept = fork_run(original.id, "ship", using=engine.using)
    copied = events.get(run_id=kept.id)
    assert (copied.name, copied.event_id, copied.data) == ("approve", "approval-1", {"by": "ada"})
    assert copied.step_id == engine.steps().get(run_id=kept.id, name="event:approve").id
    assert events.get(run_id=original.id).step_id != copied.step_id

    rerun = fork_run(original.id, "event:approve", using=engine.using)
    engine.run_until_idle()
    assert not events.filter(run_id=rerun.id).exists()  # not copied: its wait is re-run
    assert engine.get_run(rerun.id).status == RunStatus.RUNNING  # waiting for a new one
    engine.events.send(rerun.id, "approve", {"by": "bob"})
    engine.run_until_idle()
    assert engine.get_run(rerun.id).output["approved_by"] == "bob"


def test_fork_by_position_and_overrides(engine: WorkflowEngine) -> None:
    original = engine.start(ORDER, {"n": 2}, priority=5, queue="orders")
    finish(engine, original.id, approve=True)
    fork = fork_run(original.id, 3, using=engine.using, priority=-3)
    assert fork.forked_at_step == "record"
    assert (fork.priority, fork.queue) == (-3, "orders")
    assert fork.idempotency_key is None
    kept = engine.steps().filter(run_id=fork.id)
    assert [s.name for s in kept.order_by("id")] == ["charge", "publish:charged"]
    assert not engine.attempts().filter(step__run_id=fork.id).exists()  # history stays

    WorkflowRun.objects.using(engine.using).filter(pk=original.id).delete()
    left = engine.get_run(fork.id)  # the fork outlives its original
    assert (left.forked_from_id, left.forked_at_step) == (None, "record")
    assert [s.name for s in kept.order_by("id")] == ["charge", "publish:charged"]


def test_a_failed_run_is_forked_at_the_step_that_failed(engine: WorkflowEngine) -> None:
    original = engine.start(ORDER, {"n": 3})
    engine.run_until_idle()
    engine.cancel(original.id)  # cancelled while it waits for the event
    fork = fork_run(original.id, "event:approve", using=engine.using)
    CALLS.clear()
    assert finish(engine, fork.id, approve=True).status == RunStatus.COMPLETED
    assert dict(CALLS) == {"ship": 1}


def test_parallel_group_fork_points(engine: WorkflowEngine) -> None:
    original = engine.start(FANOUT, {"n": 1})
    engine.run_until_idle()
    done = engine.get_run(original.id)
    assert done.status == RunStatus.COMPLETED, done.error

    with pytest.raises(ForkRefusedError) as refused:
        fork_run(original.id, "right", using=engine.using)
    assert refused.value.reason == ForkRefusal.IN_PARALLEL_GROUP
    assert "'both'" in str(refused.value)

    CALLS.clear()
    fork = fork_run(original.id, "both", using=engine.using)  # the whole group again
    engine.run_until_idle()
    assert engine.get_run(fork.id).output == done.output
    assert dict(CALLS) == {"double": 2, "ship": 1}

    CALLS.clear()
    last = fork_run(original.id, "ship", using=engine.using)  # the group kept, joined
    engine.run_until_idle()
    assert engine.get_run(last.id).output == done.output
    assert dict(CALLS) == {"ship": 1}
    group = engine.steps().get(run_id=last.id, name="both")
    assert sorted(s.name for s in group.branches.all()) == ["left", "right"]


@pytest.fixture
def deploy(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    def put(version: str, replays: tuple[str, ...] = ()) -> None:
        current = registry.get_workflow(ORDER)
        assert current is not None
        changed = replace(current, version=version, replays=replays)
        monkeypatch.setitem(registry._workflows, ORDER, changed)

    return put


def test_refusals(engine: WorkflowEngine, deploy: Callable[..., None]) -> None:
    running = engine.start(ORDER, {"n": 1})
    engine.run_until_idle()  # waiting for its event: still running
    with pytest.raises(ForkRefusedError) as refused:
        fork_run(running.id, "charge", using=engine.using)
    assert refused.value.reason == ForkRefusal.NOT_FINISHED
    assert "Cancel it first" in str(refused.value)

    engine.events.send(running.id, "approve", {"by": "ada"})
    engine.run_until_idle()
    with pytest.raises(ForkRefusedError) as refused:
        fork_run(running.id, "refund", using=engine.using)
    assert refused.value.reason == ForkRefusal.UNKNOWN_STEP
    assert "'charge'" in str(refused.value)  # it names the steps it has
    with pytest.raises(ForkRefusedError) as refused:
        fork_run(running.id, 7, using=engine.using)
    assert refused.value.reason == ForkRefusal.UNKNOWN_STEP

    deploy("2")
    with pytest.raises(ForkRefusedError) as refused:
        fork_run(running.id, "ship", using=engine.using)
    assert refused.value.reason == ForkRefusal.VERSION_MISMATCH
    assert "version '1'" in str(refused.value)
    assert "version '2'" in str(refused.value)
    deploy("2", ("1",))  # code that declares it replays version 1
    assert fork_run(running.id, "ship", using=engine.using).version == "1"

    engine.runs().filter(id=running.id).update(workflow="fk_gone")
    with pytest.raises(ForkRefusedError) as refused:
        fork_run(running.id, "ship", using=engine.using)
    assert refused.value.reason == ForkRefusal.NOT_REGISTERED

    with pytest.raises(WorkflowRunNotFoundError):
        fork_run("not-a-run", "ship", using=engine.using)
    forks = WorkflowRun.objects.using(engine.using).filter(forked_from_id=running.id)
    assert forks.count() == 1  # none of the refusals wrote a run


def test_a_step_never_settled_before_the_fork_point_is_refused(engine: WorkflowEngine) -> None:
    run = engine.start(ORDER, {"n": 1})
    finish(engine, run.id, approve=True)
    # As a run left by a failure with a retry still to come, then cancelled.
    engine.steps().filter(run_id=run.id, name="record").update(status="failed", attempt=1)
    with pytest.raises(ForkRefusedError) as refused:
        fork_run(run.id, "child", using=engine.using)
    assert refused.value.reason == ForkRefusal.UNSETTLED_STEP
    assert "'record'" in str(refused.value)
    CALLS.clear()
    fork = fork_run(run.id, "record", using=engine.using)
    assert finish(engine, fork.id, approve=True).status == RunStatus.COMPLETED
    assert dict(CALLS) == {"record": 1, "double": 1, "ship": 1}
