"""Timeouts on SQLite, PostgreSQL and MariaDB: a step's attempt past its timeout,
a run past its deadline, a suspension past its timeout, and sleeping until a time.

Step timeouts are judged on real time (an attempt's lease is the store's clock);
the rest run on a FakeClock that the tests move.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.urls import reverse

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import (
    AttemptStatus,
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
)
from pikku_django.workflows import (
    FakeClock,
    StepFailedError,
    StepOutcome,
    SuspendTimeoutError,
    WorkflowContext,
    WorkflowEngine,
    step,
    workflow,
)
from pikku_django.workflows.steps.step_lease import keep_step_lease
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, db_mark
from tests.factories import WorkflowRunFactory, WorkflowStepFactory

VENDORS = ("sqlite", "postgres", "mariadb")

#: Released by a test to let a blocked step function return (late).
release = threading.Event()


@step(name="to_slow", timeout=0.3)
def to_slow(data: Any) -> str:
    time.sleep(0.6)
    return "late"


# Two seconds: its lease (capped at the timeout) is renewed every second, so a renewal
# that a busy machine delays by most of a second still keeps the lease to the deadline.
@step(name="to_blocked", timeout=2.0)
def to_blocked(data: Any) -> str:
    release.wait(30)
    return "done"


@step(name="to_echo")
def to_echo(data: Any) -> Any:
    return data


@workflow(name="to_retried")
def to_retried(ctx: WorkflowContext, inp: Any) -> Any:
    try:
        return ctx.do("slow", to_slow, inp, retries=1, retry_delay=0)
    except StepFailedError as failed:
        return {"failed": failed.error.get("code")}


@workflow(name="to_fenced")
def to_fenced(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("blocked", to_blocked, inp, retries=1, retry_delay=0)


@workflow(name="to_waits_on_a_step", timeout="1h")
def to_waits_on_a_step(ctx: WorkflowContext, inp: Any) -> Any:
    ctx.do("first", to_echo, 1)
    return ctx.do("never", to_echo, 2, queue="nobody-serves-this")


@workflow(name="to_child")
def to_child(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.suspend("waits for ever")


@workflow(name="to_parent")
def to_parent(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("child", "to_child", inp)


@workflow(name="to_approval")
def to_approval(ctx: WorkflowContext, inp: Any) -> Any:
    try:
        answer = ctx.suspend("approve", timeout="10min")
    except SuspendTimeoutError as exc:
        return {"timed_out": exc.code}
    return {"answer": answer}


@workflow(name="to_sleeps_until")
def to_sleeps_until(ctx: WorkflowContext, inp: Any) -> Any:
    ctx.sleep_until("first", datetime.fromisoformat(inp["first"]))
    ctx.sleep("second", until=datetime.fromisoformat(inp["second"]))
    return ctx.now().isoformat()


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine(alias: str, clock: FakeClock) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=clock)


@pytest.fixture
def real_engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService())


def _wait_for(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _attempts(engine: WorkflowEngine, run: WorkflowRun, name: str) -> list[StepAttempt]:
    return list(
        StepAttempt.objects.using(engine.using)
        .filter(step__run_id=run.id, step__name=name)
        .order_by("attempt")
    )


# -- step timeouts -----------------------------------------------------------------


def test_a_step_past_its_timeout_is_retried_then_fails(real_engine: WorkflowEngine) -> None:
    engine = real_engine
    run = engine.start(to_retried, "x")
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"failed": "STEP_TIMEOUT"}
    attempts = _attempts(engine, run, "slow")
    assert [a.status for a in attempts] == [StepStatus.FAILED, StepStatus.FAILED]
    assert [a.error["code"] for a in attempts] == ["STEP_TIMEOUT", "STEP_TIMEOUT"]
    assert all(a.result is None for a in attempts)  # the late "late" never landed
    assert "ran past its timeout of 0.3s" in attempts[0].error["message"]


def test_the_late_result_of_a_timed_out_attempt_is_fenced_off(
    real_engine: WorkflowEngine,
) -> None:
    engine = real_engine
    release.clear()
    run = engine.start(to_fenced, "block")
    engine.orchestrate(run.id)
    (first,) = engine.claim_due_steps(limit=1)
    assert first.attempt == 1
    assert first.lease_ms == 2000
    outcome: list[StepOutcome] = []

    def work() -> None:
        try:
            with keep_step_lease(engine, first):  # renewals never reach past the deadline
                outcome.append(engine.execute_step(first))
        finally:
            connections.close_all()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        # Once its lease lapses at the deadline, a claim closes the attempt as timed
        # out and its retry policy gives the step a second attempt.
        second = _wait_for(lambda: engine.claim_due_steps(limit=1), 30, "the timed-out claim")
        if not second:  # the first claim timed the attempt out; the next takes the retry
            second = _wait_for(lambda: engine.claim_due_steps(limit=1), 30, "the retry")
    finally:
        release.set()
        worker.join(30)
    assert outcome == [StepOutcome.SUPERSEDED]  # the late result was refused
    (retry,) = second
    assert retry.attempt == 2
    attempts = _attempts(engine, run, "blocked")
    assert attempts[0].status == StepStatus.FAILED
    assert attempts[0].error["code"] == "STEP_TIMEOUT"
    assert attempts[0].result is None
    assert engine.execute_step(retry) == StepOutcome.SUCCEEDED  # in time, it lands
    assert [a.result for a in _attempts(engine, run, "blocked")] == [None, "done"]
    engine.run_until_idle()
    assert engine.get_run(run.id).output == "done"


def test_a_step_timeout_is_given_per_call_and_checked(engine: WorkflowEngine) -> None:
    @workflow(name="to_bad_timeout")
    def bad(ctx: WorkflowContext, inp: Any) -> Any:
        return ctx.do("echo", to_echo, 1, timeout=-1)

    run = engine.start(bad)
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "timeout" in run.error["message"]
    with pytest.raises(ValueError, match="timeout"):
        step(name="to_never", timeout="soon")(to_echo)


# -- run deadlines ------------------------------------------------------------------


def test_a_run_past_its_deadline_fails_and_its_waiting_step_is_cancelled(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    run = engine.start(to_waits_on_a_step)
    assert run.deadline_at == clock.now() + timedelta(hours=1)
    engine.run_until_idle(["default"])
    waiting = engine.steps().get(run_id=run.id, name="never")
    assert waiting.status == StepStatus.SCHEDULED
    clock.advance(timedelta(minutes=59))
    assert engine.deadlines.enforce() == 0
    clock.advance(timedelta(minutes=1))
    assert engine.deadlines.has_due()
    engine.run_until_idle(["default"])  # the workers' due-work look enforces it
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "RUN_TIMEOUT"
    waiting.refresh_from_db()
    assert waiting.status == StepStatus.FAILED
    assert waiting.error["code"] == "RUN_TIMEOUT"
    assert engine.steps().get(run_id=run.id, name="first").status == StepStatus.SUCCEEDED
    assert engine.claim_due_steps(["nobody-serves-this"], limit=5) == []
    assert not engine.deadlines.has_due()


def test_a_run_failed_by_its_deadline_is_retried_without_it(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    run = engine.start(to_waits_on_a_step)
    engine.run_until_idle(["default"])
    clock.advance(timedelta(hours=2))
    assert engine.deadlines.enforce() == 1
    never = engine.steps().get(run_id=run.id, name="never")
    assert never.attempt >= never.attempts_allowed  # no attempt left while it is failed
    engine.retry(run.id)
    assert engine.get_run(run.id).deadline_at is None  # past: dropped, or it would fail again
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == 2


def test_a_deadline_cancels_the_child_runs_and_refuses_a_running_steps_result(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    parent = engine.start(to_parent, "x", deadline=clock.now() + timedelta(minutes=5))
    engine.run_until_idle()
    child_step = engine.steps().get(run_id=parent.id, name="child")
    child = engine.get_run(child_step.child_run_id)
    assert child.status == RunStatus.SUSPENDED
    # A step of its own in flight: a worker holds it when the deadline passes.
    release.set()  # its function returns at once, but too late for the deadline
    fenced = engine.start(to_fenced, "x", timeout="5min")
    engine.orchestrate(fenced.id)
    (claimed,) = engine.claim_due_steps(limit=1)
    clock.advance(timedelta(minutes=6))
    assert engine.deadlines.enforce() == 2
    parent.refresh_from_db()
    assert parent.status == RunStatus.FAILED
    assert parent.error["code"] == "RUN_TIMEOUT"
    assert engine.get_run(child.id).status == RunStatus.CANCELLED
    assert engine.steps().get(id=child_step.id).status == StepStatus.FAILED
    assert engine.execute_step(claimed) == StepOutcome.SUPERSEDED
    held = engine.steps().get(id=claimed.step_id)
    assert held.status == StepStatus.FAILED
    assert held.result is None
    assert engine.get_run(fenced.id).status == RunStatus.FAILED


def test_a_run_that_ends_in_time_keeps_its_outcome(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    done = engine.start("to_approval", None, timeout="1h")
    engine.run_until_idle()
    engine.resume(done.id, "yes")
    engine.run_until_idle()
    clock.advance(timedelta(hours=2))
    assert engine.deadlines.enforce() == 0
    assert engine.get_run(done.id).status == RunStatus.COMPLETED
    assert engine.get_run(done.id).output == {"answer": "yes"}


def test_bad_deadlines_are_refused_and_start_nothing(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    before = engine.runs().count()
    with pytest.raises(ValueError, match="not both"):
        engine.start(to_parent, None, deadline=clock.now(), timeout=5)
    with pytest.raises(ValueError, match="timezone-aware"):
        engine.start(to_parent, None, deadline=datetime(2030, 1, 1))
    with pytest.raises(TypeError, match="deadline"):
        engine.start(to_parent, None, deadline="tomorrow")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="more than 0"):
        engine.start(to_parent, None, timeout=0)
    assert engine.runs().count() == before


# -- suspension timeouts and sleeping until ----------------------------------------------


def test_a_suspension_past_its_timeout_raises_in_the_workflow(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    run = engine.start(to_approval)
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    clock.advance(timedelta(minutes=9))
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.SUSPENDED
    clock.advance(timedelta(minutes=1))
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"timed_out": "SUSPEND_TIMEOUT"}
    suspension = engine.steps().get(run_id=run.id, kind=StepKind.SUSPEND)
    assert suspension.status == StepStatus.FAILED


def test_a_suspension_resumed_in_time_is_not_timed_out(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    run = engine.start(to_approval)
    engine.run_until_idle()
    clock.advance(timedelta(minutes=5))
    engine.resume(run.id, {"ok": True})
    engine.run_until_idle()
    clock.advance(timedelta(hours=1))
    assert engine.deadlines.enforce() == 0
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.output == {"answer": {"ok": True}}


def test_sleep_until_a_time(engine: WorkflowEngine, clock: FakeClock) -> None:
    start = clock.now()
    first, second = start + timedelta(hours=3), start + timedelta(hours=5)
    run = engine.start(to_sleeps_until, {"first": first.isoformat(), "second": second.isoformat()})
    engine.run_until_idle()
    assert engine.get_run(run.id).wake_at == first
    clock.advance(first - clock.now() - timedelta(seconds=1))
    assert engine.claim_due_runs(5) == []
    clock.advance(timedelta(seconds=1))
    engine.run_until_idle()
    assert engine.get_run(run.id).wake_at == second
    clock.advance(second - clock.now())
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == second.isoformat()


def test_sleep_until_a_past_time_returns_at_once(engine: WorkflowEngine, clock: FakeClock) -> None:
    past = datetime(2000, 1, 1, tzinfo=UTC).isoformat()
    run = engine.start(to_sleeps_until, {"first": past, "second": past})
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED


# -- under a worker --------------------------------------------------------------------


def test_a_worker_retries_a_timed_out_step_and_enforces_a_deadline(
    real_engine: WorkflowEngine,
) -> None:
    engine = real_engine
    retried = engine.start(to_retried, "x")
    suspended = engine.start(to_child, None, timeout=1)
    worker = Worker(engine, concurrency=2, poll_interval=0.1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        _wait_for(
            lambda: engine.get_run(suspended.id).status == RunStatus.FAILED, 30, "the deadline"
        )
        _wait_for(lambda: engine.get_run(retried.id).is_terminal, 30, "the timed-out step")
    finally:
        worker.stop()
        thread.join(60)
    assert engine.get_run(suspended.id).error["code"] == "RUN_TIMEOUT"
    assert engine.get_run(retried.id).output == {"failed": "STEP_TIMEOUT"}
    # Attempt 1's lease ends at its timeout: a worker may reclaim the step (superseding
    # the attempt) before the timeout is recorded on it, as happens under load.
    first, last = _attempts(engine, retried, "slow")
    assert (first.error or {}).get("code") == "STEP_TIMEOUT" or (
        first.status == AttemptStatus.SUPERSEDED
    )
    assert last.error["code"] == "STEP_TIMEOUT"


@pytest.mark.django_db
def test_the_admin_shows_a_runs_deadline_and_a_steps_timeout(admin_client: Any) -> None:
    run = WorkflowRunFactory(deadline_at=datetime(2030, 1, 2, 3, 4, tzinfo=UTC))
    step_row = WorkflowStepFactory(run=run, timeout=12.5)
    page = admin_client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Deadline" in text
    assert "2030" in text
    page = admin_client.get(reverse("admin:pikku_django_workflowstep_change", args=[step_row.pk]))
    assert page.status_code == 200
    assert "Timeout (s)" in page.content.decode()
    assert "12.5" in page.content.decode()


@workflow(name="to_quick_child", timeout="10min")
def to_quick_child(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.suspend("waits")


@workflow(name="to_parent_of_quick")
def to_parent_of_quick(ctx: WorkflowContext, inp: Any) -> Any:
    try:
        return ctx.do("child", "to_quick_child", inp)
    except StepFailedError as failed:
        return {"child": failed.error.get("code")}


def test_a_child_run_gets_its_workflows_timeout_and_its_parent_the_failure(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    parent = engine.start(to_parent_of_quick)
    engine.run_until_idle()
    child = engine.get_run(engine.steps().get(run_id=parent.id, name="child").child_run_id)
    assert child.deadline_at == clock.now() + timedelta(minutes=10)
    clock.advance(timedelta(minutes=10))
    engine.run_until_idle()
    assert engine.get_run(child.id).status == RunStatus.FAILED
    parent.refresh_from_db()
    assert parent.status == RunStatus.COMPLETED, parent.error
    assert parent.output == {"child": "RUN_TIMEOUT"}
