"""Inline steps: run inside the orchestration pass, their outcome written after."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from pikku_django.models import StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.models.fields import readable
from pikku_django.workflows import registry
from pikku_django.workflows._values import (
    NewStep,
    Pause,
    StepOptions,
    Wake,
    default_worker_id,
    to_json,
)
from pikku_django.workflows.errors import (
    NotSerializableError,
    StepFailedError,
    StepFunctionNotFoundError,
    serialize_error,
)
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.passes._step_options import retry_delay_for
from pikku_django.workflows.runs._state import LEASE_TAKEN_RETRY, RunStates
from pikku_django.workflows.steps._claims import Claims
from pikku_django.workflows.steps._execution import Execution
from pikku_django.workflows.steps._timeouts import check_elapsed
from pikku_django.workflows.store.step_writes import StepRow

logger = workflow_logger(__name__)


def fresh(value: Any) -> Any:
    """A stored JSON value as workflow code gets it: a copy it may change freely, so
    no change reaches what a later pass replays (:class:`UnreadableValueError` for one
    Python cannot read back, which fails the run with the reason)."""
    if isinstance(value, dict | list):
        return copy.deepcopy(value)
    return readable(value, "A stored value (a step's result or an event's data)")


#: Where :func:`fresh_result` keeps a step's result pickled, on the step's row.
_PICKLED = "_pikku_result_pickle"


def fresh_result(step: WorkflowStep) -> Any:
    """``fresh(step.result)``, for a step replayed on pass after pass: its result is
    pickled once (kept on the row while the result is the same object) and each
    copy unpickled, which costs a fraction of a deep copy."""
    value = step.result
    if value is None or not isinstance(value, dict | list):
        return readable(value, f"The result of step {step.name!r}")
    kept = vars(step).get(_PICKLED)
    if kept is None or kept[0] is not value:
        kept = (value, pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
        vars(step)[_PICKLED] = kept
    # Bytes this process made from a JSON value: nothing from outside is unpickled.
    return pickle.loads(kept[1])  # noqa: S301


class _StepExistsError(Exception):
    """The step was stored by another pass: roll back this attempt's writes."""


class _WriteFailedError(Exception):
    """Storing a step's outcome failed (its cause): not a failure of the step."""


