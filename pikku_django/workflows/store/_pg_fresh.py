"""PostgreSQL's one-statement claims of steps not attempted yet: of the queues without
limits together, of one limited queue (its limits counted in the statement), and the
look at which queue the first of them is on; and the queue locks of limited claims."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from pikku_django.models import WorkflowStep
from pikku_django.prepared import fetch
from pikku_django.workflows.queues import Rate
from pikku_django.workflows.store._pg_sql import NO_CAP, _claim_fresh, _first_fresh_queue, _from_db
from pikku_django.workflows.store.base import FreshClaims, LimitedClaim
from pikku_django.workflows.store.orm import queue_lock_name

#: The first key of the advisory locks that limited queues' claims take.
QUEUE_LOCK_SPACE = 0x70696B6B


@functools.cache
def _statements() -> dict[str, str]:
    """Each statement of a limited queue, built on first use.

    The ready steps of the first branch (scheduled or pending, and due), claimed as
    their next attempt, each under its queue's lease (capped by its timeout).
    Parameters: the limits' (``claim_limited_*``: c for the queue's concurrency
    limit, r for its rate; see ``_pg_sql._limit_ctes``), the queues' names and
    leases, the default lease, now, the queue, updated at, the worker (and the
    claim of the queues without limits, :func:`_unlimited_claim`: the same without
    the limits', the queues served only where some are, and the queues left out
    only where some are, then started at)."""
    return {
        "claim_limited_c": _claim_fresh(fresh_on=True, concurrency=True, excluding=False),
        "claim_limited_r": _claim_fresh(fresh_on=True, rated=True, excluding=False),
        "claim_limited_cr": _claim_fresh(
            fresh_on=True, concurrency=True, rated=True, excluding=False
        ),
        "first_fresh_queue": _first_fresh_queue(fresh_on=False),
        "first_fresh_queue_on": _first_fresh_queue(fresh_on=True),
    }


@functools.lru_cache(maxsize=64)
def _unlimited_claim(fresh_on: bool, excluding: bool, limit: int) -> str:
    """The claim of fresh steps of the queues without limits, one statement per shape
    and limit (see ``_pg_sql._claim_fresh``)."""
    return _claim_fresh(fresh_on=fresh_on, excluding=excluding, limit=limit)


@contextlib.contextmanager
def queue_locks(using: str, queues: Sequence[str]) -> Iterator[None]:
    """A transaction holding an advisory lock per queue, released when it ends."""
    with transaction.atomic(using=using):
        with connections[using].cursor() as cursor:
            for queue in sorted(set(queues)):
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                    [QUEUE_LOCK_SPACE, queue_lock_name(queue)],
                )
        yield


class PostgresFreshClaims(FreshClaims):
    """The fresh-step claims of :class:`~.postgresql.PostgresStore`."""

    using: str

    def claim_fresh_steps(
        self,
        now: datetime,
        queues: Sequence[str],
        limit: int,
        *,
        worker: str,
        leases: Mapping[str, int],
        default_lease_ms: int,
        exclude: Sequence[str] = (),
        started_at: datetime | None = None,
    ) -> list[tuple[WorkflowStep, int]]:
        stamp = started_at or timezone.now()
        params: list[Any] = [list(leases), [int(v) for v in leases.values()]]
        params += [int(default_lease_ms), NO_CAP, now]
        if queues:
            params.append(list(queues))
        if exclude:
            params.append(list(exclude))
        params += [stamp, worker[:255], stamp]
        sql = _unlimited_claim(bool(queues), bool(exclude), int(limit))
        rows = fetch(self.using, sql, params)
        return [(_from_db(self.using, WorkflowStep, row[:-1]), int(row[-1])) for row in rows]

    def claim_fresh_limited(
        self,
        now: datetime,
        queue: str,
        limit: int,
        *,
        worker: str,
        lease_ms: int,
        concurrency: int | None,
        rate: Rate | None,
    ) -> LimitedClaim | None:
        params: list[Any] = []
        if concurrency is not None:
            params += [concurrency, queue]
        params.append(limit)
        if rate is not None:
            params += [queue, rate.count, int(rate.per_seconds * 1000)]
        params += [[queue], [lease_ms], lease_ms, NO_CAP, now, [queue]]
        if rate is not None:
            params.append(limit)
        name = "claim_limited_" + ("c" if concurrency is not None else "") + ("r" if rate else "")
        with contextlib.ExitStack() as held:
            if concurrency is not None:
                # The count must see every claim of the queue: its statement begins
                # once this transaction holds the queue's lock.
                held.enter_context(queue_locks(self.using, [queue]))
            sql = _statements()[name]
            rows = fetch(self.using, sql, [*params, timezone.now(), worker[:255]])
        steps = [
            (_from_db(self.using, WorkflowStep, row[:-3]), int(row[-3]))
            for row in rows
            if row[0] is not None
        ]
        return LimitedClaim(steps, slots=int(rows[0][-2]), wanted=int(rows[0][-1]))

    def first_fresh_queue(self, now: datetime, queues: Sequence[str]) -> str | None:
        if queues:
            sql, params = _statements()["first_fresh_queue_on"], [now, list(queues)]
        else:
            sql, params = _statements()["first_fresh_queue"], [now]
        rows = fetch(self.using, sql, params)
        return str(rows[0][0]) if rows else None
