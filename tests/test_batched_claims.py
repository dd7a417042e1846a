"""Batched claims, on SQLite, PostgreSQL and MariaDB.

A worker thread claims as many units of due work (due runs, ready steps) as its
worker has free threads, in one claim, and hands the others to free threads; a busy
worker claims no more than its free threads. Each unit is claimed as it would be
alone: one taken over by another worker before it ran is refused when it settles,
the others of its batch settle; one whose worker never started it is claimed by
another worker once its lease lapses. Priorities and queue limits:
tests/test_priority.py and tests/test_limits.py; a worker process SIGKILLed holding
a batch: tests/test_crash_recovery_batch.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import AttemptStatus, RunStatus, StepAttempt, StepStatus, WorkflowStep
from pikku_django.workflows import WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.engine import StepClaimer
from pikku_django.workflows.worker._batches import Batches, Unit
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, db_mark
from tests.test_worker import wait_for

VENDORS = ("sqlite", "postgres", "mariadb")

#: Set while a ``bc_hold`` step that was told to hold runs; cleared to let it end.
HOLDING = threading.Event()
RELEASE = threading.Event()


@step(name="bc_echo")
def bc_echo(data: Any) -> Any:
    return data


@step(name="bc_hold")
def bc_hold(data: Any) -> Any:
    if data.get("hold"):
        HOLDING.set()
        assert RELEASE.wait(60), "the test never released the step"
    return data


@workflow(name="bc_one")
def bc_one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("work", bc_echo, inp)


@workflow(name="bc_held")
def bc_held(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("work", bc_hold, inp)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService())


@pytest.fixture(autouse=True)
def _events() -> Iterator[None]:
    HOLDING.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


def _claimer(worker: Worker) -> StepClaimer:
    return StepClaimer(f"{worker.name}:{threading.get_ident()}", tuple(worker.queues))


def claim_batch(worker: Worker) -> list[Unit]:
    """What one look of a worker thread claims for the worker's free threads."""
    wanted = worker._batches.reserve()
    try:
        return worker._claim(_claimer(worker), wanted)
    finally:
        worker._batches.claimed(wanted, [])


def _ready(engine: WorkflowEngine, n: int, workflow: Any = bc_one, **options: Any) -> list[Any]:
    """``n`` runs whose step is stored ready (their first pass made): their ids."""
    runs = [engine.start(workflow, {"n": i}, **options).id for i in range(n)]
    while due := engine.claim_due_runs(10):
        for run_id in due:
            engine.orchestrate(run_id)
    return runs


def _claim_statements(alias: str, worker: Worker) -> tuple[list[Unit], int]:
    with CaptureQueriesContext(connections[alias]) as queries:
        units = claim_batch(worker)
    return units, len(queries.captured_queries)


# -- one claim for the free threads -------------------------------------------------------


@pytest.mark.parametrize("leases", ["memory", "database"])
def test_a_worker_claims_due_runs_for_its_free_threads_in_one_claim(
    alias: str, leases: str
) -> None:
    # With the database's run leases (PostgreSQL), the claim takes each run's lease
    # and stores its first step claimed, still in one statement.
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService() if leases == "memory" else None)
    engine.start(bc_one, "alone")
    single, alone = _claim_statements(alias, Worker(engine, concurrency=1, notify=False))
    assert len(single) == 1
    assert single[0].due is not None
    for n in range(6):
        engine.start(bc_one, n)
    worker = Worker(engine, concurrency=4, notify=False)
    units, statements = _claim_statements(alias, worker)
    assert len(units) == 4  # its four free threads, though six were due
    assert all(unit.due is not None for unit in units)
    assert len({unit.run_id for unit in units}) == 4
    # Four runs cost the statements one did: one claim for all of them.
    assert statements == alone
    assert len(claim_batch(worker)) == 2


def test_a_worker_claims_ready_steps_for_its_free_threads_in_one_statement(
    engine: WorkflowEngine, alias: str
) -> None:
    _ready(engine, 1)
    _, alone = _claim_statements(alias, Worker(engine, concurrency=1, notify=False))
    _ready(engine, 5)
    units, statements = _claim_statements(alias, Worker(engine, concurrency=3, notify=False))
    assert len(units) == 3
    claimed = [unit.claimed for unit in units]
    assert all(c is not None and c.attempt == 1 for c in claimed)
    # Each its own claim: its own token and lease, fenced as a claim of one is.
    assert len({(c.step_id, c.claim_token) for c in claimed if c is not None}) == 3
    if engine.store.vendor == "postgresql":
        assert statements == alone  # one statement claims them all
    else:
        assert statements > alone  # one decision per step, as each is claimed alone


