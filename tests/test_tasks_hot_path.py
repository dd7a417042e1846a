"""A task run's hot path: its step is stored with the run at enqueue time (on PostgreSQL
in one statement), a worker claims that step straight from the queue, and the step's
success completes the run in the statement that records it, with no pass before or
after it. Failures, retries and cancelled runs still go the usual way."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from pikku_django import signals
from pikku_django.models import (
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.wakeups import announcing as announce
from pikku_django.workflows.api import get_engine, reset_engine
from pikku_django.workflows.engine import Wake
from tests import test_tasks_defs as defs
from tests.conftest import database_alias, on_databases

ALL = ("sqlite", "postgres", "mariadb")


@pytest.fixture
def alias(vendor: str, settings: Any) -> Iterator[str]:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "LEASE_BACKEND": "memory"}
    reset_engine()
    yield alias
    reset_engine()


class Received:
    """The engine's run signals received: (signal name, run id, status)."""

    NAMES = ("run_pass_started", "run_finished")

    def __init__(self) -> None:
        self.got: list[tuple[str, Any, Any]] = []

    def __enter__(self) -> Received:
        for name in self.NAMES:
            signals.ALL_SIGNALS[name].connect(
                self._receiver(name), weak=False, dispatch_uid=("hot-path", name)
            )
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.NAMES:
            signals.ALL_SIGNALS[name].disconnect(dispatch_uid=("hot-path", name))

    def _receiver(self, name: str) -> Any:
        def receive(sender: Any, **kwargs: Any) -> None:
            self.got.append((name, kwargs.get("run_id"), kwargs.get("status")))

        return receive

    def of(self, name: str) -> list[tuple[str, Any, Any]]:
        return [g for g in self.got if g[0] == name]


@pytest.mark.django_db(databases=["default", "postgres"], transaction=True)
def test_an_enqueue_in_autocommit_is_one_statement_on_postgresql(settings: Any) -> None:
    alias = database_alias("postgres")
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "LEASE_BACKEND": "memory"}
    reset_engine()
    try:
        defs.add.enqueue(0)  # imports and prepares what a first enqueue needs
        # The first write of an announcement window announces itself in its statement
        # (the writes after it in the window are announced after they commit).
        time.sleep(announce.WINDOW * 3)
        connection = connections[alias]
        assert not connection.in_atomic_block
        with CaptureQueriesContext(connection) as queries:
            result = defs.add.enqueue(1, 2)
        statements = [q["sql"] for q in queries.captured_queries]
        assert len(statements) == 1, statements
        assert "pg_notify" in statements[0]
        assert "BEGIN" not in statements[0].upper().split()
        run = WorkflowRun.objects.using(alias).get(id=result.id)
        step = WorkflowStep.objects.using(alias).get(run_id=run.id)
        assert (step.name, step.kind, step.status) == ("task", StepKind.QUEUED, "scheduled")
        assert run.wake_at is None  # no pass is due: a worker claims the step
    finally:
        reset_engine()


@on_databases(*ALL)
def test_an_enqueue_in_a_rolled_back_atomic_leaves_nothing(vendor: str, alias: str) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        dropped = defs.add.enqueue(1)
        assert WorkflowStep.objects.using(alias).filter(run_id=dropped.id).count() == 1
        raise RuntimeError("roll back")
    assert not WorkflowRun.objects.using(alias).filter(id=dropped.id).exists()
    assert not WorkflowStep.objects.using(alias).filter(run_id=dropped.id).exists()
    assert get_engine().run_until_idle() == 0


@on_databases(*ALL)
def test_a_task_completes_in_its_steps_settle_without_a_pass(vendor: str, alias: str) -> None:
    with Received() as received:
        result = defs.add.enqueue(2, 3)
        assert get_engine().run_until_idle() == 1  # one unit: the step, no pass
    run = WorkflowRun.objects.using(alias).get(id=result.id)
    assert (run.status, run.output, run.wake_at) == (RunStatus.COMPLETED, 5, None)
    step = WorkflowStep.objects.using(alias).get(run_id=run.id)
    assert (step.status, step.attempt, step.result) == (StepStatus.SUCCEEDED, 1, 5)
    assert received.of("run_pass_started") == []
    assert received.of("run_finished") == [("run_finished", run.id, RunStatus.COMPLETED)]
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        5,
        1,
    )


