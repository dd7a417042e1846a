"""The claims of the PostgreSQL store, each one statement of ``postgresql_sql``: a
step by the claim decision, fresh steps of the queues without limits together or of
one limited queue, due runs (with their leases and first steps), and a new step
stored as claimed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from pikku_django.leases.base import Lease
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.prepared import fetch, fetch_one
from pikku_django.workflows._values import DueRun, FirstStepClaimed, NewStep, RunLeaseAsk
from pikku_django.workflows.control._pause_conditions import paused_look
from pikku_django.workflows.control.queues import Rate
from pikku_django.workflows.errors import WorkflowStepLeaseExpiredError, serialize_error
from pikku_django.workflows.store.base import LimitedClaim
from pikku_django.workflows.store.decisions import Decision, Verdict
from pikku_django.workflows.store.orm import OrmStore, queue_lock_name
from pikku_django.workflows.store.postgresql_rows import (
    claim_due_runs_first_params,
    claimed_params,
    from_db,
    jsonb,
    loads,
)
from pikku_django.workflows.store.postgresql_sql import (
    NEXT_CLAIM_TOKEN,
    NO_CAP,
    QUEUE_LOCK_SPACE,
    statement,
    unlimited_claim,
)


@contextlib.contextmanager
def queue_locks(using: str, queues: Sequence[str]) -> Iterator[None]:
    """A transaction holding an advisory lock per queue, released when it ends."""
    with transaction.atomic(using=using):
        for queue in sorted(set(queues)):
            fetch(using, statement("queue_lock"), [QUEUE_LOCK_SPACE, queue_lock_name(queue)])
        yield


class PostgresClaims(OrmStore):
    """Claims in one statement each."""

    takes_run_leases = True

    def next_claim_token(self) -> Any:
        # The ORM's claims (an inline run's step) take tokens as the statements do.
        return RawSQL(NEXT_CLAIM_TOKEN, ())  # noqa: S611 (a constant of this package)

    def decide_claim(
        self, step: WorkflowStep, *, lease_ms: int, worker: str, pausable: bool, now: datetime
    ) -> Decision:
        stamp = timezone.now()
        expired = WorkflowStepLeaseExpiredError(step.name, step.attempts_allowed)
        error = jsonb(serialize_error(expired))
        params = [step.id, stamp, now, int(lease_ms), stamp, pausable, stamp, worker[:255], stamp]
        params += [error, stamp, error, stamp]
        row = fetch_one(self.using, statement("claim_step"), params)
        if row is None:
            return Decision(Verdict.NONE)  # no such step
        verdict, won, attempt, reclaimed, started, token = row
        token = 0 if token is None else int(token)
        return Decision(Verdict(verdict), bool(won), int(attempt), bool(reclaimed), started, token)

    def limited_claim(self, queues: Sequence[str]) -> AbstractContextManager[None]:
        return queue_locks(self.using, queues)

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
        sql = unlimited_claim(bool(queues), bool(exclude), int(limit))
        rows = fetch(self.using, sql, params)
        return [(from_db(self.using, WorkflowStep, row[:-1]), int(row[-1])) for row in rows]

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
            rows = fetch(self.using, statement(name), [*params, timezone.now(), worker[:255]])
        steps = [
            (from_db(self.using, WorkflowStep, row[:-3]), int(row[-3]))
            for row in rows
            if row[0] is not None
        ]
        return LimitedClaim(steps, slots=int(rows[0][-2]), wanted=int(rows[0][-1]))

    def first_fresh_queue(self, now: datetime, queues: Sequence[str]) -> str | None:
        if queues:
            sql, params = statement("first_fresh_queue_on"), [now, list(queues)]
        else:
            sql, params = statement("first_fresh_queue"), [now]
        rows = fetch(self.using, sql, params)
        return str(rows[0][0]) if rows else None

    def claim_due_run_rows(self, now: datetime, until: datetime, limit: int) -> list[DueRun]:
        rows = fetch(self.using, statement("claim_due_runs"), [until, now, limit])
        return [DueRun(from_db(self.using, WorkflowRun, row[:-1]), row[-1]) for row in rows]

    def claim_due_runs_leased(
        self, now: datetime, until: datetime, limit: int, ask: RunLeaseAsk
    ) -> list[DueRun]:
        asked_at = time.monotonic()
        first = ask.first
        if first is not None:
            name = "claim_due_runs_first_served" if first.queues else "claim_due_runs_first"
            params = claim_due_runs_first_params(now, until, limit, ask, first, timezone.now())
        else:
            name = "claim_due_runs_leased"
            params = [until, now, limit, ask.prefix, ask.holder, ask.ttl_ms, ask.ttl_ms]
            params += [ask.ttl_ms, ask.prefix]
        claimed = []
        for row in fetch(self.using, statement(name), params):
            end = len(row) - (7 if first is not None else 3)
            run = from_db(self.using, WorkflowRun, row[:end])
            stepless, token, expires_at = row[end : end + 3]
            lease = None
            if token is not None:
                lease = Lease(f"{ask.prefix}{run.id}", ask.holder, int(token), int(expires_at))
            stored = None
            if first is not None and row[-4] is not None:
                step_id, columns, lease_ms, token = row[-4:]
                stored = FirstStepClaimed(int(step_id), loads(columns), int(lease_ms), int(token))
            claimed.append(DueRun(run, stepless, lease, asked_at, lease is None, stored))
        return claimed

    def insert_claimed(
        self, step: NewStep, *, lease_ms: int, worker: str, park_wakes: int
    ) -> tuple[int, Any, int] | None:
        params = claimed_params(step, lease_ms, worker, park_wakes, timezone.now())
        row = fetch_one(self.using, statement("insert_claimed"), params)
        if row is None:
            paused_look.forget(self.using)  # the queue may have been paused
            return None
        return row[0], loads(row[1]), int(row[2])
