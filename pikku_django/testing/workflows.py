"""A conformance suite for step fencing, reusable on any database the engine runs on.

Every scenario has a stale attempt (claimed, then its lease lapsed and the step
claimed again) and the attempt that replaced it. Subclass the contract under a
name pytest collects and give it a ``fencing_engine`` fixture that yields a
:class:`~pikku_django.workflows.WorkflowEngine` on a database the test may write
to with committed transactions (pytest-django: ``transaction=True``)::

    @pytest.mark.django_db(transaction=True)
    class TestFencing(WorkflowFencingContract):
        @pytest.fixture
        def fencing_engine(self):
            return WorkflowEngine("default")
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from pikku_django.models import (
    AttemptStatus,
    Backoff,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows import fencing_token, registry
from pikku_django.workflows._values import NewStep
from pikku_django.workflows.engine import ClaimedStep, StepOutcome, WorkflowEngine
from pikku_django.workflows.errors import (
    StepFunctionNotFoundError,
    WorkflowStepSupersededError,
)

STEP = "charge"
RPC = "pikku.testing.charge_card"
LEASE_MS = 60_000
RACES = 25

#: What the registered step function does when a test dispatches it.
_behaviour = threading.local()


@registry.step(name=RPC)
def _charge_card(data: Any) -> Any:
    return _behaviour.fn()


def start_run(engine: WorkflowEngine) -> WorkflowRun:
    """A running run with one queued step, never claimed, allowed 5 retries."""
    run = WorkflowRun(workflow="pikku.testing.fenced", input={})
    step = NewStep(
        run_id=run.id,
        name=STEP,
        kind=StepKind.QUEUED,
        function=RPC,
        input={},
        retries=5,
        retry_delay=0,
        backoff=Backoff.FIXED,
        queue="default",
        transactional=False,
    )
    engine.store.create_run(run, step, None)
    return run


def lapse_lease(engine: WorkflowEngine, run: WorkflowRun) -> None:
    """Make the step's lease read as lapsed on the store's clock, as if its worker died."""
    step = step_of(engine, run)
    assert engine.store.refresh_lease(step.id, -1, step.attempt), "the step is not running"


def claim(engine: WorkflowEngine, run: WorkflowRun) -> ClaimedStep | None:
    return engine.claim_step_for_execution(run.id, STEP, RPC, LEASE_MS)


def step_of(engine: WorkflowEngine, run: WorkflowRun) -> WorkflowStep:
    return engine.steps().get(run=run, name=STEP)


def supersede(engine: WorkflowEngine, run: WorkflowRun) -> tuple[ClaimedStep, ClaimedStep]:
    """Claim the step, lose its worker, and claim it again."""
    stale = claim(engine, run)
    assert stale is not None, "the first dispatch did not get the step"
    lapse_lease(engine, run)
    current = claim(engine, run)
    assert current is not None, "the lapsed step was not claimed again"
    assert current.attempt == stale.attempt + 1
    return stale, current


def dispatch_stale(
    engine: WorkflowEngine, run: WorkflowRun, outcome: Callable[[], Any]
) -> tuple[BaseException | None, ClaimedStep]:
    """Dispatch the step through the engine with a function that loses the step to a
    newer claim while it runs, and then does ``outcome``."""
    stale = claim(engine, run)
    assert stale is not None
    taken: dict[str, ClaimedStep | None] = {}

    def lose_then(outcome: Callable[[], Any] = outcome) -> Any:
        lapse_lease(engine, run)
        taken["current"] = claim(engine, run)
        return outcome()

    _behaviour.fn = lose_then
    surfaced: BaseException | None = None
    try:
        engine.execute_step(stale)
    except BaseException as exc:
        surfaced = exc
    finally:
        del _behaviour.fn
    current = taken.get("current")
    assert current is not None, "the step was never claimed from under the worker"
    return surfaced, current


class WorkflowFencingContract:
    """A step's writes are fenced to the claim that made them."""

    @pytest.fixture
    def fencing_engine(self) -> WorkflowEngine:
        raise NotImplementedError("provide a fencing_engine fixture")

    def test_stale_result_is_refused_and_current_lands(
        self, fencing_engine: WorkflowEngine
    ) -> None:
        engine = fencing_engine
        run = start_run(engine)
        stale, current = supersede(engine, run)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_result(stale.step_id, "stale", stale.attempt)
        engine.set_step_result(current.step_id, "fresh", current.attempt)
        step = step_of(engine, run)
        assert step.status == StepStatus.SUCCEEDED
        assert step.result == "fresh"
        assert step.attempt == current.attempt
        history = list(engine.attempts().filter(step=step).order_by("attempt"))
        assert len(history) == 2, "each claim keeps its own attempt"
        assert history[0].status == AttemptStatus.SUPERSEDED, (
            "the stale attempt was not closed as superseded, or was recorded with an "
            "outcome it was refused"
        )
        assert history[0].finished_at is not None
        assert history[0].result != "stale"
        assert history[1].status == StepStatus.SUCCEEDED
        assert history[1].result == "fresh"

    def test_stale_error_is_refused_and_does_not_fail_step(
        self, fencing_engine: WorkflowEngine
    ) -> None:
        engine = fencing_engine
        run = start_run(engine)
        stale, current = supersede(engine, run)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_error(stale.step_id, RuntimeError("stale"), stale.attempt)
        step = step_of(engine, run)
        assert step.status == StepStatus.RUNNING, "the stale attempt failed the step"
        assert step.error is None
        assert step.attempt == current.attempt

    def test_stale_attempt_cannot_renew_or_move_lease(self, fencing_engine: WorkflowEngine) -> None:
        engine = fencing_engine
        run = start_run(engine)
        stale, current = supersede(engine, run)
        held = step_of(engine, run).lease_expires_at
        assert not engine.refresh_step_lease(stale.step_id, 10 * LEASE_MS, stale.attempt), (
            "the stale attempt was told it still holds the step"
        )
        assert step_of(engine, run).lease_expires_at == held, "the stale renewal landed"
        assert not engine.refresh_step_lease(stale.step_id, None, stale.attempt)
        assert step_of(engine, run).lease_expires_at == held, "the stale release landed"
        assert engine.refresh_step_lease(current.step_id, 10 * LEASE_MS, current.attempt)
        renewed = step_of(engine, run).lease_expires_at
        assert renewed is not None
        assert held is not None
        assert renewed > held

    def test_stale_cannot_overwrite_succeeded_step(self, fencing_engine: WorkflowEngine) -> None:
        engine = fencing_engine
        run = start_run(engine)
        stale, current = supersede(engine, run)
        engine.set_step_result(current.step_id, "fresh", current.attempt)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_result(stale.step_id, "stale", stale.attempt)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_error(stale.step_id, RuntimeError("stale"), stale.attempt)
        step = step_of(engine, run)
        assert step.status == StepStatus.SUCCEEDED
        assert step.result == "fresh"
        assert step.error is None

    def test_stale_cannot_overwrite_failed_step(self, fencing_engine: WorkflowEngine) -> None:
        engine = fencing_engine
        run = start_run(engine)
        stale, current = supersede(engine, run)
        engine.set_step_error(current.step_id, RuntimeError("fresh"), current.attempt)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_result(stale.step_id, "stale", stale.attempt)
        step = step_of(engine, run)
        assert step.status == StepStatus.FAILED
        assert isinstance(step.error, dict)
        assert step.error["message"] == "fresh"
        assert step.result is None

    def test_racing_writes_only_current_lands(self, fencing_engine: WorkflowEngine) -> None:
        engine = fencing_engine
        for i in range(RACES):
            run = start_run(engine)
            stale, current = supersede(engine, run)
            outcomes: dict[str, BaseException | None] = {}
            barrier = threading.Barrier(2)

            def write(
                who: str,
                fn: Callable[[], Any],
                outcomes: dict[str, BaseException | None] = outcomes,
                barrier: threading.Barrier = barrier,
            ) -> None:
                try:
                    barrier.wait(timeout=30)
                    fn()
                    outcomes[who] = None
                except BaseException as exc:
                    outcomes[who] = exc
                finally:
                    connections.close_all()

            stale_write: Callable[[], Any]
            if i % 2 == 0:
                stale_write = functools.partial(
                    engine.set_step_result, stale.step_id, "stale", stale.attempt
                )
            else:
                stale_write = functools.partial(
                    engine.set_step_error, stale.step_id, RuntimeError("stale"), stale.attempt
                )
            current_write = functools.partial(
                engine.set_step_result, current.step_id, "fresh", current.attempt
            )
            order = [("current", current_write), ("stale", stale_write)]
            if i % 3 != 0:
                order.reverse()
            threads = [threading.Thread(target=write, args=pair) for pair in order]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert isinstance(outcomes["stale"], WorkflowStepSupersededError), (
                f"race {i}: {outcomes['stale']!r}"
            )
            assert outcomes["current"] is None, f"race {i}: {outcomes['current']!r}"
            step = step_of(engine, run)
            assert step.status == StepStatus.SUCCEEDED, f"race {i}"
            assert step.result == "fresh", f"race {i}"

    def test_third_claim_fences_out_both_before_it(self, fencing_engine: WorkflowEngine) -> None:
        engine = fencing_engine
        run = start_run(engine)
        first, second = supersede(engine, run)
        lapse_lease(engine, run)
        third = claim(engine, run)
        assert third is not None
        assert third.attempt == second.attempt + 1
        held = step_of(engine, run).lease_expires_at
        for stale in (first, second):
            with pytest.raises(WorkflowStepSupersededError):
                engine.set_step_result(stale.step_id, "stale", stale.attempt)
            with pytest.raises(WorkflowStepSupersededError):
                engine.set_step_error(stale.step_id, RuntimeError("stale"), stale.attempt)
            assert not engine.refresh_step_lease(stale.step_id, 10 * LEASE_MS, stale.attempt)
        assert step_of(engine, run).lease_expires_at == held
        engine.set_step_result(third.step_id, "third", third.attempt)
        step = step_of(engine, run)
        assert step.status == StepStatus.SUCCEEDED
        assert step.result == "third"

    def test_superseded_dispatch_with_missing_function_is_quiet(
        self, fencing_engine: WorkflowEngine
    ) -> None:
        engine = fencing_engine
        run = start_run(engine)

        def missing() -> Any:
            raise StepFunctionNotFoundError(RPC)

        surfaced, current = dispatch_stale(engine, run, missing)
        step = step_of(engine, run)
        assert step.status == StepStatus.RUNNING, "the stale attempt failed the step"
        assert step.attempt == current.attempt
        assert engine.runs().get(id=run.id).status == "running", (
            "the stale attempt suspended the run"
        )
        assert surfaced is None, "a superseded dispatch ends quietly"

    def test_superseded_dispatch_that_raises_is_quiet(self, fencing_engine: WorkflowEngine) -> None:
        engine = fencing_engine
        run = start_run(engine)

        def declined() -> Any:
            raise RuntimeError("the card was declined")

        surfaced, current = dispatch_stale(engine, run, declined)
        assert surfaced is None, "the stale failure surfaced"
        step = step_of(engine, run)
        assert step.status == StepStatus.RUNNING, "the stale attempt failed the step"
        assert step.error is None
        assert step.attempt == current.attempt
        assert engine.runs().get(id=run.id).status == "running"

    def test_superseded_dispatch_that_succeeds_records_nothing(
        self, fencing_engine: WorkflowEngine
    ) -> None:
        engine = fencing_engine
        run = start_run(engine)
        surfaced, current = dispatch_stale(engine, run, lambda: "stale")
        assert surfaced is None
        step = step_of(engine, run)
        assert step.status == StepStatus.RUNNING, "the stale result landed"
        assert step.result is None
        assert step.attempt == current.attempt

    def test_stale_claim_token_of_same_attempt_is_refused(
        self, fencing_engine: WorkflowEngine
    ) -> None:
        """A claim that did not survive (as a claim made on a database that then
        failed over) is refused even where the step was claimed again as the same
        attempt number: the claim token, not the attempt, fences it."""
        engine = fencing_engine
        run = start_run(engine)
        stale = claim(engine, run)
        assert stale is not None
        # The claim is withdrawn (the step back at the attempt before it) and the step
        # claimed again: the same attempt number, under a new claim.
        assert engine.store.withdraw_attempt(
            stale.step_id, stale.attempt, error={"type": "Lost"}, token=stale.claim_token
        )
        assert engine.store.reschedule_suspended(stale.step_id, engine.clock.now())
        current = claim(engine, run)
        assert current is not None
        assert current.attempt == stale.attempt, "the claim took another attempt number"
        assert current.claim_token > stale.claim_token
        assert step_of(engine, run).claim_token == current.claim_token
        token = stale.claim_token
        assert not engine.refresh_step_lease(stale.step_id, 10 * LEASE_MS, stale.attempt, token)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_result(stale.step_id, "stale", stale.attempt, token=token)
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_error(stale.step_id, RuntimeError("stale"), stale.attempt, token=token)
        assert not engine.store.withdraw_attempt(
            stale.step_id, stale.attempt, error={"type": "Stale"}, token=token
        )
        _behaviour.fn = lambda: "stale"
        try:
            assert engine.execute_step(stale) is StepOutcome.SUPERSEDED
        finally:
            del _behaviour.fn
        step = step_of(engine, run)
        assert (step.status, step.result, step.error) == (StepStatus.RUNNING, None, None)
        assert engine.refresh_step_lease(
            current.step_id, 10 * LEASE_MS, current.attempt, current.claim_token
        )
        engine.set_step_result(
            current.step_id, "current", current.attempt, token=current.claim_token
        )
        step = step_of(engine, run)
        assert (step.status, step.result) == (StepStatus.SUCCEEDED, "current")

    def test_step_code_reads_its_claims_fencing_token(self, fencing_engine: WorkflowEngine) -> None:
        engine = fencing_engine
        run = start_run(engine)
        stale, current = supersede(engine, run)
        assert current.claim_token > stale.claim_token
        assert fencing_token() is None  # outside a step
        _behaviour.fn = fencing_token
        try:
            assert engine.execute_step(current) is StepOutcome.SUCCEEDED
        finally:
            del _behaviour.fn
        assert step_of(engine, run).result == current.claim_token