@on_databases(*ALL)
def test_a_first_attempt_reads_nothing_and_sees_what_its_result_later_says(
    vendor: str, alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first attempt's task, context and signals come from its step and its claim,
    with the worker and start its attempt row records; a later attempt reads them."""
    from pikku_django.tasks import compat
    from pikku_django.tasks.results import TaskRunState

    loads: list[Any] = []
    load = TaskRunState.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        TaskRunState, "load", classmethod(lambda cls, i: loads.append(i) or load(cls, i))
    )
    started: list[Any] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        started.append((str(task_result.status), task_result))

    compat.task_started.connect(receive, weak=False, dispatch_uid="first-attempt")
    try:
        for fail_first in (False, True):
            started.clear()
            result = defs.attempt_of.enqueue(fail_first=fail_first)
            get_engine().run_until_idle()
            read = loads.count(result.id)
            result.refresh()
            assert result.status == TaskResultStatus.SUCCESSFUL
            assert result.return_value["attempt"] == (2 if fail_first else 1)
            status, first = started[0]
            assert (first.id, status) == (result.id, TaskResultStatus.RUNNING)
            assert first.enqueued_at == result.enqueued_at
            assert first.started_at == result.started_at
            assert first.worker_ids == result.worker_ids[:1]
            assert first.args == []
            assert first.kwargs == {"fail_first": fail_first}
            if fail_first:
                # The failure asks whether attempts are left; the retry reads its history.
                assert read == 2
                assert started[1][1].worker_ids == result.worker_ids
                assert started[1][1].started_at == result.started_at
            else:
                assert read == 0
    finally:
        compat.task_started.disconnect(dispatch_uid="first-attempt")


@on_databases(*ALL)
def test_a_task_that_fails_for_good_fails_its_run_through_a_pass(vendor: str, alias: str) -> None:
    with Received() as received:
        result = defs.fail.enqueue("no")  # retries 1, retry_delay 0 (the OPTIONS)
        get_engine().run_until_idle()
    run = WorkflowRun.objects.using(alias).get(id=result.id)
    assert run.status == RunStatus.FAILED
    assert received.of("run_pass_started")  # the failure's pass failed the run
    assert received.of("run_finished") == [("run_finished", run.id, RunStatus.FAILED)]


@on_databases(*ALL)
def test_a_cancelled_task_is_never_claimed(vendor: str, alias: str) -> None:
    from pikku_django.workflows.api import cancel_workflow

    result = defs.add.enqueue(1)
    cancel_workflow(result.id)
    assert get_engine().run_until_idle() == 0
    step = WorkflowStep.objects.using(alias).get(run_id=result.id)
    assert step.status == StepStatus.SCHEDULED
    assert not StepAttempt.objects.using(alias).filter(step=step).exists()


def _claimed_step(alias: str) -> tuple[WorkflowRun, WorkflowStep]:
    """A running run of a task workflow whose step is claimed as attempt 1."""
    result = defs.add.enqueue(1)
    claimed = get_engine().claim_due_steps()
    assert [c.run_id for c in claimed] == [uuid.UUID(result.id)]
    run = WorkflowRun.objects.using(alias).get(id=result.id)
    return run, WorkflowStep.objects.using(alias).get(run_id=run.id)


@on_databases(*ALL)
def test_ending_a_run_in_the_settle_wakes_it_instead_while_a_parent_waits(
    vendor: str, alias: str
) -> None:
    run, step = _claimed_step(alias)
    parent = WorkflowRun.objects.using(alias).create(workflow="parent", wake_at=None)
    WorkflowStep.objects.using(alias).create(
        run=parent,
        name="child",
        kind=StepKind.CHILD,
        function=run.workflow,
        status=StepStatus.RUNNING,
        attempt=1,
        child_run=run,
    )
    settled = get_engine().store.settle(step.id, 1, StepStatus.SUCCEEDED, result=7, wake=Wake.END)
    assert settled is not None
    assert not settled.ended
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # a pass ends it, settling the parent's step
    assert run.wake_at is not None
    assert run.wakes == 1


@on_databases(*ALL)
def test_ending_a_run_in_the_settle_is_fenced_by_the_attempt(vendor: str, alias: str) -> None:
    run, step = _claimed_step(alias)
    store = get_engine().store
    assert store.settle(step.id, 2, StepStatus.SUCCEEDED, result=7, wake=Wake.END) is None
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    settled = store.settle(step.id, 1, StepStatus.SUCCEEDED, result=7, wake=Wake.END)
    assert settled is not None
    assert settled.ended
    run.refresh_from_db()
    assert (run.status, run.output, run.wake_at) == (RunStatus.COMPLETED, 7, None)


@on_databases(*ALL)
def test_a_settle_does_not_end_a_run_that_was_cancelled(vendor: str, alias: str) -> None:
    run, step = _claimed_step(alias)
    WorkflowRun.objects.using(alias).filter(id=run.id).update(status=RunStatus.CANCELLED)
    settled = get_engine().store.settle(step.id, 1, StepStatus.SUCCEEDED, result=7, wake=Wake.END)
    assert settled is not None
    assert not settled.ended
    run.refresh_from_db()
    assert (run.status, run.output) == (RunStatus.CANCELLED, None)


@pytest.mark.django_db(databases=["default", "postgres"], transaction=True)
def test_run_ends_are_announced_by_the_statement_that_ends_them(settings: Any) -> None:
    """A task completed in its step's settle, and a failed one ended by its pass, are
    each announced once on the run-end channel, and by no statement of their own."""
    import psycopg

    from pikku_django.wakeups import RUN_DONE_CHANNEL

    alias = database_alias("postgres")
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "LEASE_BACKEND": "memory"}
    reset_engine()
    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    listener = psycopg.connect(**params, autocommit=True)
    try:
        listener.execute(f"LISTEN {RUN_DONE_CHANNEL}")
        done, failed = defs.add.enqueue(1), defs.fail_once_only.enqueue()
        with CaptureQueriesContext(connections[alias]) as queries:
            get_engine().run_until_idle()
        # Other notifies (a freed concurrency key's, say) are not the run end's.
        alone = [
            q["sql"]
            for q in queries.captured_queries
            if q["sql"].startswith("SELECT pg_") and RUN_DONE_CHANNEL in q["sql"]
        ]
        assert alone == []
        heard = [n.payload for n in listener.notifies(timeout=60, stop_after=2)]
        assert sorted(heard) == sorted([done.id, failed.id])
        statuses = {r.id: r.status for r in WorkflowRun.objects.using(alias)}
        assert statuses[uuid.UUID(done.id)] == RunStatus.COMPLETED
        assert statuses[uuid.UUID(failed.id)] == RunStatus.FAILED
    finally:
        listener.close()
        reset_engine()


@pytest.mark.django_db(databases=["default", "postgres"], transaction=True)
def test_a_fresh_step_is_claimed_in_one_statement_with_its_queues_lease(settings: Any) -> None:
    """On PostgreSQL: a claim told it is busy claims a task's step in one statement (a
    claim that is not looks first), as attempt 1 under its queue's lease."""
    from pikku_django.dbclock import store_now_ms

    alias = database_alias("postgres")
    settings.PIKKU = {
        "WORKFLOW_DATABASE": alias,
        "LEASE_BACKEND": "memory",
        "QUEUE_LEASE_MS": {"emails": 5_000},
    }
    reset_engine()
    try:
        engine = get_engine()
        first, second = defs.send_email.enqueue("a@example.com"), defs.add.enqueue(1)
        with CaptureQueriesContext(connections[alias]) as busy:
            [claimed] = engine.claim_due_steps(busy=True)
        with CaptureQueriesContext(connections[alias]) as looked:
            [other] = engine.claim_due_steps()
        assert (len(busy.captured_queries), len(looked.captured_queries)) == (1, 2)
        assert [str(claimed.run_id), str(other.run_id)] == [first.id, second.id]
        assert (claimed.attempt, claimed.lease_ms, claimed.queue) == (1, 5_000, "emails")
        assert other.lease_ms == engine.config.step_lease_ms
        step = WorkflowStep.objects.using(alias).get(id=claimed.step_id)
        assert step.status == StepStatus.RUNNING
        assert 0 < step.lease_expires_at - store_now_ms(alias) <= 5_000
        [attempt] = StepAttempt.objects.using(alias).filter(step=step)
        assert (attempt.attempt, attempt.status) == (1, StepStatus.RUNNING)
        assert engine.claim_due_steps(busy=True) == []
    finally:
        reset_engine()
