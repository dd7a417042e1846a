"""The run lists' queries, shared by the admin and ``manage.py pikku_runs``.

One place says what a run's current step, attempts and parent are, and what
each filter (workflow, status, queue, date, search) selects.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery, UUIDField
from django.utils import timezone

from pikku_django.models import RunStatus, StepAttempt, WorkflowRun, WorkflowStep
from pikku_django.models.workflows import WorkflowRunQuerySet
from pikku_django.workflows.store import store_for


def with_list_columns(runs: QuerySet[WorkflowRun]) -> QuerySet[WorkflowRun]:
    """``runs`` with ``current_step``, ``current_step_status``, ``attempt_count`` and
    ``parent_run_id``, each read in the same statement."""
    last_step = WorkflowStep.objects.of_run(OuterRef("pk")).order_by("-id")
    attempts = (
        StepAttempt.objects.of_run(OuterRef("pk"))
        .order_by()
        .values("step__run_id")
        .annotate(n=Count("id"))
        .values("n")[:1]
    )
    parent = WorkflowStep.objects.filter(child_run_id=OuterRef("pk")).order_by("id")
    return runs.annotate(
        current_step=Subquery(last_step.values("name")[:1]),
        current_step_status=Subquery(last_step.values("status")[:1]),
        attempt_count=Subquery(attempts, output_field=IntegerField()),
        parent_run_id=Subquery(parent.values("run_id")[:1], output_field=UUIDField()),
    )


def run_duration(run: WorkflowRun, now: datetime | None = None) -> timedelta:
    """How long the run has taken: until its last change once finished, else until now."""
    end = run.updated_at if run.is_terminal else (now or timezone.now())
    return max(timedelta(0), end - run.created_at)


def search_filter(term: str, using: str) -> Q:
    """Runs on ``using`` whose id, idempotency key or (where the store searches it)
    input text contains ``term``."""
    query = Q(idempotency_key__icontains=term) | Q(workflow__icontains=term)
    try:
        query |= Q(id=uuid.UUID(term))
    except ValueError:
        # Without a uuid type the id is stored as hex digits: Django drops the dashes.
        query |= Q(id__icontains=term)
    if store_for(using).searches_input_text:
        query |= Q(input__icontains=term)
    return query


@dataclass(frozen=True)
class RunFilters:
    """What the admin's filters and ``pikku_runs list`` select runs by."""

    workflow: str | None = None
    status: str | None = None
    queue: str | None = None
    since: date | None = None  # started on or after this day
    until: date | None = None  # started before the end of this day
    search: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in RunStatus.values:
            raise ValueError(
                f"unknown status {self.status!r}; use one of {', '.join(RunStatus.values)}"
            )

    def apply(self, runs: WorkflowRunQuerySet[WorkflowRun]) -> WorkflowRunQuerySet[WorkflowRun]:
        using = runs.db
        if self.workflow:
            runs = runs.filter(workflow=self.workflow)
        if self.status:
            runs = runs.filter(status=self.status)
        if self.queue:
            runs = runs.with_step_on(self.queue)
        if self.since:
            runs = runs.filter(created_at__gte=start_of(self.since))
        if self.until:
            runs = runs.filter(created_at__lt=start_of(self.until + timedelta(days=1)))
        if self.search:
            runs = runs.filter(search_filter(self.search, using))
        return runs


def start_of(day: date) -> datetime:
    """Midnight at the start of ``day`` in the current time zone."""
    moment = datetime.combine(day, time.min)
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


def queues(using: str) -> list[str]:
    """Every queue a step has been put on."""
    return sorted(
        WorkflowStep.objects.using(using).order_by().values_list("queue", flat=True).distinct()
    )


def describe(run: Any) -> dict[str, Any]:
    """A listed run (with :func:`with_list_columns`) as plain data."""
    return {
        "id": str(run.id),
        "workflow": run.workflow,
        "status": run.status,
        "current_step": getattr(run, "current_step", None),
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "duration_seconds": round(run_duration(run).total_seconds(), 3),
        "attempts": getattr(run, "attempt_count", None) or 0,
        "suspend_reason": run.suspend_reason,
        "parent": str(run.parent_run_id) if getattr(run, "parent_run_id", None) else None,
        "idempotency_key": run.idempotency_key,
    }