class InlineSteps:
    """Runs a pass's inline steps, attempt after attempt, until one settles."""

    def __init__(self, states: RunStates, claims: Claims, execution: Execution) -> None:
        self.states = states
        self.store = states.store
        self.clock = states.clock
        self.claims = claims
        self.execution = execution

    def create(self, run: WorkflowRun, **fields: Any) -> WorkflowStep:
        """Insert a step of ``run`` (with its priority); the one stored already if
        another pass did first."""
        fields.setdefault("priority", run.priority)
        group = fields.pop("group", None)
        row = StepRow(run.id, group_id=None if group is None else group.id, **fields)
        return self.store.record_step(row).step

    def run(
        self,
        run: WorkflowRun,
        name: str,
        step: WorkflowStep | None,
        options: StepOptions,
        data: Any,
        remember: Callable[[WorkflowStep], None],
    ) -> Any:
        """Run an inline step in this pass: its result; Pause until a retry is due;
        StepFailedError once no attempt is left. ``remember`` is given the step's row
        each time it is read."""
        if step is None:
            payload = to_json(data, f"The input of step {name!r}")
            step = self._first_attempt(run, name, options, payload)
            remember(step)
        while True:
            if step.status == StepStatus.SUCCEEDED:
                return fresh_result(step)
            if step.status == StepStatus.FAILED and step.attempt >= step.attempts_allowed:
                raise StepFailedError(step.name, step.error)
            due = step.available_at
            now = self.clock.now()
            if step.status == StepStatus.FAILED and due is not None and due > now:
                if not run.inline:
                    raise Pause(due)
                self.clock.sleep((due - now).total_seconds())
            claimed = self.claims.claim_inline(step)
            if claimed is None:
                raise Pause(self.clock.now() + LEASE_TAKEN_RETRY)
            assert options.fn is not None
            self.execution.execute(claimed, options.fn, Wake.NONE)
            step = self.store.steps().get(id=step.id)
            remember(step)

    def _first_attempt(
        self, run: WorkflowRun, name: str, options: StepOptions, payload: Any
    ) -> WorkflowStep:
        """Run a new inline step's first attempt, then write the step with its outcome.

        Nothing is written before the function returns: a crash meanwhile leaves no
        row, and the next pass runs the step again, as it would a lapsed attempt.
        Returns the step as stored, settled (or as another pass of the run stored it
        first); Pause if the run stopped running meanwhile (its outcome is not stored).
        """
        new = NewStep.of(run, name, StepKind.INLINE, options, payload)
        worker = default_worker_id()
        started = timezone.now()
        fn = options.fn
        assert fn is not None
        what = f"The result of step {name!r}"

        def succeeded(result: Any) -> tuple[int, Any] | None:
            try:
                return self.store.insert_settled(
                    new,
                    status=StepStatus.SUCCEEDED,
                    result=result,
                    error=None,
                    available_at=None,
                    worker=worker,
                    started_at=started,
                )
            except DatabaseError as exc:
                raise _WriteFailedError from exc  # the engine's write, not the step's

        stored: tuple[int, Any] | None = None
        ran = False  # the function returned, but its outcome was not stored
        events = self.states.events
        info = events.inline_attempt_info(run, name, options.queue, worker)
        began = time.monotonic()
        events.step_attempt_started(info)
        with log_context(workflow=run.workflow, run_id=str(run.id), step=name, attempt=1):
            try:
                # The function gets a copy: the input is stored as it was given.
                if options.transactional:
                    # The function's writes and the step's row commit together.
                    with self.store.atomic():
                        result = to_json(registry.call_step_function(fn, fresh(payload)), what)
                        check_elapsed(name, 1, new.timeout, began)
                        stored = succeeded(result)
                        if stored is None:
                            raise _StepExistsError  # rolls the function's writes back
                else:
                    result = to_json(registry.call_step_function(fn, fresh(payload)), what)
                    check_elapsed(name, 1, new.timeout, began)
                    stored = succeeded(result)
                if stored is not None:
                    step_id, as_stored = stored
                    events.step_attempt_succeeded(info, time.monotonic() - began)
                    return WorkflowStep(
                        id=step_id,
                        **new.columns(),
                        status=StepStatus.SUCCEEDED,
                        result=as_stored,
                        attempt=1,
                    )
                ran = True
            except _StepExistsError:
                ran = True
            except _WriteFailedError as exc:
                raise exc.__cause__ from None  # type: ignore[misc]
            except StepFunctionNotFoundError as exc:
                error = serialize_error(exc)
                self.store.record_step(
                    StepRow(**new.columns(), status=StepStatus.SUSPENDED, error=error)
                )
                self.states.suspend(run, f"RPC_NOT_FOUND: {exc}")
                raise Pause(None) from None
            except Exception as exc:
                final = isinstance(exc, NotSerializableError)
                exhausted = final or options.retries < 1
                delay = retry_delay_for(options, 1)
                if final:
                    new = dataclasses.replace(new, retries=0)
                self.store.insert_settled(
                    new,
                    status=StepStatus.FAILED,
                    result=None,
                    error=serialize_error(exc),
                    available_at=None if exhausted else self.clock.now() + delay,
                    worker=worker,
                    started_at=started,
                )
                (logger.warning if exhausted else logger.info)(
                    "Step failed with %s: %s (%s)",
                    type(exc).__name__,
                    exc,
                    "no attempts left" if exhausted else "will retry",
                )
                events.step_attempt_failed(
                    info, time.monotonic() - began, exc, will_retry=not exhausted
                )
        step = self.store.steps().filter(run_id=run.id, name=name).first()
        if step is None:
            logger.info("Run %s stopped running during step %s: outcome not stored", run.id, name)
            raise Pause(None)
        if ran:
            logger.warning("Step %s was stored by another pass; its outcome stands", name)
        return step
