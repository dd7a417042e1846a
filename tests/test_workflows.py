"""The workflow engine, driven in-process on SQLite, PostgreSQL and MariaDB.

Every test runs once per database. Time is a :class:`FakeClock`: retries,
backoff and sleeps are checked by moving it, never by waiting.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from pikku_django.dbclock import store_now_ms
from pikku_django.leases import InMemoryLeaseService
from pikku_django.leases.database import DatabaseLeaseService
from pikku_django.models import (
    AttemptStatus,
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows import (
    FakeClock,
    NotSerializableError,
    WorkflowEngine,
    WorkflowNotFoundError,
    WorkflowRunNotFoundError,
    WorkflowRunStateError,
    WorkflowStepSupersededError,
    registry,
    step,
    workflow,
)
from pikku_django.workflows.durations import parse_duration
from tests import workflow_defs as defs
from tests.conftest import database_alias, db_mark, fresh_database_lease_service
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory
from tests.workflow_defs import CALLS

VENDORS = ("sqlite", "postgres", "mariadb")
STEP_FAILED = "pikku_django.workflows.errors.StepFailedError"


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    """The database alias of this test's vendor (committed data: threads see it)."""
    return database_alias(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine(alias: str, clock: FakeClock) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=clock)


@pytest.fixture
def tag() -> str:
    """Keys this test's calls in CALLS."""
    return uuid.uuid4().hex


# -- helpers ------------------------------------------------------------------------


def fetch(engine: WorkflowEngine, run: WorkflowRun | uuid.UUID) -> WorkflowRun:
    return engine.get_run(run.id if isinstance(run, WorkflowRun) else run)


def steps_of(engine: WorkflowEngine, run: WorkflowRun | uuid.UUID) -> dict[str, WorkflowStep]:
    run_id = run.id if isinstance(run, WorkflowRun) else run
    return {s.name: s for s in engine.steps().filter(run_id=run_id).order_by("id")}


def attempts_of(engine: WorkflowEngine, step_row: WorkflowStep) -> list[StepAttempt]:
    return list(engine.attempts().filter(step_id=step_row.id).order_by("attempt"))


def one_pass(engine: WorkflowEngine) -> uuid.UUID:
    """Claim the one due run and give it a single orchestration pass."""
    [run_id] = engine.claim_due_runs(1)
    engine.orchestrate(run_id)
    return run_id


def at(clock: FakeClock, seconds: float) -> datetime:
    return clock.now() + timedelta(seconds=seconds)


# -- 1. replay memoisation -------------------------------------------------------------


def test_each_step_runs_once_across_replays(
    engine: WorkflowEngine, clock: FakeClock, tag: str
) -> None:
    run = engine.start(defs.memo_wf, {"tag": tag})

    # A pass stops at the first step that is not settled.
    one_pass(engine)
    assert list(steps_of(engine, run)) == ["first"]
    assert steps_of(engine, run)["first"].status == StepStatus.SCHEDULED
    assert CALLS.for_tag(tag) == {("pass",): 1}

    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.RUNNING
    assert steps_of(engine, run)["nap"].status == StepStatus.SCHEDULED
    assert run.wake_at == at(clock, 300)

    clock.advance(300)
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"a": 2, "b": 3, "c": 30, "d": 31}

    calls = CALLS.for_tag(tag)
    passes = calls.pop(("pass",))
    assert passes >= 5  # replayed from the top after every settled step and the sleep
    assert calls == {
        ("add_one", 1): 1,
        ("add_one", 2): 1,
        ("times_ten",): 1,
        ("add_one", 30): 1,
    }
    steps = steps_of(engine, run)
    assert list(steps) == ["first", "second", "inline", "nap", "third"]
    assert {s.name: s.kind for s in steps.values()} == {
        "first": StepKind.QUEUED,
        "second": StepKind.QUEUED,
        "inline": StepKind.INLINE,
        "nap": StepKind.SLEEP,
        "third": StepKind.QUEUED,
    }
    assert all(s.status == StepStatus.SUCCEEDED for s in steps.values())
    for s in steps.values():
        assert [a.attempt for a in attempts_of(engine, s)] == [1], s.name

    # A settled run is not replayed again, and nothing is left to do.
    engine.orchestrate(run.id)
    assert engine.run_until_idle() == 0
    assert CALLS.count(tag, "pass") == passes


def test_repeated_step_names_are_numbered(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.repeats_wf, {"tag": tag})
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == [1, 2, 3, "inline"]
    steps = steps_of(engine, run)
    assert list(steps) == ["item", "item#1", "item#2", "pause", "pause#1", "item#3"]
    assert [steps[n].input["n"] for n in ("item", "item#1", "item#2")] == [0, 1, 2]
    assert steps["item#3"].kind == StepKind.INLINE

    # A name may not contain '#' itself: it would collide with the numbering.
    bad = engine.start(defs.hash_in_name_wf, {"tag": tag})
    engine.run_until_idle()
    bad = fetch(engine, bad)
    assert bad.status == RunStatus.FAILED
    assert "may not contain '#'" in bad.error["message"]


# -- 2. retries and backoff ----------------------------------------------------------------


