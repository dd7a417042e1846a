"""The run state machine: ending, suspending, waking and parking runs, and the
steps that settle with a run (child steps, sleeps, suspensions)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError

from pikku_django.leases.base import Lease
from pikku_django.models import RunStatus, StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.wakeups import announce_run_end
from pikku_django.workflows._values import Chained, StepDone
from pikku_django.workflows.clock import Clock
from pikku_django.workflows.compose._branches import branch_settled
from pikku_django.workflows.compose._child_outcome import child_step_outcome
from pikku_django.workflows.errors import storable_text
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.runs._django_signals import RunEvents
from pikku_django.workflows.store import WorkflowStore

logger = workflow_logger(__name__)

#: How long a pass whose run lease is held elsewhere waits before trying again.
LEASE_TAKEN_RETRY = timedelta(seconds=1)


def describe_error(error: Any) -> str:
    """``Type: message`` of a stored error (a dict from serialize_error)."""
    if not isinstance(error, dict):
        return str(error)
    kind, message = error.get("type") or "Error", error.get("message") or ""
    return f"{kind}: {message}" if message else str(kind)


class RunStates:
    """Moves runs between statuses; every write is guarded by the status it expects."""

    def __init__(self, store: WorkflowStore, clock: Clock, events: RunEvents) -> None:
        self.store = store
        self.clock = clock
        #: The signals sent once a change commits.
        self.events = events

    def wake(self, run_id: uuid.UUID, at: datetime | None = None) -> None:
        """Mark a running run as needing a pass (now, or at ``at``)."""
        if self.store.wake_run(run_id, at or self.clock.now()):
            self.store.notify()

    def wake_soon(self, run_id: uuid.UUID, after: timedelta = LEASE_TAKEN_RETRY) -> None:
        """Wake a run ``after`` from now (a second by default): spends no retry budget."""
        try:
            self.store.wake_run(run_id, self.clock.now() + after)
        except DatabaseError:
            logger.exception(
                "Could not reschedule run %s; its pass timeout or the recovery sweep will",
                run_id,
            )

    def park(self, run: WorkflowRun, seen_wakes: int, wake_at: datetime | None) -> None:
        """Record when the run next needs a pass, unless something woke it meanwhile."""
        self.store.park_run(run.id, seen_wakes, None if run.inline else wake_at)

    def count_pass_error(self, run_id: uuid.UUID) -> int | None:
        """Count one more pass that a data or programming error ended: how many in a
        row now (None if the run is no longer running, or the count failed too)."""
        try:
            return self.store.count_pass_error(run_id)
        except DatabaseError:
            logger.exception("Could not count the failed pass of run %s", run_id)
            return None

    def finish(
        self, run: WorkflowRun, status: str, *, output: Any = None, error: Any = None
    ) -> None:
        """End a running run (completed, failed) and settle the parent steps waiting on it."""
        changed, announced = self._end(run, status, output, error)
        self._ended(run, status, error, changed=changed, announced=announced)

    def finish_after(
        self,
        done: StepDone,
        run: WorkflowRun,
        status: str,
        *,
        output: Any = None,
        error: Any = None,
        pass_wake_at: datetime,
        release: Lease | None = None,
    ) -> Chained | None:
        """Record ``done`` (a step of ``run`` succeeded) and end the run as
        :meth:`finish` does, together; None (and nothing written) when the attempt
        was superseded. Where the end waits on a transaction of its own (a plain
        parent step waits on the run), the run is due at ``pass_wake_at`` meanwhile.
        ``release``: the run's lease, released with its end where the store can."""
        store = self.store
        if store.chains_in_one_statement:
            chained = store.settle_then_finish(
                done,
                run.id,
                status,
                output,
                error,
                wake_at=self.clock.now(),
                pass_wake_at=pass_wake_at,
                release=release,
            )
            if chained is None:
                return None
            changed, announced = bool(chained.finished), chained.finished is not None
            if chained.finished is None:
                changed = self._end_in_transaction(run.id, status, output, error)
        else:
            with store.atomic():
                settled = store.settle(
                    done.step_id,
                    done.attempt,
                    StepStatus.SUCCEEDED,
                    result=done.result,
                    token=done.claim_token,
                )
                if settled is None:
                    return None
                changed, announced = self._end(run, status, output, error)
            chained = Chained(settled.result, settled.run_status, settled.run_wakes)
        self._ended(run, status, error, changed=changed, announced=announced)
        return replace(chained, finished=changed)

    def _end(self, run: WorkflowRun, status: str, output: Any, error: Any) -> tuple[bool, bool]:
        """Write the end of a running run: whether it changed, and whether its end
        was announced with it."""
        changed = self.store.finish_run(run.id, status, output, error, wake_at=self.clock.now())
        if changed is not None:  # the one statement announced it
            return changed, True
        return self._end_in_transaction(run.id, status, output, error), False

    def _end_in_transaction(self, run_id: uuid.UUID, status: str, output: Any, error: Any) -> bool:
        with self.store.atomic():
            changed = self.store.end_run(run_id, RunStatus(status), output, error)
            if changed:
                self.settle_parents(run_id, status, output, error)
        return changed

    def _ended(
        self, run: WorkflowRun, status: str, error: Any, *, changed: bool, announced: bool
    ) -> None:
        """Announce, log and signal the end of ``run`` once written (if it changed)."""
        if not changed:
            return
        if not announced:
            announce_run_end(self.store.using, run.id, notifying=self.store.notifying)
        with log_context(workflow=run.workflow, run_id=str(run.id)):
            if status == RunStatus.FAILED:
                logger.warning("Run failed: %s", describe_error(error))
            else:
                logger.info("Run %s", status)
        self.events.run_finished(run, status, error)

    def settle_parents(self, child_id: uuid.UUID, status: str, output: Any, error: Any) -> None:
        """A child run ended: settle the parent steps waiting on it and wake their runs."""
        parents = list(self.store.steps().filter(child_run_id=child_id, status=StepStatus.RUNNING))
        step_status, result, failure = child_step_outcome(child_id, status, output, error)
        for step in parents:
            self.finish_marker(
                step, step_status, result=result, error=failure, final=failure is not None
            )
            if step.group_id is None or branch_settled(
                self.store, step.group_id, failed=status != RunStatus.COMPLETED
            ):
                self.wake(step.run_id)

    def suspend(self, run: WorkflowRun, reason: str) -> None:
        """Suspend a running run with ``reason`` (made storable: it may quote an error)."""
        reason = storable_text(reason)
        changed = self.store.suspend_run(run.id, reason)
        if changed:
            with log_context(workflow=run.workflow, run_id=str(run.id)):
                logger.info("Run suspended: %s", reason or "(no reason given)")
            self.events.run_suspended(run, reason)

    def suspend_for_step(self, run: WorkflowRun, step: WorkflowStep) -> None:
        """Suspend the run at ``step`` (a ``ctx.suspend``, or a missing function)."""
        reason = step.error.get("message", "") if isinstance(step.error, dict) else ""
        if step.kind == StepKind.SUSPEND:
            reason = step.input.get("reason", "") if isinstance(step.input, dict) else ""
        elif isinstance(step.error, dict) and step.error.get("code"):
            reason = f"{step.error['code']}: {reason}"
        self.suspend(run, reason)

    def finish_marker(
        self,
        step: WorkflowStep,
        status: str,
        *,
        result: Any = None,
        error: Any = None,
        final: bool = False,
    ) -> None:
        """Settle a step that has no worker attempt of its own (sleep, suspend, child)."""
        self.store.settle_marker(
            step.id,
            max(step.attempt, 1),
            StepStatus(status),
            result=result,
            error=error,
            retries=0 if final else step.retries,
        )

    def inline_root(self, run_id: uuid.UUID) -> uuid.UUID:
        """The top run of the tree of parent runs that ``run_id`` is a child of."""
        seen = {run_id}
        while True:
            parent = (
                self.store.steps()
                .filter(child_run_id=run_id, kind=StepKind.CHILD)
                .values_list("run_id", flat=True)
                .first()
            )
            if parent is None or parent in seen:
                return run_id
            seen.add(parent)
            run_id = parent
