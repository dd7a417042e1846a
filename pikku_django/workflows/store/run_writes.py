"""The writes that move a run between statuses, with the steps that settle with it
(sleeps, suspensions, child steps), its children, its deadline and its deletion.

Every write is guarded by the status it expects and says whether it won, so a
caller racing another (a pass, a cancel, a deadline) learns which of them did.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Model, Q, QuerySet, When
from django.db.models.deletion import Collector
from django.db.models.functions import Greatest
from django.utils import timezone

from pikku_django.models import (
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)

#: The statuses of a run that has not ended.
OPEN_RUN = (RunStatus.RUNNING, RunStatus.SUSPENDED)


def waiting_steps() -> Q:
    """A step that may still run or settle: its run's end must stop it."""
    return (
        Q(status__in=(StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.RUNNING))
        | Q(status=StepStatus.SUSPENDED)
        | Q(status=StepStatus.FAILED, attempt__lt=F("retries") + 1)
    )


@dataclass(frozen=True)
class StoppedStep:
    """A step a run's deadline failed: its kind, and the child run it waited on."""

    id: int
    kind: StepKind
    child_run_id: uuid.UUID | None


@dataclass(frozen=True)
class ChildBranch:
    """A parallel group's branch to store: its step's name, and its child run."""

    name: str
    run: WorkflowRun


class _Unordered(Collector):
    """Django's deletion collector, its looks for related rows left unordered (each
    model's default ordering would join a step's look to its run and sort it)."""

    def related_objects(self, related_model: type[Model], related_fields: Any, objs: Any) -> Any:
        return super().related_objects(related_model, related_fields, objs).order_by()


