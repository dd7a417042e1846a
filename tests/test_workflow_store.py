"""One scenario table against every workflow store on every database.

On each database the generic ORM store and the vendor's own store answer the same
cases, so the two cannot drift: what is ready to claim, claiming due runs, fenced
settles, inserting claimed or settled steps, creating runs, what falls due next,
and which runs the stalled sweep wakes. The claims of steps not attempted yet
(``FreshClaims``) have their own table, in ``test_workflow_store_fresh.py``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from pikku_django.dbclock import store_now_ms
from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows.runs._options import RunOptions
from pikku_django.workflows.store import (
    MysqlStore,
    NewRun,
    NewStep,
    OrmStore,
    SqliteStore,
    WorkflowStore,
)
from pikku_django.workflows.store.base import Wake
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")


def _vendor_store(vendor: str) -> type[WorkflowStore]:
    if vendor == "postgres":
        from pikku_django.workflows.store.postgresql import PostgresStore

        return PostgresStore
    return SqliteStore if vendor == "sqlite" else MysqlStore


#: Every database, with the generic ORM store and the vendor's own.
STORES = [
    pytest.param((vendor, kind), marks=db_mark(vendor), id=f"{vendor}-{kind}")
    for vendor in VENDORS
    for kind in ("orm", "vendor")
]


def make_store(param: tuple[str, str]) -> WorkflowStore:
    """The ``(vendor, kind)`` store of :data:`STORES`."""
    vendor, kind = param
    alias = database_alias(vendor)
    cls = OrmStore if kind == "orm" else _vendor_store(vendor)
    return cls(alias)


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


def _new(run: WorkflowRun, name: str = "s") -> NewStep:
    return NewStep(run.id, name, "queued", "fn", {"n": 1}, 2, 0.5, "fixed", "default", False)


PAST, FUTURE = -60, 3600
#: (case, step fields: offsets in seconds from now for available_at, or "lapsed"/"live"
#: for the lease, run status, queue asked for, ready?)
READY_CASES: list[tuple[str, dict[str, Any], str, list[str], bool]] = [
    ("scheduled and due", {"status": "scheduled", "due": PAST}, "running", [], True),
    ("pending and due", {"status": "pending", "due": PAST}, "running", [], True),
    ("scheduled, not yet due", {"status": "scheduled", "due": FUTURE}, "running", [], False),
    ("scheduled without a time", {"status": "scheduled", "due": None}, "running", [], False),
    (
        "failed, an attempt left, due",
        {"status": "failed", "attempt": 1, "retries": 2, "due": PAST},
        "running",
        [],
        True,
    ),
    (
        "failed, an attempt left, not due",
        {"status": "failed", "attempt": 1, "retries": 2, "due": FUTURE},
        "running",
        [],
        False,
    ),
    (
        "failed, attempts spent",
        {"status": "failed", "attempt": 3, "retries": 2, "due": PAST},
        "running",
        [],
        False,
    ),
    ("running, lease lapsed", {"status": "running", "lease": "lapsed"}, "running", [], True),
    ("running, lease live", {"status": "running", "lease": "live"}, "running", [], False),
    ("running, parked (no lease)", {"status": "running", "lease": None}, "running", [], False),
    ("succeeded", {"status": "succeeded", "due": PAST}, "running", [], False),
    ("suspended", {"status": "suspended", "due": PAST}, "running", [], False),
    (
        "an inline step",
        {"status": "scheduled", "due": PAST, "kind": "inline"},
        "running",
        [],
        False,
    ),
    ("on a queue served", {"status": "scheduled", "due": PAST}, "running", ["default"], True),
    ("on a queue not served", {"status": "scheduled", "due": PAST}, "running", ["mail"], False),
    ("of a cancelled run", {"status": "scheduled", "due": PAST}, "cancelled", [], False),
]


@pytest.mark.parametrize(
    ("case", "fields", "run_status", "queues", "expected"),
    READY_CASES,
    ids=[case[0] for case in READY_CASES],
)
def test_what_is_ready_to_claim(
    store: WorkflowStore,
    case: str,
    fields: dict[str, Any],
    run_status: str,
    queues: list[str],
    expected: bool,
) -> None:
    now = timezone.now()
    fields = dict(fields)
    due, lease = fields.pop("due", None), fields.pop("lease", "none")
    if due is not None:
        fields["available_at"] = now + timedelta(seconds=due)
    store_now = store_now_ms(store.using)
    fields["lease_expires_at"] = {
        "lapsed": store_now - 60_000,
        "live": store_now + 60_000,
        None: None,
        "none": None,
    }[lease]
    run = _run(store, status=run_status)
    step = _step(store, run, **fields)
    locked = []
    with store.atomic():
        locked = [s.id for s in store.lock_ready_steps(now, queues, 10)]
    assert locked == ([step.id] if expected else []), case
    exists = store.ready_steps_exist(now, queues)
    if expected:
        assert exists, case
    elif store.exact_ready_look and run_status == RunStatus.RUNNING:
        assert not exists, case
    # An inline tree's look asks neither the run's status (the claim does) nor a queue.
    in_tree = expected or case in ("of a cancelled run", "on a queue not served")
    ready_in_tree = [s.id for s in store.ready_steps_of([run.id], now)]
    assert ready_in_tree == ([step.id] if in_tree else []), case


def test_claiming_due_runs(store: WorkflowStore) -> None:
    now = timezone.now()
    due = _run(store, wake_at=now - timedelta(seconds=5))
    earlier = _run(store, wake_at=now - timedelta(seconds=50))
    _run(store, wake_at=now + timedelta(seconds=50))
    _run(store, wake_at=now - timedelta(seconds=5), inline=True)
    _run(store, wake_at=now - timedelta(seconds=5), status=RunStatus.SUSPENDED)
    until = now + timedelta(seconds=300)
    assert store.claim_due_runs(now, until, 1) == [earlier.id]
    assert store.claim_due_runs(now, until, 5) == [due.id]
    assert store.claim_due_runs(now, until, 5) == []
    runs = WorkflowRun.objects.using(store.using)
    assert runs.get(id=due.id).wake_at == until


def test_a_claim_is_one_guarded_update_of_a_running_runs_step(store: WorkflowStore) -> None:
    from django.db.models import Q

    run = _run(store)
    step = _step(store, run, status=StepStatus.SCHEDULED)
    guard = Q(status=StepStatus.SCHEDULED, attempt=0)
    started = store.claim_attempt(step, guard, lease_ms=5_000, worker="w")
    assert started is not None
    assert store.claim_attempt(step, guard, lease_ms=5_000, worker="w") is None  # lost the race
    row = WorkflowStep.objects.using(store.using).get(id=step.id)
    assert (row.status, row.attempt, row.claim_token) == (
        StepStatus.RUNNING,
        1,
        started.claim_token,
    )
    assert started.claim_token > 0
    assert row.lease_expires_at > store_now_ms(store.using)
    attempt = StepAttempt.objects.using(store.using).get(step_id=step.id)
    assert (attempt.attempt, attempt.worker, attempt.started_at) == (1, "w", started.at)
    other = _step(store, _run(store, status=RunStatus.CANCELLED), status=StepStatus.SCHEDULED)
    assert store.claim_attempt(other, guard, lease_ms=5_000, worker="w") is None
    assert store.refresh_lease(step.id, 10_000, 1)
    assert not store.refresh_lease(step.id, 10_000, 2)
    assert store.refresh_lease(step.id, 10_000, 1, started.claim_token)
    assert not store.refresh_lease(step.id, 10_000, 1, started.claim_token - 1)


def test_a_settle_is_fenced_by_its_attempt_and_claim(store: WorkflowStore) -> None:
    run = _run(store)
    step = _step(
        store, run, status=StepStatus.RUNNING, attempt=2, lease_expires_at=1, claim_token=7
    )
    StepAttempt.objects.using(store.using).create(step=step, attempt=2)
    assert store.settle(step.id, 1, StepStatus.SUCCEEDED, result="stale") is None
    # The same attempt under an earlier claim (one lost with a failed-over database).
    assert store.settle(step.id, 2, StepStatus.SUCCEEDED, result="lost", token=6) is None
    settled = store.settle(
        step.id, 2, StepStatus.SUCCEEDED, result={"b": 1, "a": [1, 2]}, wake=Wake.NOW, token=7
    )
    assert settled is not None
    assert (settled.run_id, settled.run_status, settled.run_wakes) == (run.id, "running", 0)
    assert settled.result == {"a": [1, 2], "b": 1}
    row = WorkflowStep.objects.using(store.using).get(id=step.id)
    assert (row.status, row.result, row.lease_expires_at) == ("succeeded", settled.result, None)
    again = WorkflowRun.objects.using(store.using).get(id=run.id)
    assert again.wakes == 1
    assert again.wake_at is not None
    assert store.settle(step.id, 2, StepStatus.FAILED, error={"x": 1}) is None


def test_inserting_a_claimed_step(store: WorkflowStore) -> None:
    run = _run(store, wake_at=timezone.now())
    stored = store.insert_claimed(_new(run), lease_ms=5_000, worker="w", park_wakes=0)
    assert stored is not None
    step_id, as_stored, token = stored
    assert as_stored == {"n": 1}
    row = WorkflowStep.objects.using(store.using).get(id=step_id)
    assert (row.status, row.attempt, row.retries, row.retry_delay) == ("running", 1, 2, 0.5)
    assert row.claim_token == token > 0
    assert WorkflowRun.objects.using(store.using).get(id=run.id).wake_at is None  # parked
    assert store.insert_claimed(_new(run), lease_ms=5_000, worker="w", park_wakes=0) is None
    stopped = _run(store, status=RunStatus.CANCELLED)
    assert store.insert_claimed(_new(stopped), lease_ms=5_000, worker="w", park_wakes=0) is None


def test_inserting_a_settled_step(store: WorkflowStore) -> None:
    run = _run(store)
    started = timezone.now() - timedelta(seconds=3)

    def insert(target: WorkflowRun) -> Any:
        return store.insert_settled(
            _new(target),
            status=StepStatus.SUCCEEDED,
            result=[1, "x"],
            error=None,
            available_at=None,
            worker="w",
            started_at=started,
        )

    stored = insert(run)
    assert stored is not None
    assert stored[1] == [1, "x"]
    attempt = StepAttempt.objects.using(store.using).get(step_id=stored[0])
    assert (attempt.status, attempt.started_at, attempt.worker) == ("succeeded", started, "w")
    assert insert(run) is None
    assert insert(_run(store, status=RunStatus.COMPLETED)) is None


def test_creating_runs_links_a_taken_key_to_its_run(store: WorkflowStore) -> None:
    existing = _run(store, idempotency_key="k1")
    wake = timezone.now()
    with store.atomic():
        ids = store.create_runs(
            [NewRun("wf", {"a": 1}, "k1"), NewRun("wf", None, "k2"), NewRun("wf", 3)], wake
        )
    assert ids[0] == existing.id
    made = WorkflowRun.objects.using(store.using).in_bulk(ids[1:])
    assert {(r.idempotency_key, r.input, r.status) for r in made.values()} == {
        ("k2", None, "running"),
        (None, 3, "running"),
    }
    assert all(r.wake_at == wake and not r.inline for r in made.values())


def test_creating_runs_keeps_each_ones_options_and_a_repeated_key_shares_a_run(
    store: WorkflowStore,
) -> None:
    wake = timezone.now()
    later = wake + timedelta(hours=1)
    runs = [
        NewRun("wf", 1, "same"),
        NewRun("wf", 2, options=RunOptions(priority=5, queue="q", start_at=later)),
        NewRun("wf", 3, "same"),
        NewRun("wf", 4, options=RunOptions(concurrency_key="c", concurrency_limit=2)),
    ]
    with store.atomic():
        ids = store.create_runs(runs, wake)
    assert ids[0] == ids[2]
    assert len(set(ids)) == 3
    made = WorkflowRun.objects.using(store.using).in_bulk(ids)
    rows = [made[i] for i in ids]
    assert [r.input for r in rows] == [1, 2, 1, 4]
    assert [r.wake_at for r in rows] == [wake, later, wake, None]
    assert (rows[1].priority, rows[1].queue, rows[1].start_at) == (5, "q", later)
    assert [(r.concurrency_key, r.key_waiting) for r in rows] == [
        (None, False),
        (None, False),
        (None, False),
        ("c", True),
    ]
    assert rows[3].concurrency_limit == 2
    # An intake's run is stored alone: no opening step, no first step found ahead.
    assert not WorkflowStep.objects.using(store.using).filter(run_id__in=ids).exists()
    assert all(r.first_step is None and r.status == "running" for r in rows)


def test_finishing_a_run_in_one_statement_leaves_a_waiting_parent_to_the_caller(
    store: WorkflowStore,
) -> None:
    child = _run(store)
    parent = _run(store)
    _step(store, parent, kind="child", status=StepStatus.RUNNING, child_run=child)
    alone = _run(store)
    assert store.finish_run(child.id, RunStatus.COMPLETED, 1, None) is None
    assert WorkflowRun.objects.using(store.using).get(id=child.id).status == "running"
    changed = store.finish_run(alone.id, RunStatus.COMPLETED, {"ok": True}, None)
    if changed is not None:  # the store ends such a run itself
        assert changed
        row = WorkflowRun.objects.using(store.using).get(id=alone.id)
        assert (row.status, row.output) == ("completed", {"ok": True})
        assert store.finish_run(alone.id, RunStatus.FAILED, None, None) is False


def test_what_falls_due_next(store: WorkflowStore) -> None:
    now = timezone.now()
    assert store.next_due(now, []) == store.next_due(now, []).__class__(None, None, None)
    run = _run(store, wake_at=now + timedelta(seconds=30))
    _step(store, run, "later", status="scheduled", available_at=now + timedelta(seconds=20))
    _step(store, run, "spent", status="failed", attempt=9, retries=1, available_at=now)
    lease = store_now_ms(store.using) + 10_000
    _step(store, run, "held", status="running", attempt=1, lease_expires_at=lease)
    due = store.next_due(now, [])
    assert due.step_due == now + timedelta(seconds=20)
    assert due.run_due == now + timedelta(seconds=30)
    assert due.lapse_in_ms is not None
    assert 0 < due.lapse_in_ms <= 10_000
    assert store.next_due(now, ["mail"]).step_due is None
    assert store.next_due_of([run.id]) == now + timedelta(seconds=20)


def test_the_stalled_sweep_wakes_only_runs_with_nothing_in_flight(store: WorkflowStore) -> None:
    now = timezone.now()
    old = now - timedelta(seconds=600)
    stalled = _run(store)
    _step(store, stalled, status="succeeded")
    flying = _run(store)
    _step(store, flying, status="scheduled", available_at=now)
    parked = _run(store)
    _step(store, parked, status="running", lease_expires_at=None)
    lapsed = _run(store)
    _step(store, lapsed, status="running", lease_expires_at=1)
    recent = _run(store)
    due = _run(store, wake_at=now)
    runs = WorkflowRun.objects.using(store.using)
    runs.exclude(id=recent.id).update(updated_at=old)
    found = set(store.stalled_runs(now - timedelta(seconds=300), 100))
    assert found == {stalled.id, lapsed.id}
    assert due.id not in found
    assert flying.id not in found
    assert parked.id not in found


def test_work_pending_sees_due_runs_and_steps(store: WorkflowStore) -> None:
    now = timezone.now()
    assert not store.work_pending(now, [])
    run = _run(store, wake_at=now + timedelta(seconds=5))
    assert store.work_pending(now + timedelta(seconds=10), [])
    assert not store.work_pending(now, [])
    _step(store, run, status="running", lease_expires_at=1)
    assert store.work_pending(now, [])
    assert not store.work_pending(now, ["mail"])
