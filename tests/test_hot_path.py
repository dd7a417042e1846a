"""The hot path's round trips: a claimed run is read by its claim, the first pass of a
run without steps replays against none when it reaches a queued step it claims (and
reads them before anything else), inline runs carry their queued steps on, and idle
worker threads take turns to poll. On SQLite, PostgreSQL and MariaDB.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowEngine, step, workflow
from pikku_django.workflows.engine import StepClaimer
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.worker._idle import IdleThreads
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")
CLAIMER = StepClaimer("host:1:2")
CALLS: dict[str, int] = {}


@step(name="hot_echo")
def echo(n: int) -> int:
    return n


@workflow(name="hot_one")
def one(ctx: WorkflowContext, inp: Any) -> int:
    return int(ctx.do("only", echo, 1))


@workflow(name="hot_ten")
def ten(ctx: WorkflowContext, inp: Any) -> int:
    return sum(ctx.do(f"s{n}", echo, n) for n in range(10))


@workflow(name="hot_inline_first")
def inline_first(ctx: WorkflowContext, inp: dict[str, str]) -> int:
    def effect() -> int:
        CALLS[inp["tag"]] = CALLS.get(inp["tag"], 0) + 1
        return 5

    return int(ctx.do("effect", effect)) + int(ctx.do("then", echo, 1))


@workflow(name="hot_sleeps_first")
def sleeps_first(ctx: WorkflowContext, inp: Any) -> int:
    ctx.sleep("nap", 3600)
    return int(ctx.do("then", echo, 1))


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


def _row_reads(captured: CaptureQueriesContext, table: str) -> list[str]:
    """The statements that read whole rows of ``table`` (not a guard's ``SELECT 1``)."""
    return [
        q["sql"] for q in captured.captured_queries if q["sql"].startswith(f'SELECT "{table}".')
    ]


def test_the_claim_reads_the_run_and_says_whether_it_has_steps(engine: WorkflowEngine) -> None:
    fresh = engine.start(one)
    [due] = engine.claim_due_run_rows(1)
    assert (due.run.id, due.stepless) == (fresh.id, True)
    assert due.run.workflow == "hot_one"
    assert due.run.status == RunStatus.RUNNING
    stored = engine.get_run(fresh.id)
    for field in WorkflowRun._meta.concrete_fields:
        assert getattr(due.run, field.attname) == getattr(stored, field.attname), field.name

    claimed = engine.orchestrate(fresh.id, claimer=CLAIMER, due=due)
    assert claimed is not None
    engine.execute_step(claimed)
    [again] = engine.claim_due_run_rows(1)
    assert (again.run.id, again.stepless) == (fresh.id, False)


def test_a_stepless_first_pass_reads_neither_the_run_nor_its_steps(
    engine: WorkflowEngine, alias: str
) -> None:
    run = engine.start(one)
    [due] = engine.claim_due_run_rows(1)
    with CaptureQueriesContext(connections[alias]) as captured:
        claimed = engine.orchestrate(run.id, claimer=CLAIMER, due=due)
    assert claimed is not None
    assert claimed.name == "only"
    assert _row_reads(captured, "pikku_workflow_step") == []
    assert _row_reads(captured, "pikku_workflow_run") == []
    assert engine.execute_step(claimed).value == "succeeded"
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED


def test_a_stale_stepless_claim_stores_no_second_step(engine: WorkflowEngine) -> None:
    run = engine.start(one)
    [due] = engine.claim_due_run_rows(1)
    # Another pass stores the step (claimed) after the claim read the run.
    first = engine.orchestrate(run.id, claimer=StepClaimer("other:1:1"))
    assert first is not None

    assert engine.orchestrate(run.id, claimer=CLAIMER, due=due) is None
    [row] = engine.steps().filter(run_id=run.id)
    assert (row.id, row.attempt, row.status) == (first.step_id, 1, StepStatus.RUNNING)
    assert engine.attempts().filter(step_id=row.id).count() == 1
    # Looked at again, and the other worker's attempt completes the run.
    assert engine.get_run(run.id).wake_at is not None
    engine.execute_step(first)
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED


def test_an_inline_step_first_reads_the_steps_before_it_runs(
    engine: WorkflowEngine, alias: str
) -> None:
    tag = f"inline-{alias}"
    run = engine.start(inline_first, {"tag": tag})
    [due] = engine.claim_due_run_rows(1)
    assert due.stepless
    # Another pass ran the inline step (and claimed the next) after the claim's read.
    other = engine.orchestrate(run.id, claimer=StepClaimer("other:1:1"))
    assert other is not None
    assert CALLS[tag] == 1

    # The stale claim says "no steps": the inline step must still not run again.
    assert engine.orchestrate(run.id, claimer=CLAIMER, due=due) is None
    assert CALLS[tag] == 1
    assert engine.steps().filter(run_id=run.id).count() == 2
    engine.execute_step(other)
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED
    assert (engine.get_run(run.id).output, CALLS[tag]) == (6, 1)


def test_a_sleep_first_is_stored_once_through_a_stepless_pass(engine: WorkflowEngine) -> None:
    run = engine.start(sleeps_first)
    [due] = engine.claim_due_run_rows(1)
    assert engine.orchestrate(run.id, claimer=CLAIMER, due=due) is None
    [nap] = engine.steps().filter(run_id=run.id)
    assert (nap.name, nap.status) == ("nap", StepStatus.SCHEDULED)
    assert engine.get_run(run.id).wake_at == nap.available_at


def test_an_inline_run_of_registered_steps_carries_them_on(
    engine: WorkflowEngine, alias: str
) -> None:
    engine.start(ten, inline=True)  # warm: options resolved, statements prepared
    with CaptureQueriesContext(connections[alias]) as captured:
        run = engine.start(ten, inline=True)
    assert (run.status, run.output) == (RunStatus.COMPLETED, 45)
    steps = list(WorkflowStep.objects.using(alias).filter(run_id=run.id))
    assert len(steps) == 10
    assert all(s.status == StepStatus.SUCCEEDED and s.attempt == 1 for s in steps)
    assert engine.attempts().filter(step__run_id=run.id).count() == 10
    # On PostgreSQL two statements a step (stored claimed, then settled) and a few for
    # the run, 126 before queued steps were carried on; 157 through the ORM before.
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT"))
    ]
    assert len(statements) <= (40 if connections[alias].vendor == "postgresql" else 100), len(
        statements
    )