class RunWrites:
    """The run-level writes of :class:`~pikku_django.workflows.store.WorkflowStore`."""

    #: The database alias (the store's).
    using: str

    def _runs(self) -> QuerySet[WorkflowRun]:
        return WorkflowRun.objects.using(self.using)

    def _steps(self) -> QuerySet[WorkflowStep]:
        return WorkflowStep.objects.using(self.using)

    def _attempts(self) -> QuerySet[StepAttempt]:
        return StepAttempt.objects.using(self.using)

    # -- a running run ---------------------------------------------------------------

    def wake_run(self, run_id: uuid.UUID, at: datetime) -> bool:
        """Make a running run due at ``at``, counted as a wake: whether it was running."""
        return bool(
            self._runs()
            .filter(id=run_id, status=RunStatus.RUNNING)
            .update(wake_at=at, wakes=F("wakes") + 1, updated_at=timezone.now())
        )

    def park_run(self, run_id: uuid.UUID, seen_wakes: int, wake_at: datetime | None) -> bool:
        """Make a running run due at ``wake_at`` (None: not due) after a pass, its pass
        errors cleared, unless it was woken since ``seen_wakes``: whether it was not."""
        return bool(
            self._runs()
            .filter(id=run_id, status=RunStatus.RUNNING, wakes=seen_wakes)
            .update(wake_at=wake_at, pass_errors=0, updated_at=timezone.now())
        )

    def count_pass_error(self, run_id: uuid.UUID) -> int | None:
        """Count one more failed pass of a running run: how many in a row (None if it
        is not running)."""
        with transaction.atomic(using=self.using):
            running = self._runs().filter(id=run_id, status=RunStatus.RUNNING)
            if not running.update(pass_errors=F("pass_errors") + 1):
                return None
            return int(self._runs().filter(id=run_id).values_list("pass_errors", flat=True).get())

    def end_run(self, run_id: uuid.UUID, status: RunStatus, output: Any, error: Any) -> bool:
        """End a running run (completed, failed): whether it was running."""
        return bool(
            self._runs()
            .filter(id=run_id, status=RunStatus.RUNNING)
            .update(
                status=status, output=output, error=error, wake_at=None, updated_at=timezone.now()
            )
        )

    def suspend_run(self, run_id: uuid.UUID, reason: str) -> bool:
        """Suspend a running run with ``reason``: whether it was running."""
        return bool(
            self._runs()
            .filter(id=run_id, status=RunStatus.RUNNING)
            .update(
                status=RunStatus.SUSPENDED,
                suspend_reason=reason,
                wake_at=None,
                updated_at=timezone.now(),
            )
        )

    def record_version(self, run_id: uuid.UUID, version: str) -> bool:
        """Record the workflow version of a run that records none yet: whether it did."""
        return bool(self._runs().filter(id=run_id, version="").update(version=version))

    def publish(self, run_id: uuid.UUID, name: str, value: Any) -> dict[str, Any]:
        """Add ``value`` under ``name`` to the run's published values (in the caller's
        transaction, which :meth:`lock_run` holds the run for): all of them now."""
        current = self._runs().filter(id=run_id).values_list("published", flat=True).first()
        values = dict(current) if isinstance(current, dict) else {}
        values[name] = value
        self._runs().filter(id=run_id).update(published=values)
        return values

    # -- what users do to runs -------------------------------------------------------

    def resume_run(self, run_id: uuid.UUID, wake_at: datetime | None) -> bool:
        """Set a suspended run running, due at ``wake_at``: whether it was suspended."""
        return bool(
            self._runs()
            .filter(id=run_id, status=RunStatus.SUSPENDED)
            .update(
                status=RunStatus.RUNNING,
                suspend_reason="",
                wake_at=wake_at,
                wakes=F("wakes") + 1,
                updated_at=timezone.now(),
            )
        )

    def cancel_run(self, run_id: uuid.UUID) -> bool:
        """Cancel a running or suspended run: whether it was either."""
        return bool(
            self._runs()
            .filter(id=run_id, status__in=OPEN_RUN)
            .update(status=RunStatus.CANCELLED, wake_at=None, updated_at=timezone.now())
        )

    def reopen_run(self, run_id: uuid.UUID, now: datetime, wake_at: datetime | None) -> bool:
        """Set a failed run running again, due at ``wake_at``, its end cleared and a
        deadline already past ``now`` dropped: whether it was failed."""
        return bool(
            self._runs()
            .filter(id=run_id, status=RunStatus.FAILED)
            .update(
                status=RunStatus.RUNNING,
                output=None,
                error=None,
                suspend_reason="",
                deadline_at=Case(When(deadline_at__lte=now, then=None), default=F("deadline_at")),
                wake_at=wake_at,
                wakes=F("wakes") + 1,
                updated_at=timezone.now(),
            )
        )

    def admit_runs(self, run_ids: Sequence[uuid.UUID], at: datetime) -> int:
        """Let keyed runs waiting for a slot go, due at ``at``: how many did."""
        return (
            self._runs()
            .filter(id__in=list(run_ids), key_waiting=True, status=RunStatus.RUNNING)
            .update(key_waiting=False, wake_at=at, updated_at=timezone.now())
        )

    def rewindow_run(
        self,
        run_id: uuid.UUID,
        input: Any,
        start_at: datetime | None,
        deadline_at: datetime | None,
    ) -> None:
        """Give a debounced run waiting to start its new input and start (and due) time."""
        self._runs().filter(id=run_id).update(
            input=input,
            start_at=start_at,
            wake_at=start_at,
            deadline_at=deadline_at,
            updated_at=timezone.now(),
        )

    def free_key(self, run_id: uuid.UUID) -> None:
        """Take the run's idempotency key off it, for a new run to take."""
        self._runs().filter(id=run_id).update(idempotency_key=None)

    # -- a run's deadline --------------------------------------------------------------

    def fail_overdue_run(
        self, run_id: uuid.UUID, now: datetime, error: Any
    ) -> list[StoppedStep] | None:
        """Fail an open run whose deadline is past ``now`` with ``error``, and its steps
        still waiting with it (no attempt left; a running attempt failed): those
        steps, or None if the run was not open and overdue."""
        stamp = timezone.now()
        with transaction.atomic(using=self.using):
            changed = (
                self._runs()
                .filter(id=run_id, status__in=OPEN_RUN, deadline_at__lte=now)
                .update(
                    status=RunStatus.FAILED,
                    error=error,
                    suspend_reason="",
                    wake_at=None,
                    updated_at=stamp,
                )
            )
            if not changed:
                return None
            waiting = self._steps().filter(waiting_steps(), run_id=run_id)
            steps = list(waiting.values_list("id", "attempt", "kind", "child_run_id"))
            waiting.update(
                status=StepStatus.FAILED,
                error=error,
                attempt=Greatest(F("attempt"), 1),
                retries=Greatest(F("attempt"), 1) - 1,
                lease_expires_at=None,
                available_at=None,
                updated_at=stamp,
            )
            for step_id, attempt, _kind, _child in steps:
                self._attempts().filter(
                    step_id=step_id, attempt=attempt, status=StepStatus.RUNNING
                ).update(status=StepStatus.FAILED, error=error, finished_at=stamp)
        return [StoppedStep(i, StepKind(kind), child) for i, _a, kind, child in steps]

    def time_out_suspension(self, step_id: int, now: datetime, error: Any) -> bool:
        """Fail a suspension whose timeout is past ``now`` with ``error``: whether it
        was still suspended."""
        with transaction.atomic(using=self.using):
            won = (
                self._steps()
                .filter(id=step_id, status=StepStatus.SUSPENDED, available_at__lte=now)
                .update(
                    status=StepStatus.FAILED,
                    error=error,
                    attempt=1,
                    retries=0,
                    updated_at=timezone.now(),
                )
            )
            if won:
                self._record_attempt(step_id, 1, StepStatus.FAILED, None, error)
        return bool(won)

    # -- steps that settle with a run -------------------------------------------------

    def settle_marker(
        self,
        step_id: int,
        attempt: int,
        status: StepStatus,
        *,
        result: Any = None,
        error: Any = None,
        retries: int,
    ) -> None:
        """Settle a step no worker attempts (a sleep, a suspension, a child step) as
        ``attempt``, unless it succeeded already, with its attempt's row."""
        with transaction.atomic(using=self.using):
            self._steps().filter(id=step_id).exclude(status=StepStatus.SUCCEEDED).update(
                status=status,
                result=result,
                error=error,
                attempt=attempt,
                lease_expires_at=None,
                retries=retries,
                updated_at=timezone.now(),
            )
            self._record_attempt(step_id, attempt, status, result, error)

    def _record_attempt(
        self, step_id: int, attempt: int, status: StepStatus, result: Any, error: Any
    ) -> None:
        self._attempts().update_or_create(
            step_id=step_id,
            attempt=attempt,
            defaults={
                "status": status,
                "result": result,
                "error": error,
                "finished_at": timezone.now(),
            },
        )

    def reschedule_suspended(self, step_id: int, at: datetime) -> bool:
        """Hand a step suspended for its missing function to a worker again, due at ``at``."""
        return bool(
            self._steps()
            .filter(id=step_id, status=StepStatus.SUSPENDED)
            .update(
                status=StepStatus.SCHEDULED, available_at=at, error=None, updated_at=timezone.now()
            )
        )

    def reopen_step(self, step_id: int, attempt: int, at: datetime) -> bool:
        """Give a step that finally failed as ``attempt`` one more, due at ``at``:
        whether it was still so."""
        return bool(
            self._steps()
            .filter(id=step_id, status=StepStatus.FAILED, attempt=attempt)
            .update(
                retries=attempt,  # attempt < retries + 1: claimable once more
                available_at=at,
                lease_expires_at=None,
                updated_at=timezone.now(),
            )
        )

    def reopen_child_step(self, step_id: int, attempt: int, retries: int) -> bool:
        """Set a child step that failed as ``attempt`` running as the next one, waiting
        on its child run again (``retries`` allowed): whether it was still failed."""
        with transaction.atomic(using=self.using):
            won = (
                self._steps()
                .filter(id=step_id, status=StepStatus.FAILED, attempt=attempt)
                .update(
                    status=StepStatus.RUNNING,
                    attempt=attempt + 1,
                    retries=retries,
                    result=None,
                    error=None,
                    lease_expires_at=None,  # parked on its child run, as when it started
                    updated_at=timezone.now(),
                )
            )
            if won:
                self._attempts().create(
                    step_id=step_id, attempt=attempt + 1, status=StepStatus.RUNNING
                )
        return bool(won)

    # -- children ----------------------------------------------------------------------

    def attach_child(self, step_id: int, child: WorkflowRun) -> None:
        """Insert ``child``, the run the child step ``step_id`` waits on, and link them
        (the step's first attempt recorded)."""
        with transaction.atomic(using=self.using):
            child.save(force_insert=True, using=self.using)
            self._steps().filter(id=step_id).update(child_run=child)
            self._attempts().get_or_create(step_id=step_id, attempt=1)

    def add_branches(
        self, run_id: uuid.UUID, group_id: int, branches: Sequence[ChildBranch], priority: int
    ) -> list[WorkflowStep] | None:
        """Store a parallel group's ``branches`` with their child runs, each running
        as attempt 1: their steps; None (nothing written) if another pass of the run
        stored any of them meanwhile."""
        names = [branch.name for branch in branches]
        try:
            with transaction.atomic(using=self.using):
                # The group's row first: it is the one row every child's end updates.
                self._steps().filter(id=group_id).update(
                    open_branches=F("open_branches") + len(branches)
                )
                if self._steps().filter(run_id=run_id, name__in=names).exists():
                    raise _StoredElsewhere
                self._runs().bulk_create([branch.run for branch in branches])
                self._steps().bulk_create(
                    WorkflowStep(
                        run_id=run_id,
                        name=branch.name,
                        kind=StepKind.CHILD,
                        function=branch.run.workflow,
                        input=branch.run.input,
                        status=StepStatus.RUNNING,
                        attempt=1,
                        retries=0,
                        priority=priority,
                        child_run_id=branch.run.id,
                        group_id=group_id,
                    )
                    for branch in branches
                )
                steps = list(self._steps().filter(run_id=run_id, name__in=names))
                self._attempts().bulk_create(StepAttempt(step_id=s.id, attempt=1) for s in steps)
        except _StoredElsewhere:
            return None
        return steps

    # -- deleting ----------------------------------------------------------------------

    def delete_runs(self, run_ids: Sequence[uuid.UUID]) -> int:
        """Delete the runs ``run_ids`` with their steps, attempts and events: how many runs."""
        runs = self._runs().filter(pk__in=list(run_ids)).only("pk").order_by()
        collector = _Unordered(using=self.using, origin=runs)
        collector.collect(runs)
        _, per_model = collector.delete()
        return per_model.get(WorkflowRun._meta.label, 0)


class _StoredElsewhere(Exception):
    """Another pass stored some of the branches: roll the batch back."""
