"""An idle worker's next look is timed by what falls due after its last look began: a
run that fell due while the thread was looking (too early to claim it) is looked for
again at once, not a whole poll interval later; one already due when the look began
(which the thread could not claim) does not make it spin."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from pikku_django.leases import InMemoryLeaseService
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, workflow
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases

ALL = ("sqlite", "postgres", "mariadb")
POLL = 300.0


@workflow(name="nd.later")
def later(ctx: WorkflowContext, input: Any) -> Any:
    return input


@pytest.fixture
def engine(vendor: str) -> WorkflowEngine:
    return WorkflowEngine(database_alias(vendor), leases=InMemoryLeaseService(), clock=FakeClock())


def idle_worker(engine: WorkflowEngine) -> Worker:
    return Worker(engine, concurrency=1, poll_interval=POLL)


def run_due_in_30s(engine: WorkflowEngine) -> FakeClock:
    """Start a run due 30 s from now: the engine's clock, to move."""
    run = engine.start(later, 1, delay=30)
    assert run.start_at is not None
    clock = engine.clock
    assert isinstance(clock, FakeClock)
    return clock


@on_databases(*ALL)
def test_a_run_due_during_the_look_is_looked_for_at_once(engine: WorkflowEngine) -> None:
    clock = run_due_in_30s(engine)
    clock.advance(30 - 0.002)
    looked_at = clock.now()  # the look begins 2 ms before the run falls due...
    clock.advance(0.004)  # ...and the next-due look comes 2 ms after it
    assert idle_worker(engine)._seconds_until_next_due(looked_at) < 0.1


@on_databases(*ALL)
def test_a_run_due_before_the_look_does_not_make_it_spin(engine: WorkflowEngine) -> None:
    clock = run_due_in_30s(engine)
    clock.advance(31)
    worker = idle_worker(engine)
    # Due before the look began: the look could not claim it (say another worker had
    # it), so only the poll interval (or the intakes' next look) remains.
    assert worker._seconds_until_next_due(clock.now() - timedelta(seconds=0.5)) > 0.1
    assert worker._seconds_until_next_due() > 0.1


@on_databases(*ALL)
def test_a_run_due_later_is_waited_for(engine: WorkflowEngine) -> None:
    clock = run_due_in_30s(engine)
    clock.advance(20)
    wait = idle_worker(engine)._seconds_until_next_due(clock.now())
    assert 9.9 <= wait <= 10.1


@on_databases("sqlite")
def test_an_overdue_look_at_the_intakes_is_taken_at_once(engine: WorkflowEngine) -> None:
    # On a busy machine the intakes' next look can be past by the time the thread works
    # out its wait: it is due now, not left out for a whole poll interval.
    worker = idle_worker(engine)
    worker.intakes._last = time.monotonic() - 2 * worker.cadence.intake_interval()
    assert worker.intakes.next_look() < time.monotonic()
    assert worker._seconds_until_next_due() < 0.1
