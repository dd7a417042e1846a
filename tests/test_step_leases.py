"""Run leases, step leases and recovery, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from pikku_django.leases import InMemoryLeaseService, LeaseService
from pikku_django.models import RunStatus, StepKind, StepStatus
from pikku_django.testing.leases import clock_ahead
from pikku_django.testing.workflows import (
    LEASE_MS,
    RPC,
    STEP,
    claim,
    lapse_lease,
    start_run,
    step_of,
)
from pikku_django.workflows import FakeClock, WorkflowEngine, workflow
from pikku_django.workflows.engine import ClaimedStep
from pikku_django.workflows.steps.step_lease import keep_step_lease, renewal_interval_s
from pikku_django.workflows.worker.loop import wake_stalled_runs
from tests.conftest import database_alias, on_databases

ALL = ("sqlite", "postgres", "mariadb")
HOUR_MS = 3_600_000


def engine_on(vendor: str, leases: LeaseService | None = None) -> WorkflowEngine:
    return WorkflowEngine(
        database_alias(vendor), leases=leases or InMemoryLeaseService(), clock=FakeClock()
    )


passes: list[str] = []


@workflow(name="leases.counted")
def counted(ctx: Any, input: Any) -> str:
    passes.append(str(ctx.run_id))
    return "done"


# -- the run lease ---------------------------------------------------------------


@on_databases(*ALL)
def test_pass_over_a_run_held_elsewhere_wakes_it_a_second_later(vendor: str) -> None:
    leases = InMemoryLeaseService()
    engine = engine_on(vendor, leases)
    run = engine.start("leases.counted")
    assert leases.acquire(f"workflow-run:{run.id}", "another-worker", HOUR_MS)
    passes.clear()
    wakes = engine.get_run(run.id).wakes
    engine.orchestrate(run.id)
    after = engine.get_run(run.id)
    assert passes == [], "the workflow ran without the run lease"
    assert after.status == RunStatus.RUNNING
    assert after.wake_at == engine.clock.now() + timedelta(seconds=1)
    assert after.wakes == wakes + 1
    assert not engine.steps().filter(run_id=run.id).exists(), "a retry budget was spent"


@on_databases(*ALL)
def test_settled_run_is_not_replayed_and_takes_no_lease(vendor: str) -> None:
    class Counting(InMemoryLeaseService):
        acquired = 0

        def acquire(self, key: str, holder: str, ttl_ms: int) -> Any:
            Counting.acquired += 1
            return super().acquire(key, holder, ttl_ms)

    leases = Counting()
    engine = engine_on(vendor, leases)
    run = engine.start("leases.counted")
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED
    passes.clear()
    taken = Counting.acquired
    engine.orchestrate(run.id)
    assert passes == []
    assert Counting.acquired == taken


@on_databases(*ALL)
def test_inline_run_that_lost_its_lease_after_finishing_keeps_its_outcome(vendor: str) -> None:
    class LosesOnRefresh(InMemoryLeaseService):
        def refresh(self, lease: Any, ttl_ms: int) -> Any:
            return None  # another holder took it after the body finished

    engine = engine_on(vendor, LosesOnRefresh())
    run = engine.start("leases.counted", inline=True)
    assert run.status == RunStatus.COMPLETED
    assert run.output == "done"
    assert engine.get_run(run.id).wake_at is None


# -- the step lease ----------------------------------------------------------------


@on_databases(*ALL)
def test_live_step_lease_excludes_a_second_claim(vendor: str) -> None:
    engine = engine_on(vendor)
    run = start_run(engine)
    first = claim(engine, run)
    assert first is not None
    assert first.attempt == 1
    assert claim(engine, run) is None
    assert engine.claim_due_steps(limit=10) == []
    step = step_of(engine, run)
    assert step.status == StepStatus.RUNNING
    assert step.lease_expires_at is not None


@on_databases(*ALL)
def test_lapsed_step_is_claimed_as_attempt_two(vendor: str) -> None:
    engine = engine_on(vendor)
    run = start_run(engine)
    assert claim(engine, run) is not None
    lapse_lease(engine, run)
    claimed = engine.claim_due_steps(limit=10)
    assert [c.attempt for c in claimed] == [2]
    assert engine.attempts().filter(step__run=run).count() == 2


@on_databases(*ALL)
def test_step_that_keeps_losing_its_worker_fails_and_wakes_its_run(vendor: str) -> None:
    engine = engine_on(vendor)
    run = start_run(engine)
    engine.steps().filter(run=run).update(retries=2)
    for attempt in (1, 2, 3):
        got = claim(engine, run)
        assert got is not None
        assert got.attempt == attempt
        lapse_lease(engine, run)
    engine.runs().filter(id=run.id).update(wake_at=None)
    assert claim(engine, run) is None
    step = step_of(engine, run)
    assert step.status == StepStatus.FAILED
    assert step.error["type"].endswith("WorkflowStepLeaseExpiredError")
    assert "lost its worker on every one of its 3 attempts" in step.error["message"]
    assert engine.get_run(run.id).wake_at is not None, "the run was not woken"


@on_databases(*ALL)
def test_parked_child_step_has_no_lease_and_is_not_claimed(vendor: str) -> None:
    engine = engine_on(vendor)
    run = start_run(engine)
    engine.steps().filter(run=run).update(
        status=StepStatus.RUNNING, attempt=1, lease_expires_at=None, kind=StepKind.CHILD
    )
    assert engine.claim_due_steps(limit=10) == []
    assert wake_stalled_runs(engine, 0) == 0


def _claimed(engine: WorkflowEngine, lease_ms: int) -> ClaimedStep:
    run = start_run(engine)
    got = engine.claim_step_for_execution(run.id, STEP, RPC, lease_ms)
    assert got is not None
    return got


@on_databases(*ALL)
def test_renewals_never_overlap_and_come_every_half_lease(vendor: str) -> None:
    engine = engine_on(vendor)
    claimed = _claimed(engine, 600)
    calls: list[tuple[float, float]] = []
    active = threading.Lock()
    overlapped = []
    real = engine.refresh_step_lease

    def refresh(step_id: int, lease_ms: int | None, attempt: int, token: int | None) -> bool:
        if not active.acquire(blocking=False):
            overlapped.append(time.monotonic())
        started = time.monotonic()
        try:
            time.sleep(0.05)
            return real(step_id, lease_ms, attempt, token)
        finally:
            calls.append((started, time.monotonic()))
            active.release()

    engine.refresh_step_lease = refresh  # type: ignore[method-assign]
    with keep_step_lease(engine, claimed) as superseded:
        time.sleep(1.6)
    assert not superseded.is_set()
    assert not overlapped
    starts = [c[0] for c in calls]
    assert len(starts) >= 3
    # Each renewal waits half a lease after the one before it has returned: they
    # come at that cadence, never sooner (a loaded machine may make them later).
    rests = [b[0] - a[1] for a, b in itertools.pairwise(calls)]
    assert min(rests) >= renewal_interval_s(600) * 0.9, rests
    assert renewal_interval_s(600) == pytest.approx(0.3)


@on_databases(*ALL)
def test_short_lease_still_renews_in_time_and_warns_once(
    vendor: str, caplog: pytest.LogCaptureFixture
) -> None:
    import pikku_django.workflows.steps.step_lease as worker_module

    caplog.set_level(logging.WARNING, logger="pikku_django")
    worker_module._warned_short_lease = False
    engine = engine_on(vendor)
    claimed = _claimed(engine, 400)
    with keep_step_lease(engine, claimed):
        for _ in range(8):
            time.sleep(0.1)
            assert claim(engine, engine.runs().get(id=claimed.run_id)) is None, (
                "the short lease lapsed while its worker was alive"
            )
    with keep_step_lease(engine, claimed):
        time.sleep(0.3)
    assert caplog.text.count("under a second") == 1


@on_databases(*ALL)
def test_renewal_stops_once_superseded(vendor: str) -> None:
    engine = engine_on(vendor)
    claimed = _claimed(engine, 400)
    run = engine.runs().get(id=claimed.run_id)
    lapse_lease(engine, run)
    newer = claim(engine, run)
    assert newer is not None
    with keep_step_lease(engine, claimed) as superseded:
        assert superseded.wait(60)


@on_databases("postgres", "mariadb")
def test_worker_with_fast_clock_cannot_claim_a_live_step(vendor: str) -> None:
    engine = engine_on(vendor)
    run = start_run(engine)
    assert claim(engine, run) is not None
    with clock_ahead(HOUR_MS):
        assert claim(engine, run) is None
        assert engine.claim_due_steps(limit=10) == []
    assert step_of(engine, run).attempt == 1


@on_databases("postgres", "mariadb")
def test_claim_stamps_the_lease_on_the_database_clock(vendor: str) -> None:
    engine = engine_on(vendor)
    run = start_run(engine)
    with clock_ahead(HOUR_MS):
        assert claim(engine, run) is not None
    lease = step_of(engine, run).lease_expires_at
    now = time.time() * 1000
    assert now < lease <= now + LEASE_MS + 5_000


# -- recovery ----------------------------------------------------------------------


@on_databases(*ALL)
def test_stalled_run_is_woken_and_busy_runs_are_left_alone(vendor: str) -> None:
    engine = engine_on(vendor)
    stalled = start_run(engine)
    engine.steps().filter(run=stalled).update(status=StepStatus.SUCCEEDED, attempt=1)
    busy = start_run(engine)
    assert claim(engine, busy) is not None
    old = engine.clock.now() - timedelta(minutes=10)
    engine.runs().update(wake_at=None, updated_at=old)
    assert wake_stalled_runs(engine, 300) == 1
    assert engine.get_run(stalled.id).wake_at is not None
    assert engine.get_run(busy.id).wake_at is None
    lapse_lease(engine, busy)
    engine.runs().filter(id=busy.id).update(updated_at=old)
    assert wake_stalled_runs(engine, 300) == 1
    assert engine.get_run(busy.id).wake_at is not None


@on_databases(*ALL)
def test_recently_active_run_is_not_woken(vendor: str) -> None:
    engine = engine_on(vendor)
    run = start_run(engine)
    engine.steps().filter(run=run).update(status=StepStatus.SUCCEEDED, attempt=1)
    engine.runs().update(wake_at=None)
    assert wake_stalled_runs(engine, 300) == 0