def test_default_retries_are_five_with_one_history_row_per_attempt(
    engine: WorkflowEngine, clock: FakeClock, tag: str
) -> None:
    run = engine.start(defs.retrying_wf, {"tag": tag})
    for attempt in range(1, 7):
        engine.run_until_idle()
        assert CALLS.count(tag, "always_fails") == attempt
        flaky = steps_of(engine, run)["flaky"]
        assert (flaky.status, flaky.attempt) == (StepStatus.FAILED, attempt)
        if attempt < 6:
            assert fetch(engine, run).status == RunStatus.RUNNING
            assert flaky.available_at == at(clock, 1)  # STEP_RETRY_DELAY, fixed
            clock.advance(1)

    assert engine.run_until_idle() == 0
    assert CALLS.count(tag, "always_fails") == 6  # 1 attempt + 5 retries

    flaky = steps_of(engine, run)["flaky"]
    assert flaky.retries == 5
    assert flaky.error["type"] == "ValueError"
    assert flaky.error["message"] == f"boom {tag}"
    assert "in always_fails" in flaky.error["traceback"]
    history = attempts_of(engine, flaky)
    assert [a.attempt for a in history] == [1, 2, 3, 4, 5, 6]
    for row in history:
        assert row.status == StepStatus.FAILED
        assert row.error["type"] == "ValueError"
        assert row.error["message"] == f"boom {tag}"
        assert row.finished_at is not None

    run = fetch(engine, run)
    assert run.status == RunStatus.FAILED
    assert run.output is None
    assert run.error["type"] == STEP_FAILED
    assert run.error["message"] == f"Step 'flaky' failed: ValueError: boom {tag}"
    assert "Traceback" in run.error["traceback"]
    assert "StepFailedError" in run.error["traceback"]


@pytest.mark.parametrize(
    ("options", "delays"),
    [
        pytest.param({"retries": 2, "retry_delay": "30s"}, [30, 30], id="fixed"),
        pytest.param(
            {"retries": 3, "retry_delay": 10, "backoff": "exponential"},
            [10, 20, 40],
            id="exponential",
        ),
    ],
)
def test_a_retry_is_claimable_only_once_its_delay_has_passed(
    engine: WorkflowEngine,
    clock: FakeClock,
    tag: str,
    options: dict[str, Any],
    delays: list[float],
) -> None:
    run = engine.start(defs.retrying_wf, {"tag": tag, "options": options})
    engine.run_until_idle()  # the pass, and the first attempt
    for failed_attempt, delay in enumerate(delays, start=1):
        flaky = steps_of(engine, run)["flaky"]
        assert (flaky.status, flaky.attempt) == (StepStatus.FAILED, failed_attempt)
        assert flaky.available_at == at(clock, delay)

        clock.advance(delay - 0.5)
        assert engine.claim_due_steps() == []
        assert engine.claim_step(flaky.id) is None
        assert engine.run_until_idle() == 0
        assert CALLS.count(tag, "always_fails") == failed_attempt

        clock.advance(0.5)
        [claimed] = engine.claim_due_steps()
        assert claimed.attempt == failed_attempt + 1
        engine.execute_step(claimed)

    engine.run_until_idle()
    flaky = steps_of(engine, run)["flaky"]
    assert len(attempts_of(engine, flaky)) == len(delays) + 1
    run = fetch(engine, run)
    assert run.status == RunStatus.FAILED
    assert run.error["message"] == f"Step 'flaky' failed: ValueError: boom {tag}"


def test_a_step_that_recovers_keeps_its_failed_attempts(
    engine: WorkflowEngine, clock: FakeClock, tag: str
) -> None:
    run = engine.start(defs.recovering_wf, {"tag": tag, "failures": 2})
    for _ in range(3):
        engine.run_until_idle()
        clock.advance(1)
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == "ok after 3"
    history = attempts_of(engine, steps_of(engine, run)["flaky"])
    assert [(a.attempt, a.status) for a in history] == [
        (1, StepStatus.FAILED),
        (2, StepStatus.FAILED),
        (3, StepStatus.SUCCEEDED),
    ]
    assert history[0].error["message"] == "flaky attempt 1"
    assert history[2].result == "ok after 3"


def test_an_inline_step_retries_after_its_delay(
    engine: WorkflowEngine, clock: FakeClock, tag: str
) -> None:
    run = engine.start(defs.flaky_inline_wf, {"tag": tag})
    engine.run_until_idle()
    for failed_attempt, delay in ((1, 5), (2, 10)):
        flaky = steps_of(engine, run)["flaky"]
        assert (flaky.kind, flaky.status) == (StepKind.INLINE, StepStatus.FAILED)
        assert flaky.attempt == failed_attempt
        assert fetch(engine, run).wake_at == at(clock, delay)  # the run wakes for it
        clock.advance(delay - 0.5)
        assert engine.run_until_idle() == 0
        clock.advance(0.5)
        assert engine.run_until_idle() == 1
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == "ok after 3"
    history = attempts_of(engine, steps_of(engine, run)["flaky"])
    assert [(a.attempt, a.status) for a in history] == [
        (1, StepStatus.FAILED),
        (2, StepStatus.FAILED),
        (3, StepStatus.SUCCEEDED),
    ]


