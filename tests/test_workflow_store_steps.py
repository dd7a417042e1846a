"""The store's step-level writes (``StepWrites``) against every workflow store on
every database: steps a pass records itself, a withdrawn attempt, a parallel group's
branch count, run locks, a pass owed, and the events sent to runs."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from pikku_django.models import (
    RunStatus,
    StepAttempt,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows.store import WorkflowStore
from pikku_django.workflows.store.step_writes import BranchSettled, StepRow
from tests.conftest import on_databases
from tests.test_workflow_store import STORES, make_store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> WorkflowStore:
    return make_store(request.param)


def _run(store: WorkflowStore, **fields: Any) -> WorkflowRun:
    fields.setdefault("workflow", "wf")
    return WorkflowRun.objects.using(store.using).create(**fields)


def _step(store: WorkflowStore, run: WorkflowRun, name: str = "s", **fields: Any) -> WorkflowStep:
    fields.setdefault("kind", "queued")
    fields.setdefault("function", "fn")
    return WorkflowStep.objects.using(store.using).create(run=run, name=name, **fields)


def _row(store: WorkflowStore, step: WorkflowStep) -> WorkflowStep:
    return WorkflowStep.objects.using(store.using).get(id=step.id)


def test_recording_a_step_writes_its_columns_once(store: WorkflowStore) -> None:
    run = _run(store, priority=3)
    group = _step(store, run, "g", kind="parallel", status=StepStatus.RUNNING)
    due = timezone.now() + timedelta(seconds=30)
    row = StepRow(
        run.id,
        "wait",
        "event",
        StepStatus.SCHEDULED,
        function="paid",
        input={"event": "paid", "timeout": 30},
        retries=0,
        priority=run.priority,
        available_at=due,
        group_id=group.id,
    )
    recorded = store.record_step(row)
    assert recorded.new
    stored = _row(store, recorded.step)
    assert (stored.kind, stored.status, stored.function, stored.retries) == (
        "event",
        "scheduled",
        "paid",
        0,
    )
    assert (stored.input, stored.priority, stored.available_at) == (
        {"event": "paid", "timeout": 30},
        3,
        due,
    )
    assert (stored.group_id, stored.attempt, stored.queue) == (group.id, 0, "default")

    # Another pass of the run recorded it first: its row stands, and the outer
    # transaction goes on.
    with transaction.atomic(using=store.using):
        again = store.record_step(StepRow(run.id, "wait", "sleep", StepStatus.SUCCEEDED))
        assert WorkflowRun.objects.using(store.using).filter(id=run.id).exists()
    assert not again.new
    assert again.step.id == recorded.step.id
    assert (again.step.kind, again.step.status) == ("event", "scheduled")
    assert WorkflowStep.objects.using(store.using).filter(run=run, name="wait").count() == 1


def test_withdrawing_an_attempt_is_fenced_by_it(store: WorkflowStore) -> None:
    run = _run(store)
    step = _step(store, run, status=StepStatus.RUNNING, attempt=2, lease_expires_at=1)
    attempts = StepAttempt.objects.using(store.using)
    attempts.create(step=step, attempt=1, status=StepStatus.FAILED)
    attempts.create(step=step, attempt=2, status=StepStatus.RUNNING)
    error = {"type": "StepFunctionNotFoundError", "message": "fn", "code": "RPC_NOT_FOUND"}

    assert store.withdraw_attempt(step.id, 1, error=error) is False  # replaced: refused
    assert (_row(store, step).status, _row(store, step).attempt) == ("running", 2)

    assert store.withdraw_attempt(step.id, 2, error=error) is True
    row = _row(store, step)
    assert (row.status, row.attempt, row.lease_expires_at) == ("suspended", 1, None)
    assert row.error == error
    assert list(attempts.filter(step=step).values_list("attempt", flat=True)) == [1]

    # Withdrawn once: the attempt no longer runs, so a second withdrawal is refused.
    assert store.withdraw_attempt(step.id, 2, error=error) is False
    assert _row(store, step).attempt == 1


def test_settling_branches_wakes_the_run_once_by_the_last(store: WorkflowStore) -> None:
    run = _run(store)
    group = _step(store, run, "g", kind="parallel", status=StepStatus.RUNNING, open_branches=3)
    outcomes = [store.settle_branch(group.id, failed=False) for _ in range(3)]
    assert outcomes == [BranchSettled.OPEN, BranchSettled.OPEN, BranchSettled.LAST]
    assert [o.wakes_run for o in outcomes] == [False, False, True]
    assert _row(store, group).open_branches == 0


def test_a_failed_branch_wakes_the_run_at_once(store: WorkflowStore) -> None:
    run = _run(store)
    group = _step(store, run, "g", kind="parallel", status=StepStatus.RUNNING, open_branches=3)
    assert store.settle_branch(group.id, failed=True) is BranchSettled.FAILED
    assert BranchSettled.FAILED.wakes_run
    assert _row(store, group).open_branches == 2


def test_a_joined_group_counts_no_more_branches(store: WorkflowStore) -> None:
    run = _run(store)
    group = _step(store, run, "g", kind="parallel", status=StepStatus.FAILED, open_branches=2)
    assert store.settle_branch(group.id, failed=False) is BranchSettled.JOINED
    assert store.settle_branch(group.id, failed=True) is BranchSettled.JOINED
    assert not BranchSettled.JOINED.wakes_run
    assert _row(store, group).open_branches == 2
    assert store.settle_branch(group.id + 1000, failed=False) is BranchSettled.JOINED


def test_locking_a_run_changes_nothing(store: WorkflowStore) -> None:
    run = _run(store, wakes=4)
    with transaction.atomic(using=store.using):
        assert store.lock_run(run.id) is True
        assert store.lock_run(str(run.id)) is True
        assert store.lock_run(run.id.hex[::-1][:8] + run.id.hex[8:]) is False
    again = WorkflowRun.objects.using(store.using).get(id=run.id)
    assert (again.wakes, again.status, again.wake_at) == (4, "running", None)


def test_a_pass_owed_makes_a_running_run_due_uncounted(store: WorkflowStore) -> None:
    at = timezone.now() + timedelta(seconds=5)
    run = _run(store, wakes=2)
    assert store.due_for_pass(run.id, at) is True
    again = WorkflowRun.objects.using(store.using).get(id=run.id)
    assert (again.wake_at, again.wakes) == (at, 2)

    ended = _run(store, status=RunStatus.CANCELLED)
    assert store.due_for_pass(ended.id, at) is False
    assert WorkflowRun.objects.using(store.using).get(id=ended.id).wake_at is None


def test_an_event_is_stored_once_per_id_and_taken_by_a_wait(store: WorkflowStore) -> None:
    run = _run(store)
    other = _run(store)
    with transaction.atomic(using=store.using):
        event = store.add_event(run.id, "paid", "e-1", {"amount": 3})
        assert event is not None
        # The same id again is refused without spoiling the caller's transaction.
        assert store.add_event(run.id, "paid", "e-1", {"amount": 4}) is None
        assert store.add_event(other.id, "paid", "e-1", {"amount": 5}) is not None
    events = WorkflowEvent.objects.using(store.using)
    stored = events.get(run=run)
    assert (stored.name, stored.event_id, stored.data, stored.step_id) == (
        "paid",
        "e-1",
        {"amount": 3},
        None,
    )
    wait = _step(store, run, "event:paid", kind="event", function="paid")
    store.take_event(event.id, wait.id)
    assert events.get(id=event.id).step_id == wait.id
    assert events.get(run=other).step_id is None


def test_a_locked_run_status_is_read_in_the_callers_transaction(store: WorkflowStore) -> None:
    run = _run(store, status=RunStatus.CANCELLED)
    with transaction.atomic(using=store.using):
        assert store.locked_run_status(run.id) == "cancelled"
        WorkflowRun.objects.using(store.using).filter(id=run.id).update(status="running")
        assert store.locked_run_status(run.id) == "running"
    missing = _run(store)
    WorkflowRun.objects.using(store.using).filter(id=missing.id).delete()
    with transaction.atomic(using=store.using):
        assert store.locked_run_status(missing.id) is None


def _other_lock(store: WorkflowStore, run: WorkflowRun) -> str:
    """Whether another transaction may lock the run's row at once."""
    seen: list[str] = []

    def other() -> None:
        try:
            with transaction.atomic(using=store.using):
                locked = WorkflowRun.objects.using(store.using).select_for_update(nowait=True)
                locked.filter(id=run.id).exists()
            seen.append("locked")
        except DatabaseError:
            seen.append("refused")
        finally:
            connections[store.using].close()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    return seen[0]


@on_databases("postgres", "mariadb")
@pytest.mark.parametrize("kind", ["orm", "vendor"])
@pytest.mark.parametrize("lock", ["lock_run", "locked_run_status"])
def test_a_run_lock_holds_off_other_transactions_until_commit(
    vendor: str, kind: str, lock: str
) -> None:
    store = make_store((vendor, kind))
    run = _run(store)
    with transaction.atomic(using=store.using):
        getattr(store, lock)(run.id)
        during = _other_lock(store, run)
    assert (during, _other_lock(store, run)) == ("refused", "locked")
