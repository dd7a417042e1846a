"""One orchestration pass: replay the workflow over its recorded steps, under the
run's lease, and write where it stopped (parked, claimed a step, or ended)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError

from pikku_django.leases import HeldLease, LeaseLostError, LeaseTakenError
from pikku_django.models import RunStatus, StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows._dberrors import is_transient
from pikku_django.workflows._values import (
    CarriedRun,
    ClaimedStep,
    DueRun,
    NewStep,
    Pause,
    StepClaimer,
    StepOptions,
    to_json,
)
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.errors import (
    NotSerializableError,
    StepFunctionNotFoundError,
    UnknownPatchError,
    WorkflowStepSupersededError,
    serialize_error,
)
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.passes._determinism import replay_body
from pikku_django.workflows.passes._inline_steps import InlineSteps
from pikku_django.workflows.passes._memo import StepMemo
from pikku_django.workflows.passes._recorder import StepRecorder, StepsUnread
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.runs._versions import check_no_unknown_patch, version_admitted
from pikku_django.workflows.steps._timeouts import capped_lease_ms

logger = workflow_logger(__name__)

#: How soon a run this worker's code cannot pass is offered to the workers again.
NOT_CARRIED_RETRY = timedelta(seconds=2)


class Replay:
    """Orchestration passes over runs."""

    def __init__(
        self,
        inline: InlineSteps,
        config: Callable[[], EngineConfig],
        run_lease: Callable[[uuid.UUID], HeldLease],
    ) -> None:
        self.inline = inline
        self.states = inline.states
        self.store = inline.store
        self._config = config
        #: Passing database errors in a row, by run (this process's own count).
        self._transient: dict[uuid.UUID, int] = {}
        #: ``run_lease(run_id)``: the lease a pass holds, for a ``with`` block.
        self.run_lease = run_lease
        #: The succeeded steps of runs passed here, so a pass reads only the rest.
        self.memo = StepMemo()

    def orchestrate(
        self,
        run_id: uuid.UUID | str,
        claimer: StepClaimer | None,
        held: HeldLease | None,
        carried: CarriedRun | None,
        due: DueRun | None = None,
    ) -> ClaimedStep | None:
        with log_context(run_id=str(run_id), step=None, attempt=None):
            return self._orchestrate(run_id, claimer, held, carried, due)

    def _orchestrate(
        self,
        run_id: uuid.UUID | str,
        claimer: StepClaimer | None,
        held: HeldLease | None,
        carried: CarriedRun | None,
        due: DueRun | None,
    ) -> ClaimedStep | None:
        steps: dict[str, WorkflowStep] | None = None
        unread = False
        if held is not None and carried is not None:
            run: WorkflowRun | None = carried.run
            steps = carried.steps
        elif due is not None and due.run.id == run_id:
            run = due.run  # read by the claim, before the lease as a read here would be
            if due.stepless and claimer is not None:
                steps, unread = {}, True
        else:
            run = self.store.runs().filter(id=run_id).order_by().first()
        if run is None or run.status != RunStatus.RUNNING:
            if run is not None:
                self.memo.forget(run.id)
            return None  # settled or suspended: not replayed, no lease taken
        claimed = None
        try:
            # Every write of the pass is guarded by the run's status (and a park by
            # its wake count), so the run read before the lease is enough.
            if held is None:
                with self.run_lease(run.id):
                    claimed = self._signalled_pass(run, claimer, steps, unread)
            else:
                held.vouch()
                claimed = self._signalled_pass(run, claimer, steps, unread)
                held.vouch()
            self._transient.pop(run.id, None)
        except DatabaseError as exc:
            self._pass_failed(run, exc)
        except (LeaseTakenError, LeaseLostError) as exc:
            current = self.store.runs().filter(id=run.id).only("status").first()
            if current is not None and current.status == RunStatus.RUNNING:
                logger.info(
                    "Orchestrated elsewhere (%s); waking the run again shortly",
                    type(exc).__name__,
                )
                self.states.wake_soon(run.id)
            # else: the pass wrote its outcome; it stands
        # A step claimed by the pass is fenced by its own attempt: it runs even if
        # the run lease was lost afterwards.
        return claimed

    def _pass_failed(self, run: WorkflowRun, exc: DatabaseError) -> None:
        """A database error ended the pass: try again with backoff, and fail the run
        once a data or programming error has ended its passes too often in a row."""
        if is_transient(exc):
            tries = self._transient.get(run.id, 0) + 1
            self._transient[run.id] = tries
            if len(self._transient) > 10_000:
                self._transient.clear()
            delay = min(2.0 ** (tries - 1), 30.0)
            logger.warning(
                "The orchestration pass hit a passing database error (%s); trying again in %gs",
                exc,
                delay,
            )
            self.states.wake_soon(run.id, timedelta(seconds=delay))
            return
        logger.exception("The orchestration pass hit a database error")
        counted = self.states.count_pass_error(run.id)
        allowed = self._config().pass_error_tries
        if counted is not None and counted >= allowed:
            error = serialize_error(exc)
            error["message"] = (
                f"{error.get('message', '')} (the run's orchestration pass hit this database "
                f"error {counted} time(s) in a row)"
            )
            self.states.finish(run, RunStatus.FAILED, error=error)
            return
        self.states.wake_soon(run.id, timedelta(seconds=min(2.0 ** ((counted or 1) - 1), 30.0)))

    def _signalled_pass(
        self,
        run: WorkflowRun,
        claimer: StepClaimer | None,
        steps: dict[str, WorkflowStep] | None,
        unread: bool = False,
    ) -> ClaimedStep | None:
        self.states.events.run_pass_started(run)
        try:
            with log_context(workflow=run.workflow):
                if unread:
                    try:
                        return self._pass(run, claimer, steps, unread=True)
                    except StepsUnread:
                        steps = None  # reached something else first: read them, replay again
                return self._pass(run, claimer, steps)
        finally:
            self.states.events.run_pass_finished(run)

    def _pass(
        self,
        run: WorkflowRun,
        claimer: StepClaimer | None,
        steps: dict[str, WorkflowStep] | None,
        *,
        unread: bool = False,
    ) -> ClaimedStep | None:
        seen_wakes = run.wakes
        definition = registry.get_workflow(run.workflow)
        if definition is None:
            self.states.suspend(
                run, f"WORKFLOW_NOT_FOUND: no workflow is registered as {run.workflow!r}"
            )
            return None
        if not version_admitted(self.states, definition, run, self._config().carried_versions_only):
            self._not_carried(run, f"version {run.version!r} is not carried here")
            return None
        if steps is None:
            steps = self.memo.load(self.store, run.id)
        recorder = StepRecorder(
            run, steps, config=self._config(), inline=self.inline, claimer=claimer
        )
        recorder.unread = unread
        # Kept only when the pass ends with the run parked or at a claimed step.
        self.memo.forget(run.id)
        ctx = WorkflowContext(recorder)
        try:
            output = replay_body(definition.fn, ctx, ctx.input)
            check_no_unknown_patch(ctx, None)
        except Pause as pause:
            if recorder.claim_request is not None and recorder.claimer is not None:
                name, options, payload = recorder.claim_request
                claimed = self._claim_new_step(recorder, seen_wakes, name, options, payload)
                if claimed is not None or not unread:
                    self.memo.keep(run.id, recorder.steps)
                return claimed
            self.states.park(run, seen_wakes, pause.wake_at)
            self.memo.keep(run.id, recorder.steps)
            return None
        except StepFunctionNotFoundError as exc:
            self.states.suspend(run, f"RPC_NOT_FOUND: {exc}")
            return None
        except UnknownPatchError as exc:
            self._not_carried(run, str(exc))
            return None
        except (WorkflowStepSupersededError, LeaseLostError, DatabaseError):
            raise
        except Exception as exc:
            self.states.finish(run, RunStatus.FAILED, error=serialize_error(exc))
            return None
        try:
            payload = to_json(output, f"The output of workflow {run.workflow!r}")
        except NotSerializableError as exc:
            self.states.finish(run, RunStatus.FAILED, error=serialize_error(exc))
            return None
        self.states.finish(run, RunStatus.COMPLETED, output=payload)
        return None

    def _not_carried(self, run: WorkflowRun, why: str) -> None:
        """Leave a run this code cannot replay to workers that carry its code."""
        logger.warning("Run left to other workers: %s", why)
        self.memo.forget(run.id)
        self.states.wake_soon(run.id, NOT_CARRIED_RETRY)

    def _claim_new_step(
        self,
        recorder: StepRecorder,
        seen_wakes: int,
        name: str,
        options: StepOptions,
        payload: Any,
    ) -> ClaimedStep | None:
        """Store the queued step a pass reached as claimed by its claimer, parking the run."""
        claim = NewClaim.of(recorder, name, options, payload, self._config())
        stored = self.store.insert_claimed(
            claim.step, lease_ms=claim.lease_ms, worker=claim.worker, park_wakes=seen_wakes
        )
        if stored is None:
            # Stored meanwhile by another pass, or the run stopped running: look again.
            self.states.wake(recorder.run.id)
            return None
        return claim.stored(recorder, *stored)


@dataclass(frozen=True)
class NewClaim:
    """The queued step a pass reached, to be stored claimed by the pass's claimer."""

    step: NewStep
    options: StepOptions
    lease_ms: int
    worker: str
    #: When the claim was made (this process's monotonic clock).
    claimed_at: float

    @classmethod
    def of(
        cls,
        recorder: StepRecorder,
        name: str,
        options: StepOptions,
        payload: Any,
        config: EngineConfig,
    ) -> NewClaim:
        claimer = recorder.claimer
        assert claimer is not None
        lease_ms = capped_lease_ms(config.lease_ms_for_queue(options.queue), options.timeout)
        step = NewStep.of(recorder.run, name, StepKind.QUEUED, options, payload)
        return cls(step, options, lease_ms, claimer.worker, time.monotonic())

    def stored(
        self, recorder: StepRecorder, step_id: int, stored_input: Any, claim_token: int
    ) -> ClaimedStep:
        """The claimed step once stored as ``step_id`` (its input as stored, its claim
        ``claim_token``), added to the pass's steps, which its run carries to the pass
        after it."""
        row = WorkflowStep(
            id=step_id,
            **self.step.columns(),
            status=StepStatus.RUNNING,
            attempt=1,
            claim_token=claim_token,
        )
        row.input = stored_input
        recorder.remember(row)
        options = self.options
        return ClaimedStep(
            step_id=step_id,
            run_id=recorder.run.id,
            name=self.step.name,
            function=options.function,
            input=stored_input,  # as every later attempt reads it from the database
            attempt=1,
            transactional=options.transactional,
            lease_ms=self.lease_ms,
            queue=options.queue,
            carried=CarriedRun(recorder.run, recorder.steps),
            claimed_at=self.claimed_at,
            claim_token=claim_token,
            timeout=options.timeout,
            worker=self.worker,
        )