# -- 3. a sleep outlives a worker restart ------------------------------------------------


def test_a_sleep_outlives_a_worker_restart(alias: str, tag: str) -> None:
    clock = FakeClock()
    started = clock.now()
    leases = fresh_database_lease_service(alias)
    first = WorkflowEngine(alias, leases=leases, clock=clock)
    run = first.start(defs.nap_wf, {"tag": tag})
    first.run_until_idle()
    run = fetch(first, run)
    assert run.status == RunStatus.RUNNING
    nap = steps_of(first, run)["nap"]
    assert nap.status == StepStatus.SCHEDULED
    assert nap.available_at == started + timedelta(hours=1)
    assert run.wake_at == started + timedelta(hours=1)
    assert CALLS.count(tag, "record", "before") == 1

    # The worker goes away: its engine, lease service, clock and connection.
    del first
    leases.close()
    connections[alias].close()

    later = FakeClock(start=started + timedelta(minutes=59, seconds=59))
    leases = DatabaseLeaseService(alias)
    try:
        second = WorkflowEngine(alias, leases=leases, clock=later)
        assert second.run_until_idle() == 0  # not due yet
        assert CALLS.count(tag, "record", "after") == 0
        later.advance(1)
        assert second.run_until_idle() > 0
    finally:
        leases.close()
    run = fetch(second, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"before": {"recorded": "before"}, "after": {"recorded": "after"}}
    assert CALLS.for_tag(tag)[("record", "before")] == 1
    assert CALLS.for_tag(tag)[("record", "after")] == 1
    assert steps_of(second, run)["nap"].status == StepStatus.SUCCEEDED


# -- 4. suspend and resume -----------------------------------------------------------------


def test_suspend_and_resume_with_data(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.approval_wf, {"tag": tag})
    with pytest.raises(WorkflowRunStateError, match="not suspended"):
        engine.resume(run.id, {"too": "early"})

    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.SUSPENDED
    assert run.suspend_reason == "need approval"
    assert steps_of(engine, run)["suspend"].status == StepStatus.SUSPENDED

    # A suspended run takes no work and is not replayed.
    passes = CALLS.count(tag, "pass")
    assert engine.run_until_idle() == 0
    engine.orchestrate(run.id)
    assert CALLS.count(tag, "pass") == passes

    with pytest.raises(NotSerializableError):
        engine.resume(run.id, {"not json": {1, 2}})
    assert fetch(engine, run).status == RunStatus.SUSPENDED

    resumed = engine.resume(run.id, {"approved_by": "ann"})
    assert resumed.status == RunStatus.RUNNING
    assert resumed.suspend_reason == ""
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.SUSPENDED
    assert run.suspend_reason == "need a second look"
    assert list(steps_of(engine, run)) == ["suspend", "suspend#1"]

    engine.resume(str(run.id), [1, 2])
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"first": {"approved_by": "ann"}, "second": [1, 2]}
    assert steps_of(engine, run)["suspend"].result == {"approved_by": "ann"}

    with pytest.raises(WorkflowRunStateError, match="completed"):
        engine.resume(run.id, "again")
    with pytest.raises(WorkflowRunNotFoundError):
        engine.resume(uuid.uuid4(), None)


