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
    """Each statement, built on first use.

    The ready steps of the first branch (scheduled or pending, and due), claimed as
    their next attempt, each under its queue's lease (capped by its timeout).
    Parameters: queues' names and leases, the default lease, now, the queues served
    (in the _on forms), the queues left out, the limit, updated at, the worker and
    started at; a limited queue's (``claim_limited_*``: c for its concurrency limit,
    r for its rate) begin with its limits' (see ``_pg_sql._limit_ctes``)."""
    return {
        "claim_fresh_steps": _claim_fresh(fresh_on=False),
        "claim_fresh_steps_on": _claim_fresh(fresh_on=True),
        "claim_limited_c": _claim_fresh(fresh_on=True, concurrency=True),
        "claim_limited_r": _claim_fresh(fresh_on=True, rated=True),
        "claim_limited_cr": _claim_fresh(fresh_on=True, concurrency=True, rated=True),
        "first_fresh_queue": _first_fresh_queue(fresh_on=False),
        "first_fresh_queue_on": _first_fresh_queue(fresh_on=True),
    }


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
        params += [list(exclude), limit, stamp, worker[:255], stamp]
        name = "claim_fresh_steps_on" if queues else "claim_fresh_steps"
        rows = fetch(self.using, _statements()[name], params)
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
        params += [[queue], [lease_ms], lease_ms, NO_CAP, now, [queue], []]
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
            sql, params = _statements()["first_fresh_queue_on"], [now, list(queues), []]
        else:
            sql, params = _statements()["first_fresh_queue"], [now, []]
        rows = fetch(self.using, sql, params)
        return str(rows[0][0]) if rows else None