def test_a_batch_claim_takes_no_more_than_the_most_set(
    engine: WorkflowEngine, settings: Any
) -> None:
    settings.PIKKU = {**settings.PIKKU, "WORKER_CLAIM_BATCH": 2}
    _ready(engine, 5)
    assert len(claim_batch(Worker(engine, concurrency=8, notify=False))) == 2


def test_the_slots_of_a_worker_bound_what_it_claims_and_has_not_started() -> None:
    batches = Batches(4, most=32)
    assert batches.reserve() == 4  # every slot (another look now waits: see below)
    first = batches.claimed(4, [Unit(1), Unit(2), Unit(3)])
    assert first == Unit(1)
    assert batches.waiting() == 2
    assert batches.reserve() == 1  # one thread runs a unit, two units wait for threads
    batches.claimed(1, [])
    assert batches.take() == Unit(2)
    assert batches.take() == Unit(3)
    assert batches.take() is None
    assert batches.reserve() == 1  # three threads run their units
    with pytest.raises(ValueError, match="took 2"):
        batches.claimed(1, [Unit(4), Unit(5)])
    batches.claimed(1, [])
    for _ in range(3):
        batches.done()
    assert batches.reserve() == 4


def test_a_look_waits_for_the_claim_holding_every_free_slot_then_takes_what_it_left() -> None:
    batches = Batches(3, most=32)
    assert batches.reserve() == 3
    got: list[int] = []
    # Woken for new work while every slot is reserved: it waits for the claim under
    # way, which may have begun before that work was stored.
    look = threading.Thread(target=lambda: got.append(batches.reserve()))
    look.start()
    look.join(0.2)
    assert look.is_alive()
    assert not got
    batches.claimed(3, [Unit(1)])  # the claim left two slots free
    look.join(10)
    assert got == [2]
    batches.claimed(2, [Unit(2), Unit(3)])
    assert batches.reserve() == 0  # every slot runs or holds a unit: no wait
    assert batches.take() == Unit(3)


# -- a worker's threads -------------------------------------------------------------------


class Looks:
    """The claims a worker's threads make: how many each asked for, and whether the
    held step ran then."""

    def __init__(self, worker: Worker) -> None:
        self.asked: list[tuple[int, bool, int]] = []
        self._lock = threading.Lock()
        runs, steps = worker._due_runs, worker._ready_steps

        def due_runs(claimer: StepClaimer, limit: int = 1) -> list[Unit]:
            return self._note(limit, runs(claimer, limit))

        def ready_steps(claimer: StepClaimer, limit: int = 1, busy: bool = False) -> list[Unit]:
            return self._note(limit, steps(claimer, limit, busy))

        worker._due_runs = due_runs  # type: ignore[method-assign]
        worker._ready_steps = ready_steps  # type: ignore[method-assign]

    def _note(self, limit: int, got: list[Unit]) -> list[Unit]:
        with self._lock:
            self.asked.append((limit, HOLDING.is_set() and not RELEASE.is_set(), len(got)))
        return got


