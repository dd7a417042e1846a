"""Executing a claimed step: call its function, get a typed outcome, settle it fenced."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from pikku_django.models import RunStatus, StepStatus
from pikku_django.workflows import registry
from pikku_django.workflows._dberrors import retrying
from pikku_django.workflows._values import (
    CarriedRun,
    ClaimedStep,
    Settled,
    StepOutcome,
    Wake,
    to_json,
)
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.errors import (
    NotSerializableError,
    StepFunctionNotFoundError,
    WorkflowStepSupersededError,
    serialize_error,
    storable_error,
)
from pikku_django.workflows.logcontext import Lazy, log_context, workflow_logger
from pikku_django.workflows.passes._step_options import retry_delay_for
from pikku_django.workflows.runs._django_signals import AttemptInfo
from pikku_django.workflows.runs._state import RunStates
from pikku_django.workflows.steps._current import calling
from pikku_django.workflows.steps._timeouts import check_in_time

logger = workflow_logger(__name__)

#: What a step's result is offered to before it is recorded (see ``execute_step``).
Then = Callable[[Any], Settled | None]

#: How long past a lapsed run lease a run left by a dead worker falls due again.
RECOVERY_MARGIN = timedelta(seconds=2)


class Execution:
    """Runs claimed steps; every write carries the attempt that made it."""

    def __init__(self, states: RunStates, config: Callable[[], EngineConfig]) -> None:
        self.states = states
        self.store = states.store
        self.clock = states.clock
        self._config = config

    def wake_at(self, wake: Wake) -> datetime:
        """When the run falls due after a settle: now, or (``Wake.PASS``) once the
        settling thread's run lease would have lapsed."""
        now = self.clock.now()
        if wake is Wake.PASS:
            return now + timedelta(milliseconds=self._config().run_lease_ms) + RECOVERY_MARGIN
        return now

    # -- fenced writes ---------------------------------------------------------------

    def set_result(
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        wake: Wake = Wake.NOW,
        token: int | None = None,
    ) -> Settled | None:
        """Record the result of ``attempt`` (claimed with ``token``);
        WorkflowStepSupersededError if it was replaced. None when the result was not
        storable and failed the step instead."""
        try:
            payload = to_json(result, f"The result of step {step_id}")
        except NotSerializableError as exc:
            self.set_error(step_id, exc, attempt, wake=wake, final=True, token=token)
            return None
        settled = self.store.settle(
            step_id,
            attempt,
            StepStatus.SUCCEEDED,
            result=payload,
            wake=wake,
            wake_at=self.wake_at(wake),
            token=token,
        )
        if settled is None:
            raise WorkflowStepSupersededError(step_id, attempt)
        if settled.ended:
            logger.info("Run %s", RunStatus.COMPLETED)
            self.states.events.run_completed_by_step(settled)
        return settled

    def set_error(
        self,
        step_id: int,
        error: BaseException | dict[str, Any],
        attempt: int,
        *,
        wake: Wake = Wake.NOW,
        final: bool = False,
        token: int | None = None,
    ) -> bool:
        """Record that ``attempt`` (claimed with ``token``) failed; True if no attempt
        is left. ``wake`` applies once no attempt is left. WorkflowStepSupersededError
        if the attempt was replaced."""
        data = (
            serialize_error(error)
            if isinstance(error, BaseException)
            else storable_error(dict(error))
        )
        step = (
            self.store.steps().filter(id=step_id).only("retries", "retry_delay", "backoff").first()
        )
        if step is None:
            raise WorkflowStepSupersededError(step_id, attempt)
        exhausted = final or attempt >= step.attempts_allowed
        now = self.clock.now()
        retry_at = None if exhausted else now + retry_delay_for(step, attempt)
        settled = self.store.settle(
            step_id,
            attempt,
            StepStatus.FAILED,
            error=data,
            available_at=retry_at,
            # A final failure spends the remaining attempts, so nothing retries it.
            retries=attempt - 1 if final else None,
            wake=wake if exhausted else Wake.NONE,
            wake_at=self.wake_at(wake),
            token=token,
        )
        if settled is None:
            raise WorkflowStepSupersededError(step_id, attempt)
        if not exhausted:
            self.store.notify()
        return exhausted

    # -- executing ------------------------------------------------------------------

    def execute_step(
        self, claimed: ClaimedStep, *, wake: Wake = Wake.NOW, then: Then | None = None
    ) -> StepOutcome:
        """Run a claimed queued step by its registered function. ``then`` (for a step
        that is not transactional) is given the result first: it may record it with
        what follows (the Settled it returns), or leave it to be recorded here (None)."""
        definition = registry.get_step(claimed.function)
        with self._log_context(claimed):
            if definition is None:
                return self._function_missing(claimed)
            return self._run(claimed, definition.fn, wake, then)

    def execute(self, claimed: ClaimedStep, fn: Callable[..., Any], wake: Wake) -> StepOutcome:
        """Run a claimed step by ``fn`` (an inline step's callable)."""
        with self._log_context(claimed):
            return self._run(claimed, fn, wake)

    def _log_context(self, claimed: ClaimedStep) -> AbstractContextManager[None]:
        """The step's log fields; its workflow is read only if something is logged."""
        if claimed.carried is not None:
            workflow: Any = claimed.carried.run.workflow
        else:
            store, run_id = self.store, claimed.run_id
            # Read (and its query built) only if a record shows it.
            workflow = Lazy(
                lambda: store.runs().filter(id=run_id).values_list("workflow", flat=True).first()
            )
        return log_context(
            workflow=workflow,
            run_id=str(claimed.run_id),
            step=claimed.name,
            attempt=claimed.attempt,
        )

    def _run(
        self,
        claimed: ClaimedStep,
        fn: Callable[..., Any],
        wake: Wake,
        then: Then | None = None,
    ) -> StepOutcome:
        info, began = self.attempt_started(claimed)
        outcome = self._run_signalled(claimed, fn, wake, info, began, then)
        return self._ended(outcome, info, began)

    def attempt_started(self, claimed: ClaimedStep) -> tuple[AttemptInfo | None, float]:
        """Announce that ``claimed`` starts: what :meth:`settle_call` then takes."""
        info = self.states.events.attempt_info(claimed)
        self.states.events.step_attempt_started(info)
        return info, time.monotonic()

    def settle_call(
        self,
        claimed: ClaimedStep,
        wake: Wake,
        info: AttemptInfo | None,
        began: float,
        *,
        value: Any = None,
        error: Exception | None = None,
    ) -> StepOutcome:
        """Record what a step's function returned (``value``) or raised (``error``)
        when it was called elsewhere (an async step, on the worker's event loop), as
        :meth:`execute_step` records it, fenced by the attempt."""
        what = f"The result of step {claimed.name!r}"

        def settle() -> Settled | None:
            if error is not None:
                raise error
            result = to_json(value, what)
            check_in_time(claimed)  # a late result is refused: the attempt timed out
            done = success_wake(claimed, wake)
            return retrying(
                lambda: self.set_result(
                    claimed.step_id, result, claimed.attempt, wake=done, token=claimed.claim_token
                )
            )

        with self._log_context(claimed):
            return self._ended(self._settled(claimed, wake, info, began, settle), info, began)

    def _ended(self, outcome: StepOutcome, info: AttemptInfo | None, began: float) -> StepOutcome:
        if outcome is StepOutcome.SUCCEEDED:
            self.states.events.step_attempt_succeeded(info, time.monotonic() - began)
        elif outcome is StepOutcome.SUPERSEDED:
            self.states.events.step_attempt_superseded(info, time.monotonic() - began)
        return outcome

    def _run_signalled(
        self,
        claimed: ClaimedStep,
        fn: Callable[..., Any],
        wake: Wake,
        info: AttemptInfo | None,
        began: float,
        then: Then | None = None,
    ) -> StepOutcome:
        what = f"The result of step {claimed.name!r}"
        done = success_wake(claimed, wake)

        def transaction() -> Settled | None:
            # The function's writes and the fenced result commit together, or not at
            # all: a superseded attempt's (or a stopped run's) writes roll back.
            with self.store.atomic():
                with calling(claimed):
                    result = to_json(registry.call_step_function(fn, claimed.input), what)
                check_in_time(claimed)  # a late attempt's writes roll back
                self._check_run_running(claimed)
                return self.set_result(
                    claimed.step_id, result, claimed.attempt, wake=done, token=claimed.claim_token
                )

        def call_and_settle() -> Settled | None:
            if claimed.transactional:
                # A deadlock or lock wait rolls it all back: made again, same attempt.
                return retrying(transaction)
            with calling(claimed):
                result = to_json(registry.call_step_function(fn, claimed.input), what)
            check_in_time(claimed)  # a late result is refused: the attempt timed out
            if then is not None:
                settled = then(result)
                if settled is not None:
                    return settled
            return retrying(
                lambda: self.set_result(
                    claimed.step_id, result, claimed.attempt, wake=done, token=claimed.claim_token
                )
            )

        return self._settled(claimed, wake, info, began, call_and_settle)

    def _settled(
        self,
        claimed: ClaimedStep,
        wake: Wake,
        info: AttemptInfo | None,
        began: float,
        settle: Callable[[], Settled | None],
    ) -> StepOutcome:
        """The outcome of ``settle`` (the call and its fenced result), its failure
        recorded as the step's error."""
        try:
            settled = settle()
            if claimed.carried is not None and settled is not None:
                _carry_result(claimed, claimed.carried, settled)
        except WorkflowStepSupersededError as exc:
            logger.warning("%s: its result was not recorded", exc)
            return StepOutcome.SUPERSEDED
        except _RunStoppedError as stopped:
            return self._run_stopped(claimed, stopped.status)
        except StepFunctionNotFoundError:
            return self._function_missing(claimed)
        except Exception as exc:
            try:
                failure: Exception = exc
                exhausted = retrying(
                    lambda: self.set_error(
                        claimed.step_id,
                        failure,
                        claimed.attempt,
                        wake=wake,
                        final=isinstance(failure, NotSerializableError),
                        token=claimed.claim_token,
                    )
                )
            except WorkflowStepSupersededError as superseded:
                logger.warning("%s: its error was not recorded", superseded)
                return StepOutcome.SUPERSEDED
            (logger.info if not exhausted else logger.warning)(
                "Step failed with %s: %s (%s)",
                type(exc).__name__,
                exc,
                "no attempts left" if exhausted else "will retry",
            )
            self.states.events.step_attempt_failed(
                info, time.monotonic() - began, exc, will_retry=not exhausted
            )
            return StepOutcome.FAILED if exhausted else StepOutcome.RETRYING
        return StepOutcome.SUCCEEDED

    def _check_run_running(self, claimed: ClaimedStep) -> None:
        """In a transactional step's transaction: lock its run, and roll the step's
        writes back (_RunStoppedError) unless the run is still running."""
        status = self.store.locked_run_status(claimed.run_id)
        if status != RunStatus.RUNNING:
            raise _RunStoppedError(str(status))

    def _run_stopped(self, claimed: ClaimedStep, status: str) -> StepOutcome:
        """The run ended while its transactional step ran: close the attempt."""
        logger.warning(
            "Run %s was %s while step %s ran: its writes were rolled back",
            claimed.run_id,
            status,
            claimed.name,
        )
        error = {
            "type": "WorkflowRunStopped",
            "message": f"Run {claimed.run_id} was {status} while this step ran; "
            "the step's writes were rolled back",
            "code": "RUN_STOPPED",
        }
        try:
            self.store.settle(
                claimed.step_id,
                claimed.attempt,
                StepStatus.FAILED,
                error=error,
                retries=claimed.attempt - 1,
                token=claimed.claim_token,
            )
        except Exception:
            logger.exception("Could not close step %s of stopped run", claimed.name)
        return StepOutcome.RUN_STOPPED

    def _function_missing(self, claimed: ClaimedStep) -> StepOutcome:
        """The current attempt's function is missing: suspend the run (RPC_NOT_FOUND)."""
        error = serialize_error(StepFunctionNotFoundError(claimed.function))
        won = self.store.withdraw_attempt(
            claimed.step_id, claimed.attempt, error=error, token=claimed.claim_token
        )
        if not won:
            logger.warning(
                "Superseded attempt %d of step %s found no function %r; left to its new owner",
                claimed.attempt,
                claimed.name,
                claimed.function,
            )
            return StepOutcome.SUPERSEDED
        run = self.store.runs().get(id=claimed.run_id)
        self.states.suspend(run, f"RPC_NOT_FOUND: {error['message']}")
        return StepOutcome.SUSPENDED


def ends_run(claimed: ClaimedStep) -> bool:
    """Whether the success of ``claimed`` ends its run (``registry.end_runs_with``)."""
    definition = registry.get_step(claimed.function)
    return definition is not None and definition.ends_run


def success_wake(claimed: ClaimedStep, wake: Wake) -> Wake:
    """What the success of ``claimed`` does to its run: ends it, for a step that ends
    its run; else ``wake``."""
    return Wake.END if ends_run(claimed) else wake


def _carry_result(claimed: ClaimedStep, carried: CarriedRun, settled: Settled) -> None:
    """Bring the carried run up to date with its claimed step's success, and with its
    run as the settle found it (cancelled meanwhile, or woken)."""
    step = carried.steps.get(claimed.name)
    if step is None or step.id != claimed.step_id:
        return
    # The status last: the memo may look at this step from another thread.
    step.result, step.error = settled.result, None
    step.lease_expires_at = step.available_at = None
    step.attempt, step.status = claimed.attempt, StepStatus.SUCCEEDED
    carried.run.status = RunStatus.COMPLETED if settled.ended else settled.run_status
    carried.run.wakes = settled.run_wakes


class _RunStoppedError(Exception):
    """A transactional step's run is no longer running: roll its writes back."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status