# -- idle threads ---------------------------------------------------------------------------


def test_one_idle_thread_polls_and_the_others_wait_to_be_woken() -> None:
    idle, stopping = IdleThreads(), threading.Event()
    assert idle.polls(0)
    assert not idle.polls(1)  # thread 0 polls; 1 waits to be told
    returned: list[int] = []

    def wait(index: int, timeout: float) -> None:
        idle.wait(index, timeout, stopping)
        returned.append(index)

    poller = threading.Thread(target=wait, args=(0, 0.05))
    follower = threading.Thread(target=wait, args=(1, 0.05))
    follower.start()
    poller.start()
    poller.join(60)
    assert returned == [0]  # the poller's timer ran out; the follower still waits
    assert idle.polls(1)  # the role is free again
    idle.wake_one()
    follower.join(60)
    assert returned == [0, 1]


def test_a_wake_up_with_nobody_waiting_is_kept_for_the_next_to_wait() -> None:
    idle, stopping = IdleThreads(), threading.Event()
    idle.wake_one()
    # It returns without waiting its hour out: the wake-up was owed to it.
    owed = threading.Thread(target=idle.wait, args=(3, 3600.0, stopping), daemon=True)
    owed.start()
    owed.join(60)
    assert not owed.is_alive(), "the owed wake-up was not taken"
    idle.polls(3)
    done = threading.Thread(target=idle.wait, args=(3, 0.05, stopping))
    done.start()
    done.join(60)
    assert not done.is_alive()  # no second owed wake-up: it waited its timer out


def test_stopping_wakes_every_waiting_thread() -> None:
    idle, stopping = IdleThreads(), threading.Event()
    threads = [threading.Thread(target=idle.wait, args=(i, 30.0, stopping)) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    stopping.set()
    idle.wake_all()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