def test_resuming_a_run_that_is_not_suspended_raises(engine: WorkflowEngine, alias: str) -> None:
    for status in (RunStatus.RUNNING, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        run = WorkflowRunFactory(database=alias, status=status)
        with pytest.raises(WorkflowRunStateError, match=f"is {status}"):
            engine.resume(run.id, {"x": 1})
        assert fetch(engine, run).status == status


# -- 5. cancel --------------------------------------------------------------------------


def test_cancel_a_running_run_with_a_queued_step(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.one_step_wf, {"tag": tag})
    one_pass(engine)
    work = steps_of(engine, run)["work"]
    assert work.status == StepStatus.SCHEDULED

    cancelled = engine.cancel(run.id)
    assert cancelled.status == RunStatus.CANCELLED
    assert cancelled.wake_at is None

    # Its step is never claimed, by any route.
    assert engine.claim_due_steps() == []
    assert engine.claim_step(work.id) is None
    assert engine.claim_step_for_execution(run.id, "work", "wft_record", 60_000) is None
    assert engine.run_until_idle() == 0
    assert CALLS.count(tag, "record", "work") == 0
    assert steps_of(engine, run)["work"].status == StepStatus.SCHEDULED

    # Cancelling again is a no-op; a finished run cannot be cancelled.
    assert engine.cancel(run.id).status == RunStatus.CANCELLED
    done = engine.start(defs.one_step_wf, {"tag": tag})
    engine.run_until_idle()
    assert fetch(engine, done).status == RunStatus.COMPLETED
    with pytest.raises(WorkflowRunStateError, match="completed"):
        engine.cancel(done.id)
    assert fetch(engine, done).status == RunStatus.COMPLETED
    with pytest.raises(WorkflowRunNotFoundError):
        engine.cancel(uuid.uuid4())


def test_cancel_a_suspended_run_and_finished_ones(
    engine: WorkflowEngine, alias: str, tag: str
) -> None:
    run = engine.start(defs.approval_wf, {"tag": tag})
    engine.run_until_idle()
    assert fetch(engine, run).status == RunStatus.SUSPENDED
    assert engine.cancel(run.id).status == RunStatus.CANCELLED
    with pytest.raises(WorkflowRunStateError):
        engine.resume(run.id, "late")

    for status in (RunStatus.COMPLETED, RunStatus.FAILED):
        finished = WorkflowRunFactory(database=alias, status=status)
        with pytest.raises(WorkflowRunStateError, match=f"is {status}"):
            engine.cancel(finished.id)


def test_cancelling_a_parent_cancels_the_child_it_waits_for(
    engine: WorkflowEngine, tag: str
) -> None:
    run = engine.start(defs.parent_wf, {"tag": tag, "n": 1})
    one_pass(engine)
    child_step = steps_of(engine, run)["child"]
    assert child_step.kind == StepKind.CHILD
    assert child_step.child_run_id is not None

    engine.cancel(run.id)
    assert fetch(engine, child_step.child_run_id).status == RunStatus.CANCELLED
    assert engine.run_until_idle() == 0
    assert CALLS.for_tag(tag) == {}


# -- 6. child workflows --------------------------------------------------------------------


def test_a_child_workflows_output_reaches_its_parent(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.parent_wf, {"tag": tag, "n": 1})
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {
        "first": {"child_got": 1, "plus_one": 2},
        "second": {"child_got": 2, "plus_one": 3},
    }
    steps = steps_of(engine, run)
    assert list(steps) == ["child", "child#1"]
    for s in steps.values():
        assert (s.kind, s.function, s.status) == (
            StepKind.CHILD,
            "wft_child",
            StepStatus.SUCCEEDED,
        )
        child = fetch(engine, s.child_run_id)
        assert child.workflow == "wft_child"
        assert child.status == RunStatus.COMPLETED
        assert s.result == child.output
    assert CALLS.for_tag(tag) == {("add_one", 1): 1, ("add_one", 2): 1}


def test_a_failing_child_fails_the_parent_step(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.parent_of_failing_wf, {"tag": tag})
    engine.run_until_idle()

    child_step = steps_of(engine, run)["child"]
    child = fetch(engine, child_step.child_run_id)
    assert child.status == RunStatus.FAILED
    assert child.error["message"] == f"Step 'fails' failed: ValueError: boom {tag}"

    assert child_step.status == StepStatus.FAILED
    assert child_step.error == child.error
    assert CALLS.count(tag, "parent saw", STEP_FAILED) == 1

    run = fetch(engine, run)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == STEP_FAILED
    assert run.error["message"].startswith("Step 'child' failed:")
    assert f"boom {tag}" in run.error["message"]


# -- 7. on_error compensation ------------------------------------------------------------------


def test_on_error_compensation_runs_once_before_the_error_propagates(
    engine: WorkflowEngine, clock: FakeClock, tag: str
) -> None:
    run = engine.start(defs.compensated_wf, {"tag": tag})
    engine.run_until_idle()
    clock.advance(1)
    engine.run_until_idle()

    run = fetch(engine, run)
    assert run.status == RunStatus.FAILED
    assert run.error["message"] == f"Step 'charge' failed: ValueError: boom {tag}"
    steps = steps_of(engine, run)
    assert list(steps) == ["charge", "charge:on_error"]
    compensation = steps["charge:on_error"]
    assert compensation.status == StepStatus.SUCCEEDED
    assert compensation.result == "refunded"
    assert compensation.input["step"] == "charge"
    assert compensation.input["error"]["message"] == f"boom {tag}"

    log = [entry for entry in CALLS.log(tag) if entry != ("pass",)]
    assert log == [
        ("always_fails",),
        ("always_fails",),
        ("refund", "charge", "ValueError"),
        ("error reached the workflow",),
    ]
    # More passes find the run settled: the compensation never runs again.
    engine.orchestrate(run.id)
    assert engine.run_until_idle() == 0
    assert CALLS.count(tag, "refund", "charge", "ValueError") == 1


def test_inline_on_error_runs_while_the_run_is_still_running(
    engine: WorkflowEngine, tag: str
) -> None:
    run = engine.start(defs.compensated_inline_wf, {"tag": tag})
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.FAILED
    assert CALLS.for_tag(tag) == {
        ("always_fails",): 1,
        ("undo", "charge", RunStatus.RUNNING): 1,
    }
    assert steps_of(engine, run)["charge:on_error"].result == "undone"


# -- 8. idempotent start ------------------------------------------------------------------------


def test_idempotent_start(engine: WorkflowEngine, alias: str, tag: str) -> None:
    first = engine.start(defs.one_step_wf, {"tag": tag}, idempotency_key="order-1")
    again = engine.start("wft_one_step", {"tag": tag, "other": 1}, idempotency_key="order-1")
    assert again.id == first.id
    assert again.input == {"tag": tag}
    other_workflow = engine.start(defs.nap_wf, {"tag": tag}, idempotency_key="order-1")
    assert other_workflow.id != first.id
    other_key = engine.start(defs.one_step_wf, {"tag": tag}, idempotency_key="order-2")
    assert other_key.id != first.id
    no_key = engine.start(defs.one_step_wf, {"tag": tag})
    assert no_key.id not in (first.id, other_key.id)

    engine.run_until_idle()
    assert fetch(engine, first).status == RunStatus.COMPLETED
    after = engine.start(defs.one_step_wf, {"tag": tag}, idempotency_key="order-1")
    assert (after.id, after.status) == (first.id, RunStatus.COMPLETED)
    assert engine.runs().filter(idempotency_key="order-1").count() == 2

    with pytest.raises(ValueError, match="idempotency_key"):
        engine.start(defs.one_step_wf, {"tag": tag}, idempotency_key="")


def test_concurrent_idempotent_starts_make_one_run(engine: WorkflowEngine, tag: str) -> None:
    ids: list[uuid.UUID] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(5)

    def start() -> None:
        try:
            barrier.wait(60)
            ids.append(engine.start(defs.one_step_wf, {"tag": tag}, idempotency_key="once").id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(ids) == 5
    assert len(set(ids)) == 1
    assert engine.runs().filter(idempotency_key="once").count() == 1


# -- 9. inline mode --------------------------------------------------------------------------


def test_inline_run_finishes_in_process(engine: WorkflowEngine, clock: FakeClock, tag: str) -> None:
    started = clock.now()
    run = engine.start(defs.inline_everything_wf, {"tag": tag}, inline=True)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.inline
    assert run.output == {
        "queued": 2,
        "flaky": "ok after 3",
        "inline": "inline ok after 3",
        "child": {"child_got": 10, "plus_one": 11},
        "sleepy": {"child_got": 20, "plus_one": 21},
    }
    # Retry delays (30 s then 60 s exponential, 10 s twice), the 1 h sleep and
    # the child's 10 min sleep passed on the fake clock, in place.
    assert clock.now() - started == timedelta(seconds=30 + 60 + 10 + 10 + 3600 + 600)

    steps = steps_of(engine, run)
    assert steps["queued"].kind == StepKind.QUEUED
    assert len(attempts_of(engine, steps["flaky"])) == 3
    assert len(attempts_of(engine, steps["flaky_inline"])) == 3
    for name in ("child", "sleepy"):
        child = fetch(engine, steps[name].child_run_id)
        assert child.inline
        assert child.status == RunStatus.COMPLETED
    grandchild = steps_of(engine, steps["sleepy"].child_run_id)["grandchild"]
    assert fetch(engine, grandchild.child_run_id).inline
    assert CALLS.count(tag, "add_one", 1) == 1
    assert CALLS.count(tag, "add_one", 10) == 1
    assert CALLS.count(tag, "add_one", 20) == 1
    # Nothing is left for a worker.
    assert engine.run_until_idle() == 0


def test_inline_run_suspends_and_resumes_inline(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.approval_wf, {"tag": tag}, inline=True)
    assert (run.status, run.suspend_reason) == (RunStatus.SUSPENDED, "need approval")
    run = engine.resume(run.id, 1)
    assert (run.status, run.suspend_reason) == (RunStatus.SUSPENDED, "need a second look")
    run = engine.resume(run.id, 2)
    assert run.status == RunStatus.COMPLETED
    assert run.output == {"first": 1, "second": 2}


def test_resuming_an_inline_child_carries_its_parent_on(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.parent_of_approval_wf, {"tag": tag}, inline=True)
    assert run.status == RunStatus.RUNNING  # waiting on its suspended child
    child_id = steps_of(engine, run)["child"].child_run_id
    assert fetch(engine, child_id).status == RunStatus.SUSPENDED

    engine.resume(child_id, "yes")
    child = engine.resume(child_id, "yes again")
    assert child.id == child_id
    assert child.status == RunStatus.COMPLETED
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"first": "yes", "second": "yes again"}


def test_cancelling_an_inline_child_fails_its_parent(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.parent_of_approval_wf, {"tag": tag}, inline=True)
    child_id = steps_of(engine, run)["child"].child_run_id
    assert engine.cancel(child_id).status == RunStatus.CANCELLED
    run = fetch(engine, run)
    assert run.status == RunStatus.FAILED
    assert run.error["message"].startswith("Step 'child' failed: WorkflowCancelled: Child run")


# -- 10. an unregistered step function -------------------------------------------------------


def test_an_unregistered_step_function_suspends_the_run(engine: WorkflowEngine, tag: str) -> None:
    run = engine.start(defs.missing_function_wf, {"tag": tag, "function": "no_such_function"})
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.SUSPENDED
    assert run.suspend_reason.startswith("RPC_NOT_FOUND")
    assert "'no_such_function'" in run.suspend_reason
    x = steps_of(engine, run)["x"]
    assert x.status == StepStatus.SUSPENDED
    assert x.error["code"] == "RPC_NOT_FOUND"
    assert engine.run_until_idle() == 0


def test_a_function_deployed_later_runs_after_resume(engine: WorkflowEngine, tag: str) -> None:
    name = f"wft_late_{tag}"

    def late(data: dict[str, Any]) -> str:
        CALLS.hit(tag, "late", data["key"])
        return "arrived"

    run = engine.start(defs.missing_function_wf, {"tag": tag, "function": name})
    engine.run_until_idle()
    assert fetch(engine, run).suspend_reason.startswith("RPC_NOT_FOUND")

    step(name=name)(late)
    try:
        engine.resume(run.id)
        engine.run_until_idle()
    finally:
        registry.unregister(name)
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == "arrived"
    assert CALLS.for_tag(tag) == {("late", "late"): 1}


def test_a_function_missing_on_the_worker_suspends_the_run(
    engine: WorkflowEngine, tag: str
) -> None:
    name = f"wft_vanishing_{tag}"

    def vanishing(data: dict[str, Any]) -> str:
        CALLS.hit(tag, "vanishing")
        return "back"

    step(name=name)(vanishing)
    try:
        run = engine.start(defs.missing_function_wf, {"tag": tag, "function": name})
        one_pass(engine)
        assert steps_of(engine, run)["x"].status == StepStatus.SCHEDULED
        registry.unregister(name)  # the worker was deployed without it

        engine.run_until_idle()
        run = fetch(engine, run)
        assert run.status == RunStatus.SUSPENDED
        assert run.suspend_reason.startswith("RPC_NOT_FOUND")
        x = steps_of(engine, run)["x"]
        assert (x.status, x.attempt) == (StepStatus.SUSPENDED, 0)
        assert attempts_of(engine, x) == []  # no retry budget was spent

        step(name=name)(vanishing)
        engine.resume(run.id)
        engine.run_until_idle()
    finally:
        registry.unregister(name)
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == "back"
    assert CALLS.count(tag, "vanishing") == 1


# -- 11. non-serialisable results ---------------------------------------------------------------


def test_a_non_serialisable_result_fails_its_step_clearly(engine: WorkflowEngine, tag: str) -> None:
    bad = engine.start(defs.not_json_wf, {"tag": tag})
    bad_inline = engine.start(defs.not_json_inline_wf, {"tag": tag})
    bad_output = engine.start(defs.not_json_output_wf, {"tag": tag})
    good = engine.start(defs.one_step_wf, {"tag": tag})
    engine.run_until_idle()  # the engine carries on past the bad results

    bad_step = steps_of(engine, bad)["bad"]
    assert bad_step.status == StepStatus.FAILED
    assert bad_step.attempt == 1  # not retried: it would fail the same way
    assert bad_step.error["type"] == "pikku_django.workflows.errors.NotSerializableError"
    assert bad_step.error["message"].startswith(
        "The result of step 'bad' is not JSON-serialisable (Object of type set is not JSON "
        "serializable); return plain dicts, lists"
    )
    assert CALLS.count(tag, "returns_set") == 1
    assert fetch(engine, bad).status == RunStatus.FAILED
    assert "not JSON-serialisable" in fetch(engine, bad).error["message"]

    inline_step = steps_of(engine, bad_inline)["bad"]
    assert inline_step.status == StepStatus.FAILED
    assert inline_step.attempt == 1
    assert "Object of type object is not JSON serializable" in inline_step.error["message"]
    assert fetch(engine, bad_inline).status == RunStatus.FAILED

    output = fetch(engine, bad_output)
    assert output.status == RunStatus.FAILED
    assert output.error["message"].startswith(
        "The output of workflow 'wft_not_json_output' is not JSON-serialisable"
    )

    assert fetch(engine, good).status == RunStatus.COMPLETED


# -- 12. many runs on many threads ---------------------------------------------------------------


def test_fifty_runs_on_four_threads_run_each_step_once(
    engine: WorkflowEngine, clock: FakeClock, tag: str
) -> None:
    run_ids = [engine.start(defs.many_wf, {"tag": tag, "run": i}).id for i in range(50)]
    errors: list[BaseException] = []
    failed = threading.Event()
    deadline = time.monotonic() + 120

    def unfinished() -> int:
        return engine.runs().filter(id__in=run_ids, status=RunStatus.RUNNING).count()

    def work() -> None:
        try:
            while not failed.is_set():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{unfinished()} runs unfinished after 120 s")
                if engine.work_once():
                    continue
                if not unfinished():
                    return
                # A pass that found its run's lease taken retries a (fake) second later.
                clock.advance(1)
                time.sleep(0.005)
        except BaseException as exc:
            errors.append(exc)
            failed.set()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, name=f"worker-{n}") for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors

    runs = {r.id: r for r in engine.runs().filter(id__in=run_ids)}
    assert {r.status for r in runs.values()} == {RunStatus.COMPLETED}
    assert sorted(r.output for r in runs.values()) == [3 * i for i in range(50)]
    assert CALLS.for_tag(tag) == {(i, s): 1 for i in range(50) for s in "abc"}
    queued = engine.steps().filter(run_id__in=run_ids, kind=StepKind.QUEUED)
    assert queued.count() == 150
    assert engine.attempts().filter(step__in=queued).count() == 150


