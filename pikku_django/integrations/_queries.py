"""What the metrics read from the workflow database when they are collected: one grouped
query over the ready steps' index, one over the recent heartbeats, each bounded."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, Min
from django.utils import timezone

#: The most queues, and workers, one collection reports.
MAX_QUEUES = 200
MAX_WORKERS = 500
#: Workers not seen for this long are left out (prune_heartbeats removes them later).
WORKERS_WITHIN = timedelta(minutes=10)


def queue_depths(using: str) -> list[tuple[str, int, float]]:
    """(queue, steps due and waiting, seconds the oldest has waited) per queue."""
    from pikku_django.models import WorkflowStep

    now = timezone.now()
    rows = (
        WorkflowStep.objects.using(using)
        .order_by()
        .ready(now)
        .values("queue")
        .annotate(n=Count("id"), oldest=Min("available_at"))
        .order_by("queue")[:MAX_QUEUES]
    )
    return [
        (row["queue"], row["n"], max(0.0, (now - row["oldest"]).total_seconds()))
        for row in rows
        if row["oldest"] is not None
    ]


@dataclass(frozen=True)
class WorkerSeen:
    """A worker's last heartbeat, as the metrics report it."""

    worker: str
    hostname: str
    age: float
    running: int
    concurrency: int
    stopped: bool


def worker_heartbeats(using: str) -> list[WorkerSeen]:
    """The workers seen within :data:`WORKERS_WITHIN`, most recently seen first."""
    from pikku_django.heartbeats import recent_workers

    now = timezone.now()
    rows = (
        recent_workers(WORKERS_WITHIN, using=using, now=now)
        .order_by("-seen_at")
        .values_list("worker_id", "hostname", "seen_at", "running", "concurrency", "stopped_at")[
            :MAX_WORKERS
        ]
    )
    return [
        WorkerSeen(
            worker,
            hostname,
            max(0.0, (now - seen).total_seconds()),
            running,
            concurrency,
            stopped is not None,
        )
        for worker, hostname, seen, running, concurrency, stopped in rows
    ]
