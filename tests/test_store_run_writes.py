"""The store's run-level and queue writes (``RunWrites``, ``QueueWrites``), each case
on every database: every write is guarded by the state it expects, and says
whether it won."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from pikku_django.dbclock import store_now_ms
from pikku_django.models import (
    QueueClaim,
    QueuePause,
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows.store import WorkflowStore
from pikku_django.workflows.store.run_writes import ChildBranch, StoppedStep
from tests.conftest import db_mark
from tests.test_workflow_store import VENDORS, make_store


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def store(request: pytest.FixtureRequest) -> WorkflowStore:
    return make_store((request.param, "vendor"))


def _run(store: WorkflowStore, **fields: Any) -> WorkflowRun:
    fields.setdefault("workflow", "wf")
    return WorkflowRun.objects.using(store.using).create(**fields)


def _step(store: WorkflowStore, run: WorkflowRun, name: str = "s", **fields: Any) -> WorkflowStep:
    fields.setdefault("kind", StepKind.QUEUED)
    fields.setdefault("function", "fn")
    return WorkflowStep.objects.using(store.using).create(run=run, name=name, **fields)


def _read(store: WorkflowStore, run: WorkflowRun) -> WorkflowRun:
    return WorkflowRun.objects.using(store.using).get(id=run.id)


def _read_step(store: WorkflowStore, step: WorkflowStep) -> WorkflowStep:
    return WorkflowStep.objects.using(store.using).get(id=step.id)


def _attempts(store: WorkflowStore, step: WorkflowStep) -> list[tuple[int, str]]:
    rows = StepAttempt.objects.using(store.using).filter(step_id=step.id).order_by("attempt")
    return list(rows.values_list("attempt", "status"))


#: (operation, the run's status before, whether it changes, its status after)
TRANSITIONS = [
    ("end_run", RunStatus.RUNNING, True, RunStatus.FAILED),
    ("end_run", RunStatus.SUSPENDED, False, RunStatus.SUSPENDED),
    ("end_run", RunStatus.CANCELLED, False, RunStatus.CANCELLED),
    ("suspend_run", RunStatus.RUNNING, True, RunStatus.SUSPENDED),
    ("suspend_run", RunStatus.COMPLETED, False, RunStatus.COMPLETED),
    ("resume_run", RunStatus.SUSPENDED, True, RunStatus.RUNNING),
    ("resume_run", RunStatus.RUNNING, False, RunStatus.RUNNING),
    ("resume_run", RunStatus.CANCELLED, False, RunStatus.CANCELLED),
    ("cancel_run", RunStatus.RUNNING, True, RunStatus.CANCELLED),
    ("cancel_run", RunStatus.SUSPENDED, True, RunStatus.CANCELLED),
    ("cancel_run", RunStatus.COMPLETED, False, RunStatus.COMPLETED),
    ("cancel_run", RunStatus.CANCELLED, False, RunStatus.CANCELLED),
    ("reopen_run", RunStatus.FAILED, True, RunStatus.RUNNING),
    ("reopen_run", RunStatus.COMPLETED, False, RunStatus.COMPLETED),
    ("wake_run", RunStatus.RUNNING, True, RunStatus.RUNNING),
    ("wake_run", RunStatus.SUSPENDED, False, RunStatus.SUSPENDED),
]


def _transition(store: WorkflowStore, op: str, run: WorkflowRun) -> bool:
    now = timezone.now()
    calls = {
        "end_run": lambda: store.end_run(run.id, RunStatus.FAILED, None, {"message": "x"}),
        "suspend_run": lambda: store.suspend_run(run.id, "waiting"),
        "resume_run": lambda: store.resume_run(run.id, now),
        "cancel_run": lambda: store.cancel_run(run.id),
        "reopen_run": lambda: store.reopen_run(run.id, now, now),
        "wake_run": lambda: store.wake_run(run.id, now),
    }
    return calls[op]()


@pytest.mark.parametrize(
    ("op", "before", "changes", "after"),
    TRANSITIONS,
    ids=[f"{op}-{before}" for op, before, _, _ in TRANSITIONS],
)
def test_a_run_moves_only_from_the_status_its_write_expects(
    store: WorkflowStore, op: str, before: str, changes: bool, after: str
) -> None:
    run = _run(store, status=before, wakes=3)
    assert _transition(store, op, run) is changes
    row = _read(store, run)
    assert row.status == after
    counted = op in ("resume_run", "reopen_run", "wake_run") and changes
    assert row.wakes == 3 + counted


def test_ending_a_run_writes_its_end(store: WorkflowStore) -> None:
    run = _run(store, wake_at=timezone.now())
    assert store.end_run(run.id, RunStatus.COMPLETED, {"n": 1}, None)
    row = _read(store, run)
    assert (row.status, row.output, row.error, row.wake_at) == ("completed", {"n": 1}, None, None)


def test_a_suspended_run_keeps_its_reason_until_resumed(store: WorkflowStore) -> None:
    run = _run(store, wake_at=timezone.now())
    store.suspend_run(run.id, "approval")
    row = _read(store, run)
    assert (row.suspend_reason, row.wake_at) == ("approval", None)
    at = timezone.now() + timedelta(seconds=5)
    store.resume_run(run.id, at)
    row = _read(store, run)
    assert (row.status, row.suspend_reason, row.wake_at) == ("running", "", at)


def test_reopening_drops_a_deadline_already_past_and_keeps_one_to_come(
    store: WorkflowStore,
) -> None:
    now = timezone.now()
    past = _run(store, status=RunStatus.FAILED, error={"m": 1}, deadline_at=now - timedelta(1))
    later = now + timedelta(days=1)
    coming = _run(store, status=RunStatus.FAILED, deadline_at=later)
    assert store.reopen_run(past.id, now, None)
    assert store.reopen_run(coming.id, now, now)
    a, b = _read(store, past), _read(store, coming)
    assert (a.deadline_at, a.error, a.wake_at) == (None, None, None)
    assert (b.deadline_at, b.wake_at) == (later, now)


def test_parking_is_refused_once_the_run_was_woken(store: WorkflowStore) -> None:
    run = _run(store, wakes=2, pass_errors=4, wake_at=timezone.now())
    later = timezone.now() + timedelta(hours=1)
    assert not store.park_run(run.id, 1, later)
    assert _read(store, run).pass_errors == 4
    assert store.park_run(run.id, 2, later)
    row = _read(store, run)
    assert (row.wake_at, row.pass_errors) == (later, 0)


def test_pass_errors_are_counted_while_the_run_runs(store: WorkflowStore) -> None:
    run = _run(store)
    assert [store.count_pass_error(run.id) for _ in range(3)] == [1, 2, 3]
    store.cancel_run(run.id)
    assert store.count_pass_error(run.id) is None
    assert store.count_pass_error(uuid.uuid4()) is None


def test_a_version_is_recorded_once(store: WorkflowStore) -> None:
    run = _run(store)
    assert store.record_version(run.id, "v2")
    assert not store.record_version(run.id, "v3")
    assert _read(store, run).version == "v2"


def test_published_values_accumulate_under_the_run_lock(store: WorkflowStore) -> None:
    run = _run(store, wakes=5)
    with store.atomic():
        store.lock_run(run.id)
        assert store.publish(run.id, "a", 1) == {"a": 1}
    with store.atomic():
        store.lock_run(run.id)
        assert store.publish(run.id, "b", [2]) == {"a": 1, "b": [2]}
    row = _read(store, run)
    assert (row.published, row.wakes) == ({"a": 1, "b": [2]}, 5)


def test_only_waiting_keyed_runs_are_admitted(store: WorkflowStore) -> None:
    waiting = [_run(store, concurrency_key="k", key_waiting=True) for _ in range(2)]
    let_go = _run(store, concurrency_key="k", key_waiting=False)
    ended = _run(store, concurrency_key="k", key_waiting=True, status=RunStatus.CANCELLED)
    at = timezone.now()
    assert store.admit_runs([r.id for r in [*waiting, let_go, ended]], at) == 2
    for run in waiting:
        row = _read(store, run)
        assert (row.key_waiting, row.wake_at) == (False, at)
    assert _read(store, ended).key_waiting


def test_a_debounced_run_takes_its_new_window_and_frees_its_key(store: WorkflowStore) -> None:
    start = timezone.now() + timedelta(minutes=1)
    run = _run(store, idempotency_key="k", input={"n": 1}, start_at=start, wake_at=start)
    later = start + timedelta(minutes=1)
    store.rewindow_run(run.id, {"n": 2}, later, None)
    row = _read(store, run)
    assert (row.input, row.start_at, row.wake_at) == ({"n": 2}, later, later)
    store.free_key(run.id)
    assert _read(store, run).idempotency_key is None
    assert _run(store, idempotency_key="k").idempotency_key == "k"


def test_an_overdue_run_fails_with_the_steps_still_waiting(store: WorkflowStore) -> None:
    now = timezone.now()
    run = _run(store, deadline_at=now - timedelta(seconds=1))
    child = _run(store)
    running = _step(store, run, "r", status=StepStatus.RUNNING, attempt=1, lease_expires_at=1)
    StepAttempt.objects.using(store.using).create(step=running, attempt=1, status="running")
    parent = _step(store, run, "c", kind=StepKind.CHILD, status=StepStatus.RUNNING, attempt=1)
    WorkflowStep.objects.using(store.using).filter(id=parent.id).update(child_run=child)
    scheduled = _step(store, run, "q", status=StepStatus.SCHEDULED)
    done = _step(store, run, "d", status=StepStatus.SUCCEEDED, attempt=1)
    error = {"type": "WorkflowTimeoutError"}

    assert store.fail_overdue_run(run.id, now - timedelta(seconds=5), error) is None
    stopped = store.fail_overdue_run(run.id, now, error)

    assert stopped is not None
    assert sorted(stopped, key=lambda s: s.id) == [
        StoppedStep(running.id, StepKind.QUEUED, None),
        StoppedStep(parent.id, StepKind.CHILD, child.id),
        StoppedStep(scheduled.id, StepKind.QUEUED, None),
    ]
    assert _read(store, run).status == RunStatus.FAILED
    for step in (running, parent, scheduled):
        row = _read_step(store, step)
        assert (row.status, row.error, row.lease_expires_at) == ("failed", error, None)
        assert row.attempt >= row.retries + 1  # no attempt left
    assert _read_step(store, done).status == StepStatus.SUCCEEDED
    assert _attempts(store, running) == [(1, "failed")]
    assert store.fail_overdue_run(run.id, now, error) is None  # failed already


def test_a_suspension_times_out_once(store: WorkflowStore) -> None:
    now = timezone.now()
    run = _run(store, status=RunStatus.SUSPENDED)
    step = _step(store, run, kind=StepKind.SUSPEND, status=StepStatus.SUSPENDED, available_at=now)
    assert not store.time_out_suspension(step.id, now - timedelta(seconds=1), {"m": "early"})
    assert store.time_out_suspension(step.id, now, {"m": "late"})
    assert not store.time_out_suspension(step.id, now, {"m": "again"})
    row = _read_step(store, step)
    assert (row.status, row.error, row.attempt, row.retries) == ("failed", {"m": "late"}, 1, 0)
    assert _attempts(store, step) == [(1, "failed")]


def test_a_marker_step_settles_unless_it_succeeded(store: WorkflowStore) -> None:
    run = _run(store)
    sleep = _step(store, run, kind=StepKind.SLEEP, status=StepStatus.SCHEDULED, retries=3)
    store.settle_marker(sleep.id, 1, StepStatus.SUCCEEDED, result={"ok": 1}, retries=0)
    assert _attempts(store, sleep) == [(1, "succeeded")]
    store.settle_marker(sleep.id, 1, StepStatus.FAILED, error={"m": 1}, retries=0)
    row = _read_step(store, sleep)
    assert (row.status, row.result, row.error, row.retries) == ("succeeded", {"ok": 1}, None, 0)


def test_a_suspended_step_is_rescheduled_only_while_suspended(store: WorkflowStore) -> None:
    run = _run(store)
    step = _step(store, run, status=StepStatus.SUSPENDED, error={"code": "missing"})
    at = timezone.now()
    assert store.reschedule_suspended(step.id, at)
    assert not store.reschedule_suspended(step.id, at)
    row = _read_step(store, step)
    assert (row.status, row.available_at, row.error) == ("scheduled", at, None)


def test_a_failed_step_is_reopened_by_the_attempt_that_failed(store: WorkflowStore) -> None:
    run = _run(store)
    step = _step(store, run, status=StepStatus.FAILED, attempt=3, retries=2)
    at = timezone.now()
    assert not store.reopen_step(step.id, 2, at)
    assert store.reopen_step(step.id, 3, at)
    row = _read_step(store, step)
    assert (row.status, row.attempt, row.retries, row.available_at) == ("failed", 3, 3, at)


def test_a_child_step_reopens_as_its_next_attempt(store: WorkflowStore) -> None:
    run = _run(store)
    step = _step(store, run, kind=StepKind.CHILD, status=StepStatus.FAILED, attempt=1, retries=0)
    assert store.reopen_child_step(step.id, 1, 1)
    assert not store.reopen_child_step(step.id, 1, 1)
    row = _read_step(store, step)
    assert (row.status, row.attempt, row.retries, row.lease_expires_at) == ("running", 2, 1, None)
    assert _attempts(store, step) == [(2, "running")]


def test_a_child_run_is_attached_to_its_step(store: WorkflowStore) -> None:
    run = _run(store)
    step = _step(store, run, kind=StepKind.CHILD, status=StepStatus.RUNNING, attempt=1)
    child = WorkflowRun(workflow="child", input={"n": 1})
    store.attach_child(step.id, child)
    assert _read_step(store, step).child_run_id == child.id
    assert _read(store, child).input == {"n": 1}
    assert _attempts(store, step) == [(1, "running")]


def test_branches_are_stored_together_or_not_at_all(store: WorkflowStore) -> None:
    run = _run(store, priority=4)
    group = _step(store, run, "g", kind=StepKind.PARALLEL, status=StepStatus.RUNNING)
    branches = [ChildBranch(f"g/{n}", WorkflowRun(workflow="b", input=n)) for n in range(3)]
    steps = store.add_branches(run.id, group.id, branches, run.priority)
    assert steps is not None
    assert sorted((s.name, s.child_run_id, s.priority) for s in steps) == [
        (b.name, b.run.id, 4) for b in branches
    ]
    assert _read_step(store, group).open_branches == 3
    assert all(_attempts(store, s) == [(1, "running")] for s in steps)

    again = [ChildBranch("g/2", WorkflowRun(workflow="b")), ChildBranch("g/3", WorkflowRun())]
    assert store.add_branches(run.id, group.id, again, run.priority) is None
    assert _read_step(store, group).open_branches == 3  # rolled back with the rest
    assert not WorkflowRun.objects.using(store.using).filter(id=again[1].run.id).exists()


def test_deleting_runs_takes_their_rows_with_them(store: WorkflowStore) -> None:
    gone, kept = _run(store, status=RunStatus.COMPLETED), _run(store)
    step = _step(store, gone, status=StepStatus.SUCCEEDED, attempt=1)
    StepAttempt.objects.using(store.using).create(step=step, attempt=1, status="succeeded")
    WorkflowEvent.objects.using(store.using).create(run=gone, name="e", event_id="1")
    assert store.delete_runs([gone.id]) == 1
    assert list(WorkflowRun.objects.using(store.using).values_list("id", flat=True)) == [kept.id]
    assert not WorkflowStep.objects.using(store.using).exists()
    assert not StepAttempt.objects.using(store.using).exists()
    assert not WorkflowEvent.objects.using(store.using).exists()


# -- queues ------------------------------------------------------------------------------


def test_a_queue_is_paused_once_and_resumed_once(store: WorkflowStore) -> None:
    added = store.add_pause("mail", "outage", "ops")
    assert added.added
    assert (added.row.queue, added.row.reason, added.row.paused_by) == ("mail", "outage", "ops")
    again = store.add_pause("mail", "other", "someone")
    assert (again.added, again.row.reason) == (False, "outage")
    assert store.remove_pause("mail")
    assert not store.remove_pause("mail")
    assert not QueuePause.objects.using(store.using).exists()


def test_no_open_transaction_is_waited_for(store: WorkflowStore) -> None:
    assert store.await_open_transactions(5.0)


def test_rate_slots_are_made_stamped_and_dropped(store: WorkflowStore) -> None:
    slots = QueueClaim.objects.using(store.using).filter(queue="q")
    store.add_rate_slots("q", range(0, 4))
    store.add_rate_slots("q", range(2, 6))  # numbers made already are left
    assert sorted(slots.values_list("slot", flat=True)) == [0, 1, 2, 3, 4, 5]
    before = store_now_ms(store.using)
    store.stamp_rate_slots(list(slots.filter(slot__in=(0, 5)).values_list("id", flat=True)))
    stamped = dict(slots.values_list("slot", "claimed_ms"))
    assert min(stamped[0], stamped[5]) >= before
    assert stamped[1] == 0
    # Past a count of 3: slots 3 and 4 unused for a period go; 5 was used just now.
    assert store.drop_rate_slots("q", 3, per_seconds=3600) == 2
    assert sorted(slots.values_list("slot", flat=True)) == [0, 1, 2, 5]