# -- leases, claims and fencing -------------------------------------------------------------------


def test_a_pass_whose_run_lease_is_taken_retries_a_second_later(
    engine: WorkflowEngine, clock: FakeClock, tag: str
) -> None:
    run = engine.start(defs.one_step_wf, {"tag": tag})
    held = engine.leases.acquire(f"workflow-run:{run.id}", "another-worker", 60_000)
    assert held is not None
    one_pass(engine)
    run = fetch(engine, run)
    assert run.status == RunStatus.RUNNING
    assert run.wake_at == at(clock, 1)
    assert CALLS.count(tag, "pass") == 0
    assert engine.run_until_idle() == 0

    engine.leases.release(held)
    clock.advance(1)
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error


def test_a_step_that_lost_its_worker_on_every_attempt_fails(
    engine: WorkflowEngine, clock: FakeClock, alias: str, tag: str
) -> None:
    run = WorkflowRunFactory(database=alias, workflow="wft_one_step", input={"tag": tag})
    work = WorkflowStepFactory(
        database=alias,
        run=run,
        name="work",
        function="wft_record",
        input={"tag": tag, "key": "work"},
        status=StepStatus.RUNNING,
        attempt=2,
        retries=1,
        lease_expires_at=1,  # long lapsed
    )
    StepAttemptFactory(database=alias, step=work, attempt=1, status=StepStatus.FAILED)
    StepAttemptFactory(database=alias, step=work, attempt=2)

    assert engine.claim_step(work.id) is None
    work = steps_of(engine, run)["work"]
    assert work.status == StepStatus.FAILED
    assert work.error["type"].endswith("WorkflowStepLeaseExpiredError")
    assert work.error["message"] == ("Step 'work' lost its worker on every one of its 2 attempts")
    assert attempts_of(engine, work)[1].status == StepStatus.FAILED
    assert fetch(engine, run).wake_at == clock.now()

    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.FAILED
    assert "lost its worker" in run.error["message"]
    assert CALLS.count(tag, "record", "work") == 0


