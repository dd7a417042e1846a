"""The questions asked of runs, steps and attempts: read-only, each chains with the
others and with using(); writes are the workflow store's."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Self, TypeVar

from django.apps import apps
from django.db import models

from pikku_django.models._workflow_states import (
    TERMINAL_RUN_STATUSES,
    WAITING_STEP_STATUSES,
    AttemptStatus,
    RunStatus,
    StepKind,
    StepStatus,
)

#: The model a QuerySet here reads (bound by its model's ``objects``).
_Row = TypeVar("_Row", bound=models.Model)


class WorkflowRunQuerySet(models.QuerySet[_Row]):
    """Runs by where they are in their life."""

    def active(self) -> Self:
        """Runs started and not ended: running or suspended."""
        return self.filter(status__in=(RunStatus.RUNNING, RunStatus.SUSPENDED))

    def settled(self) -> Self:
        """Runs that ended: completed, failed or cancelled."""
        return self.filter(status__in=TERMINAL_RUN_STATUSES)

    def failed(self) -> Self:
        return self.filter(status=RunStatus.FAILED)

    def stuck(self) -> Self:
        """Runs waiting for a person: failed (to retry) or suspended (to resume)."""
        return self.filter(status__in=(RunStatus.FAILED, RunStatus.SUSPENDED))

    def due(self, now: datetime) -> Self:
        """Worker runs (not inline) whose next orchestration pass is due at ``now``."""
        return self.filter(status=RunStatus.RUNNING, inline=False, wake_at__lte=now)

    def with_step_on(self, queue: str) -> Self:
        """Runs with a step on ``queue``."""
        steps = apps.get_model(self.model._meta.app_label, "WorkflowStep")
        on_queue = steps._default_manager.using(self.db).filter(queue=queue)
        return self.filter(pk__in=on_queue.values("run_id"))


class WorkflowStepQuerySet(models.QuerySet[_Row]):
    """Steps by what a worker or a person waits for."""

    def of_run(self, run_id: Any) -> Self:
        return self.filter(run_id=run_id)

    def running(self) -> Self:
        """Steps claimed by a worker (whether its lease is live or lapsed)."""
        return self.filter(status=StepStatus.RUNNING)

    def ready(self, now: datetime) -> Self:
        """Queued steps that are due at ``now`` and wait for a worker to claim them."""
        return self.filter(
            kind=StepKind.QUEUED, status__in=WAITING_STEP_STATUSES, available_at__lte=now
        )

    def open_queued(self) -> Self:
        """Queued steps waiting (due or not) or claimed: a queue's work not done yet."""
        return self.filter(
            kind=StepKind.QUEUED, status__in=(*WAITING_STEP_STATUSES, StepStatus.RUNNING)
        )


class StepAttemptQuerySet(models.QuerySet[_Row]):
    """Attempts by the step they are of."""

    def of_attempt(self, step_id: Any, attempt: int) -> Self:
        """Attempt number ``attempt`` of step ``step_id`` (one row at most)."""
        return self.filter(step_id=step_id, attempt=attempt)

    def of_run(self, run_id: Any) -> Self:
        """Every attempt of every step of run ``run_id``."""
        return self.filter(step__run_id=run_id)

    def of_step_named(self, run_id: Any, name: str) -> Self:
        """The attempts of run ``run_id``'s step ``name``."""
        return self.filter(step__run_id=run_id, step__name=name)

    def failed(self) -> Self:
        return self.filter(status=AttemptStatus.FAILED)
