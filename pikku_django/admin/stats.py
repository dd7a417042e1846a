"""The figures of the operator's dashboard, read in a fixed, small number of queries."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, Min, QuerySet
from django.db.models.functions import TruncMinute
from django.utils import timezone

from pikku_django.heartbeats import recent_workers
from pikku_django.models import (
    RunStatus,
    StepAttempt,
    WorkerHeartbeat,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows.control.pauses import PausedQueue, paused_queues

#: The dashboard's window and its resolution.
WINDOW = timedelta(hours=24)
BUCKET = timedelta(minutes=1)
#: How many runs the "failing or suspended longest" table lists.
STUCK_LIMIT = 10


@dataclass(frozen=True)
class Series:
    """A count per minute over the window, oldest first."""

    key: str
    counts: list[int]

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)


@dataclass(frozen=True)
class WorkflowCounts:
    """One workflow's runs, by status."""

    workflow: str
    by_status: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


@dataclass(frozen=True)
class QueueLoad:
    """What one queue holds now: steps running, steps ready and waiting, the oldest wait."""

    queue: str
    running: int = 0
    waiting: int = 0
    oldest_ready: datetime | None = None

    def oldest_wait(self, now: datetime) -> timedelta | None:
        return None if self.oldest_ready is None else max(timedelta(0), now - self.oldest_ready)


@dataclass(frozen=True)
class Figures:
    """Everything the dashboard shows, as of ``now``."""

    now: datetime
    since: datetime
    by_status: dict[str, int]
    by_workflow: list[WorkflowCounts]
    series: dict[str, Series]
    queues: list[QueueLoad]
    workers: list[WorkerHeartbeat]
    stuck: list[WorkflowRun] = field(default_factory=list)
    #: The paused queues, by name.
    pauses: dict[str, PausedQueue] = field(default_factory=dict)


def per_minute(rows: QuerySet[Any, Any], since: datetime, buckets: int) -> list[int]:
    """Counts keyed by minute (rows of ``minute`` and ``n``) laid out oldest first."""
    counts = [0] * buckets
    start = since.replace(second=0, microsecond=0)
    for row in rows:
        minute = row["minute"]
        if minute is None:
            continue
        if timezone.is_naive(minute):
            minute = minute.replace(tzinfo=UTC)
        index = int((minute - start) // BUCKET)
        if 0 <= index < buckets:
            counts[index] += row["n"]
    return counts


def collect(using: str, *, now: datetime | None = None) -> Figures:
    """Read the dashboard's figures from ``using`` (nine queries, whatever the data)."""
    now = now or timezone.now()
    since = now - WINDOW
    buckets = int(WINDOW // BUCKET) + 1
    runs = WorkflowRun.objects.using(using).order_by()
    steps = WorkflowStep.objects.using(using).order_by()
    attempts = StepAttempt.objects.using(using).order_by()

    by_status = {status: 0 for status in RunStatus.values}
    workflows: dict[str, dict[str, int]] = defaultdict(dict)
    for row in runs.values("workflow", "status").annotate(n=Count("id")):
        by_status[row["status"]] = by_status.get(row["status"], 0) + row["n"]
        workflows[row["workflow"]][row["status"]] = row["n"]
    by_workflow = sorted(
        (WorkflowCounts(name, counts) for name, counts in workflows.items()),
        key=lambda w: (-w.total, w.workflow),
    )

    def minutes(qs: QuerySet[Any], column: str) -> list[int]:
        rows = (
            qs.filter(**{f"{column}__gte": since})
            # Truncated in UTC: no time zone tables needed (MySQL), the same minutes everywhere.
            .annotate(minute=TruncMinute(column, tzinfo=UTC))
            .values("minute")
            .annotate(n=Count("pk"))
        )
        return per_minute(rows, since, buckets)

    series = {
        "started": Series("started", minutes(runs, "created_at")),
        "completed": Series(
            "completed", minutes(runs.filter(status=RunStatus.COMPLETED), "updated_at")
        ),
        "failed": Series("failed", minutes(runs.failed(), "updated_at")),
        "step_failures": Series("step_failures", minutes(attempts.failed(), "finished_at")),
    }

    loads: dict[str, dict[str, object]] = defaultdict(dict)
    running = steps.running().values("queue").annotate(n=Count("id"))
    for queue_running in running:
        loads[queue_running["queue"]]["running"] = queue_running["n"]
    ready = steps.ready(now).values("queue").annotate(n=Count("id"), oldest=Min("available_at"))
    for queue_ready in ready:
        loads[queue_ready["queue"]]["waiting"] = queue_ready["n"]
        loads[queue_ready["queue"]]["oldest_ready"] = queue_ready["oldest"]
    pauses = {pause.queue: pause for pause in paused_queues(using)}
    for name in pauses:
        loads.setdefault(name, {})  # a paused queue is shown, whatever it holds
    queues = [QueueLoad(name, **values) for name, values in sorted(loads.items())]  # type: ignore[arg-type]

    stuck = list(
        runs.stuck()
        .only("id", "workflow", "status", "idempotency_key", "suspend_reason", "updated_at")
        .order_by("updated_at")[:STUCK_LIMIT]
    )
    return Figures(
        now=now,
        since=since,
        by_status=by_status,
        by_workflow=by_workflow,
        series=series,
        queues=queues,
        workers=list(recent_workers(using=using, now=now)),
        stuck=stuck,
        pauses=pauses,
    )