@pytest.mark.parametrize("outcome", ["succeeded", "raised", "missing"])
def test_a_superseded_attempt_ends_quietly(
    engine: WorkflowEngine, tag: str, outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"wft_contested_{tag}"

    def contested(data: dict[str, Any]) -> str:
        n = CALLS.hit(tag, "contested")
        if outcome == "raised" and n == 1:
            raise RuntimeError("the stale attempt failed")
        return f"done by call {n}"

    step(name=name)(contested)
    try:
        run = engine.start(defs.missing_function_wf, {"tag": tag, "function": name})
        one_pass(engine)
        x = steps_of(engine, run)["x"]
        stale = engine.claim_step(x.id)
        assert stale is not None
        assert engine.claim_step(x.id) is None  # its lease is live
        engine.steps().filter(id=x.id).update(lease_expires_at=1)  # ... until it lapses
        fresh = engine.claim_step(x.id)
        assert (stale.attempt, fresh.attempt) == (1, 2)

        # Every write of the stale attempt is refused.
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_result(x.id, "stale", stale.attempt)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_error(x.id, RuntimeError("stale"), stale.attempt)
        assert engine.refresh_step_lease(x.id, 60_000, stale.attempt) is False

        if outcome == "missing":
            registry.unregister(name)
        with caplog.at_level(logging.WARNING, logger="pikku_django"):
            engine.execute_step(stale)  # neither fails the step nor suspends the run
        assert "superseded" in caplog.text.lower()
        if outcome == "missing":
            step(name=name)(contested)

        x = steps_of(engine, run)["x"]
        assert (x.status, x.attempt, x.result, x.error) == (StepStatus.RUNNING, 2, None, None)
        history = attempts_of(engine, x)
        assert [(a.attempt, a.status, a.result, a.error) for a in history] == [
            (1, AttemptStatus.SUPERSEDED, None, None),
            (2, StepStatus.RUNNING, None, None),
        ]
        assert fetch(engine, run).status == RunStatus.RUNNING

        assert engine.refresh_step_lease(x.id, 60_000, fresh.attempt) is True
        engine.execute_step(fresh)
        engine.run_until_idle()
    finally:
        registry.unregister(name)
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    calls = 1 if outcome == "missing" else 2  # a stale attempt that ran is not recorded
    assert run.output == f"done by call {calls}"
    assert CALLS.count(tag, "contested") == calls


@pytest.mark.parametrize(("queue", "lease_ms"), [("default", 60_000), ("slow", 300_000)])
def test_a_claim_leases_the_step_for_its_queues_lease(
    engine: WorkflowEngine,
    alias: str,
    tag: str,
    settings: Any,
    queue: str,
    lease_ms: int,
) -> None:
    settings.PIKKU = {"QUEUE_LEASE_MS": {"slow": 300_000}}
    run = engine.start(defs.on_queue_wf, {"tag": tag, "queue": queue})
    one_pass(engine)
    other = "slow" if queue == "default" else "default"
    assert engine.claim_due_steps(queues=[other]) == []
    before = store_now_ms(alias)
    [claimed] = engine.claim_due_steps(queues=[queue], worker="worker-7")
    after = store_now_ms(alias)
    assert (claimed.queue, claimed.lease_ms) == (queue, lease_ms)
    work = steps_of(engine, run)["work"]
    assert before + lease_ms <= work.lease_expires_at <= after + lease_ms
    assert attempts_of(engine, work)[0].worker == "worker-7"


def test_a_workflow_that_changes_its_steps_on_replay_fails(
    engine: WorkflowEngine, tag: str
) -> None:
    run = engine.start(defs.nondeterministic_wf, {"tag": tag})
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.FAILED
    assert run.error["type"].endswith("NonDeterministicWorkflowError")
    assert "recorded as queued 'wft_add_one'" in run.error["message"]
    assert "now makes it queued 'wft_record'" in run.error["message"]


def test_a_refused_transactional_step_leaves_no_row(
    engine: WorkflowEngine, alias: str, tag: str
) -> None:
    group = f"group-{tag}"
    run = engine.start(defs.transactional_wf, {"tag": tag, "database": alias, "group": group})
    one_pass(engine)
    create = steps_of(engine, run)["create"]
    assert create.transactional

    stale = engine.claim_step(create.id)
    engine.steps().filter(id=create.id).update(lease_expires_at=1)
    fresh = engine.claim_step(create.id)
    assert (stale.attempt, fresh.attempt) == (1, 2)

    engine.execute_step(stale)
    assert CALLS.count(tag, "create_group") == 1
    assert not Group.objects.using(alias).filter(name=group).exists()
    create = steps_of(engine, run)["create"]
    assert (create.status, create.attempt) == (StepStatus.RUNNING, 2)

    engine.execute_step(fresh)
    [row] = Group.objects.using(alias).filter(name=group)
    engine.run_until_idle()
    run = fetch(engine, run)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == row.pk


# -- bad input and registration -----------------------------------------------------------------


def test_bad_input_is_a_clear_error(engine: WorkflowEngine, tag: str) -> None:
    with pytest.raises(WorkflowNotFoundError, match="No workflow is registered as 'wft_nope'"):
        engine.start("wft_nope", {})

    def not_registered(ctx: Any, inp: Any) -> None:
        return None

    with pytest.raises(WorkflowNotFoundError):
        engine.start(not_registered, {})
    with pytest.raises(NotSerializableError, match="The workflow input is not JSON-serialisable"):
        engine.start(defs.one_step_wf, {"tag": tag, "when": datetime.now()})
    with pytest.raises(NotSerializableError):
        engine.start(defs.one_step_wf, {"tag": tag, "n": float("nan")})
    assert not engine.runs().exists()

    with pytest.raises(ValueError, match="'5 parsecs' is not a duration"):
        parse_duration("5 parsecs")
    for bad in ("", "-5s", True, None, [1], float("inf"), -1):
        with pytest.raises(ValueError, match=r"duration|bool|timedelta"):
            parse_duration(bad)
    assert parse_duration("1h30m") == 5400
    assert parse_duration(timedelta(minutes=2)) == 120
    with pytest.raises(ValueError, match="retry_delay"):
        step(retry_delay="5 parsecs")
    with pytest.raises(ValueError, match="retries"):
        step(retries=-1)
    with pytest.raises(ValueError, match="backoff"):
        step(backoff="linear")

    sleepy = engine.start(defs.bad_sleep_wf, {"duration": "5 parsecs"})
    delay = engine.start(defs.bad_retry_delay_wf, {"tag": tag, "delay": "5 parsecs"})
    step_input = engine.start(defs.bad_step_input_wf, {"tag": tag})
    engine.run_until_idle()
    sleepy = fetch(engine, sleepy)
    assert sleepy.status == RunStatus.FAILED
    assert sleepy.error["type"] == "ValueError"
    assert "sleep duration '5 parsecs' is not a duration" in sleepy.error["message"]
    delay = fetch(engine, delay)
    assert delay.status == RunStatus.FAILED
    assert "retry_delay '5 parsecs' is not a duration" in delay.error["message"]
    step_input = fetch(engine, step_input)
    assert step_input.status == RunStatus.FAILED
    assert step_input.error["message"].startswith("The input of step 'x' is not JSON-serialisable")

    with pytest.raises(WorkflowRunNotFoundError):
        engine.get_run("not-a-uuid")


def test_registering_another_function_under_a_taken_name_raises(
    engine: WorkflowEngine, tag: str
) -> None:
    name = f"wft_dup_{tag}"

    def original(ctx: Any, inp: Any) -> str:
        return "original"

    def impostor(ctx: Any, inp: Any) -> str:
        return "impostor"

    def original_step(data: Any) -> str:
        return "original step"

    def impostor_step(data: Any) -> str:
        return "impostor step"

    try:
        workflow(name=name)(original)
        workflow(name=name)(original)  # the same function again (a re-import) is fine
        with pytest.raises(ImproperlyConfigured, match=name):
            workflow(name=name)(impostor)
        step_name = f"{name}_step"
        step(name=step_name)(original_step)
        with pytest.raises(ImproperlyConfigured, match=step_name):
            step(name=step_name)(impostor_step)
        assert registry.get_step(step_name).fn is original_step

        run = engine.start(name, None, inline=True)
        assert run.output == "original"
    finally:
        registry.unregister(name)
        registry.unregister(f"{name}_step")
