"""Run deadlines and suspension timeouts, enforced by the workers' due-work look.

A run past its ``deadline_at`` fails with :class:`WorkflowTimeoutError`: its steps
still waiting (scheduled, pending, suspended, due for a retry, or running) are
failed with it, so whatever a worker still returns for them is refused, and the
child runs it waits on are cancelled. A ``ctx.suspend(..., timeout=...)`` not
resumed in time is failed (the suspension's ``available_at`` is its timeout) and
its run set running again, for the workflow to get
:class:`SuspendTimeoutError` where it suspended.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pikku_django.models import RunStatus, StepKind, StepStatus, WorkflowStep
from pikku_django.workflows.errors import (
    SuspendTimeoutError,
    WorkflowRunStateError,
    WorkflowTimeoutError,
    serialize_error,
)
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.runs._state import RunStates
from pikku_django.workflows.store import WorkflowStore
from pikku_django.workflows.store.run_writes import OPEN_RUN

logger = workflow_logger(__name__)


def overdue_runs(store: WorkflowStore, now: datetime, limit: int) -> list[uuid.UUID]:
    """Open runs whose deadline is past, earliest first (the pikku_run_deadline index)."""
    return list(
        store.runs()
        .filter(status__in=OPEN_RUN, deadline_at__isnull=False, deadline_at__lte=now)
        .order_by("deadline_at")
        .values_list("id", flat=True)[:limit]
    )


def timed_out_suspensions(store: WorkflowStore, now: datetime, limit: int) -> list[WorkflowStep]:
    """Suspensions past their timeout, earliest first (the pikku_step_suspend_due index)."""
    return list(
        store.steps()
        .filter(
            kind=StepKind.SUSPEND,
            status=StepStatus.SUSPENDED,
            available_at__isnull=False,
            available_at__lte=now,
        )
        .order_by("available_at")[:limit]
    )


def next_deadline(store: WorkflowStore) -> datetime | None:
    """The earliest deadline of an open run or timeout of a suspension, past or to
    come (each the first in its index's order), or None."""
    deadline = (
        store.runs()
        .filter(status__in=OPEN_RUN, deadline_at__isnull=False)
        .order_by("deadline_at")
        .values_list("deadline_at", flat=True)
        .first()
    )
    timeout = (
        store.steps()
        .filter(kind=StepKind.SUSPEND, status=StepStatus.SUSPENDED, available_at__isnull=False)
        .order_by("available_at")
        .values_list("available_at", flat=True)
        .first()
    )
    return min((t for t in (deadline, timeout) if t is not None), default=None)


class RunDeadlines:
    """Fails runs past their deadline and times out suspensions."""

    def __init__(
        self,
        states: RunStates,
        cancel: Callable[[uuid.UUID], Any],
        drive_inline: Callable[[uuid.UUID], Any],
    ) -> None:
        self.states = states
        self.store = states.store
        self.clock = states.clock
        self._cancel = cancel
        self._drive_inline = drive_inline

    def enforce(self, limit: int = 100) -> int:
        """Time out what is due now: how many runs and suspensions were."""
        now = self.clock.now()
        done = 0
        for run_id in overdue_runs(self.store, now, limit):
            done += self.time_out_run(run_id, now)
        for step in timed_out_suspensions(self.store, now, limit):
            done += self.time_out_suspension(step, now)
        return done

    def has_due(self) -> bool:
        """Whether a deadline or a suspension's timeout is past now (a cheap look)."""
        now = self.clock.now()
        return bool(overdue_runs(self.store, now, 1) or timed_out_suspensions(self.store, now, 1))

    def time_out_run(self, run_id: uuid.UUID, now: datetime) -> bool:
        """Fail a run past its deadline, with its waiting steps; cancel its children."""
        run = self.store.runs().filter(id=run_id).first()
        if run is None or run.deadline_at is None:
            return False
        error = serialize_error(WorkflowTimeoutError(run.id, run.deadline_at.isoformat()))
        with self.store.atomic():
            steps = self.store.fail_overdue_run(run.id, now, error)
            if steps is None:
                return False
            self.states.settle_parents(run.id, RunStatus.FAILED, None, error)
            self.states.events.run_finished(run, RunStatus.FAILED, error)
        with log_context(workflow=run.workflow, run_id=str(run.id)):
            logger.warning("Run failed: passed its deadline of %s", run.deadline_at.isoformat())
        for step in steps:
            if step.kind == StepKind.CHILD and step.child_run_id is not None:
                with contextlib.suppress(WorkflowRunStateError):  # ended meanwhile
                    self._cancel(step.child_run_id)
        return True

    def time_out_suspension(self, step: WorkflowStep, now: datetime) -> bool:
        """Fail a suspension past its timeout and set its run running again."""
        error = serialize_error(SuspendTimeoutError(step.name, step.timeout or 0.0))
        with self.store.atomic():
            if not self.store.time_out_suspension(step.id, now, error):
                return False
            run = self.store.runs().filter(id=step.run_id).first()
            if run is None:
                return True
            self.store.resume_run(run.id, None if run.inline else self.clock.now())
            self.store.notify()
        with log_context(workflow=run.workflow, run_id=str(run.id)):
            logger.info("Suspension %s timed out: the run goes on", step.name)
        if run.inline:
            self._drive_inline(self.states.inline_root(run.id))
        return True
