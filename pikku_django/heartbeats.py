"""Worker heartbeats: each worker records one row, which the dashboard lists.

A worker calls :func:`record_heartbeat` when it starts, every few seconds while it
runs, and with ``stopping=True`` when it shuts down. The row is keyed by the
worker's id, so each call overwrites the last; :func:`prune_heartbeats` removes
rows of workers long gone.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import QuerySet
from django.utils import timezone

from pikku_django._version import __version__
from pikku_django.models import WorkerHeartbeat

#: A worker not seen for this long is no longer counted as alive.
ALIVE_WITHIN = timedelta(minutes=2)


def _database(using: str | None) -> str:
    if using is not None:
        return using
    from pikku_django.conf import pikku_settings

    return str(pikku_settings.WORKFLOW_DATABASE)


def record_heartbeat(
    worker_id: str,
    *,
    queues: Iterable[str],
    concurrency: int,
    running: int = 0,
    version: str | None = None,
    hostname: str | None = None,
    pid: int | None = None,
    stopping: bool = False,
    using: str | None = None,
    now: datetime | None = None,
) -> WorkerHeartbeat:
    """Record that ``worker_id`` is alive now (or, with ``stopping``, that it stopped).

    ``queues`` are the queues it serves, ``concurrency`` its threads, ``running``
    how many steps it holds right now. The first call sets ``started_at``.
    """
    if not worker_id:
        raise ValueError("worker_id must not be empty")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    if running < 0:
        raise ValueError(f"running must not be negative, not {running}")
    moment = now or timezone.now()
    values = {
        "queues": sorted(set(queues)),
        "concurrency": concurrency,
        "running": running,
        "version": version if version is not None else __version__,
        "hostname": hostname if hostname is not None else socket.gethostname(),
        "pid": pid if pid is not None else os.getpid(),
        "seen_at": moment,
        "stopped_at": moment if stopping else None,
    }
    rows = WorkerHeartbeat.objects.using(_database(using))
    updated = rows.filter(worker_id=worker_id).update(**values)
    if not updated:
        row, created = rows.get_or_create(
            worker_id=worker_id, defaults={**values, "started_at": moment}
        )
        if not created:  # another call created it in between
            rows.filter(worker_id=worker_id).update(**values)
            row.refresh_from_db()
        return row
    return rows.get(worker_id=worker_id)


def recent_workers(
    within: timedelta = timedelta(minutes=10),
    *,
    using: str | None = None,
    now: datetime | None = None,
) -> QuerySet[WorkerHeartbeat]:
    """Workers seen in the last ``within``, most recently seen first."""
    since = (now or timezone.now()) - within
    return WorkerHeartbeat.objects.using(_database(using)).filter(seen_at__gte=since)


def is_alive(heartbeat: WorkerHeartbeat, *, now: datetime | None = None) -> bool:
    """Whether the worker was seen within :data:`ALIVE_WITHIN` and has not stopped."""
    moment = now or timezone.now()
    return heartbeat.stopped_at is None and moment - heartbeat.seen_at <= ALIVE_WITHIN


def prune_heartbeats(
    older_than: timedelta = timedelta(days=1),
    *,
    using: str | None = None,
    now: datetime | None = None,
) -> int:
    """Delete the rows of workers not seen for ``older_than``; how many were deleted."""
    cutoff = (now or timezone.now()) - older_than
    deleted, _ = WorkerHeartbeat.objects.using(_database(using)).filter(seen_at__lt=cutoff).delete()
    return deleted