def _running(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_idle_threads_are_handed_what_one_claim_took(engine: WorkflowEngine) -> None:
    runs = [engine.start(bc_one, n).id for n in range(4)]
    worker = Worker(engine, concurrency=4, until_idle=True, poll_interval=0.05, idle_grace=0)
    looks = Looks(worker)
    worker.run()
    found = [(limit, got) for limit, _, got in looks.asked if got]
    assert found[0] == (4, 4), looks.asked  # one claim for all four threads
    assert all(limit <= 4 for limit, _, _ in looks.asked)
    for run_id in runs:
        assert engine.get_run(run_id).status == RunStatus.COMPLETED


def test_a_busy_worker_claims_no_more_than_its_free_threads(engine: WorkflowEngine) -> None:
    held = engine.start(bc_held, {"hold": True}).id
    worker = Worker(engine, concurrency=2, until_idle=True, poll_interval=0.05, idle_grace=0)
    looks = Looks(worker)
    thread = _running(worker)
    try:
        wait_for(HOLDING.is_set, 60, "the held step to start")
        others = [engine.start(bc_held, {"n": n}).id for n in range(5)]
        wait_for(
            lambda: all(engine.get_run(r).status == RunStatus.COMPLETED for r in others),
            60,
            "the other runs to complete on the free thread",
        )
    finally:
        RELEASE.set()
        thread.join(60)
    assert not thread.is_alive()
    assert engine.get_run(held).status == RunStatus.COMPLETED
    while_held = [(limit, got) for limit, holding, got in looks.asked if holding]
    assert while_held, looks.asked
    # One thread ran the held step: each claim meanwhile was for the other alone.
    assert all(limit == 1 and got <= 1 for limit, got in while_held), looks.asked
    # At no moment did the worker hold more claims than its two threads.
    attempts = StepAttempt.objects.using(engine.using).values_list("started_at", "finished_at")
    events = sorted([(s, 1) for s, _ in attempts] + [(f, -1) for _, f in attempts])
    most = running = 0
    for _, change in events:
        running += change
        most = max(most, running)
    assert most <= 2


def test_units_handed_to_threads_are_run_when_the_worker_stops(engine: WorkflowEngine) -> None:
    runs = _ready(engine, 3)
    worker = Worker(engine, concurrency=3, poll_interval=0.05)
    claimer = _claimer(worker)
    wanted = worker._batches.reserve()
    units = worker._claim(claimer, wanted)
    first = worker._batches.claimed(wanted, units)
    assert first is not None
    assert worker._batches.waiting() == 2
    worker.stop()
    worker.run()  # its threads run the two units handed to them, then return
    assert worker._batches.waiting() == 0
    steps = WorkflowStep.objects.using(engine.using).filter(run_id__in=runs)
    status = dict(steps.values_list("run_id", "status"))
    assert status.pop(first.run_id) == StepStatus.RUNNING  # never started here
    assert set(status.values()) == {StepStatus.SUCCEEDED}


# -- each unit fenced on its own -----------------------------------------------------------


def test_a_unit_of_a_batch_taken_over_before_it_ran_is_refused_the_others_settle(
    engine: WorkflowEngine,
) -> None:
    runs = _ready(engine, 3)
    worker = Worker(engine, concurrency=3, notify=False)
    claimer = _claimer(worker)
    wanted = worker._batches.reserve()
    units = worker._claim(claimer, wanted)
    assert len(units) == 3
    # Before it ran, the second unit's claim lapsed and another worker took it over.
    taken = units[1].claimed
    assert taken is not None
    assert engine.refresh_step_lease(taken.step_id, -1, taken.attempt, taken.claim_token)
    other = engine.claim_step(taken.step_id, worker="another worker")
    assert other is not None
    assert other.attempt == 2
    first = worker._batches.claimed(wanted, units)
    assert first is not None
    worker._carrier.carry(first.run_id, claimer, first.claimed, first.due)
    worker._batches.done()
    assert worker._one_unit() >= 1
    assert worker._one_unit() >= 1
    assert worker._batches.waiting() == 0
    assert worker.counts["superseded"] == 1
    assert worker.counts["finished"] == 2
    step = WorkflowStep.objects.using(engine.using).get(id=taken.step_id)
    assert step.status == StepStatus.RUNNING
    assert step.attempt == 2
    assert step.claim_token == other.claim_token
    superseded = StepAttempt.objects.using(engine.using).get(step_id=taken.step_id, attempt=1)
    assert superseded.status == AttemptStatus.SUPERSEDED
    assert engine.get_run(taken.run_id).status == RunStatus.RUNNING
    for run_id in runs:
        if run_id != taken.run_id:
            assert engine.get_run(run_id).status == RunStatus.COMPLETED


def test_a_unit_its_worker_never_started_is_claimed_once_its_lease_lapses(
    alias: str, settings: Any
) -> None:
    settings.PIKKU = {**settings.PIKKU, "STEP_LEASE_MS": 1_500}
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    runs = _ready(engine, 2)
    gone = Worker(engine, concurrency=2, notify=False)
    units = claim_batch(gone)  # claimed, then its worker is gone before it starts either
    assert len(units) == 2
    leases = dict(
        WorkflowStep.objects.using(alias)
        .filter(run_id__in=runs)
        .values_list("id", "lease_expires_at")
    )
    survivor = Worker(engine, concurrency=2, until_idle=True, poll_interval=0.05, idle_grace=5)
    survivor.run()
    for run_id in runs:
        assert engine.get_run(run_id).status == RunStatus.COMPLETED
    for step_id, lease_ms in leases.items():
        attempts = StepAttempt.objects.using(alias).filter(step_id=step_id)
        assert {a.attempt: a.status for a in attempts} == {
            1: AttemptStatus.SUPERSEDED,
            2: StepStatus.SUCCEEDED,
        }
        second = attempts.get(attempt=2)
        # Taken over once the first claim's lease had lapsed, not before.
        assert second.started_at.timestamp() * 1000 >= lease_ms
    assert survivor.counts["recovered"] == 2
