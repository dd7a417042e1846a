"""The workflow store through Django's ORM: every database, each operation in one
transaction. Vendors override what they do faster or differently."""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Exists, F, Min, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from pikku_django.dbclock import EpochMs
from pikku_django.models import (
    CLAIMABLE_STATUSES,
    QueuePause,
    RunStatus,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows._values import DueRun, NewStep, NextDue, Settled, Wake
from pikku_django.workflows.control._pause_conditions import paused, paused_look, without_paused
from pikku_django.workflows.store.base import NewRun
from pikku_django.workflows.store.bulk_starts import scheduled_steps
from pikku_django.workflows.store.orm_claims import OrmClaims
from pikku_django.workflows.store.step_writes import running_attempt

#: The order steps are claimed in: highest priority first, first in first out
#: within a priority (the pikku_step_claim_order index).
STEP_CLAIM_ORDER = ("-priority", "id")
#: The order due runs are passed in: highest priority first, then longest due.
RUN_CLAIM_ORDER = ("-priority", "wake_at")


#: Seconds a claim waits for a limited queue's lock before giving up for this round.
LIMIT_LOCK_WAIT = 10


def queue_lock_name(queue: str) -> str:
    """The name of the lock a limited queue's claims take (at most 64 characters)."""
    return "pikku_queue:" + hashlib.sha1(queue.encode(), usedforsecurity=False).hexdigest()


def ready(now: datetime) -> Q:
    """The one rule of a step ready to be claimed at ``now``: scheduled (or pending)
    and due, failed with an attempt left and due, or running under a lapsed lease."""
    return (
        Q(status__in=(StepStatus.SCHEDULED, StepStatus.PENDING), available_at__lte=now)
        | Q(status=StepStatus.FAILED, attempt__lt=F("retries") + 1, available_at__lte=now)
        | Q(status=StepStatus.RUNNING, lease_expires_at__lt=EpochMs())
    )


def in_flight() -> Q:
    """A step that will wake its run by itself: scheduled, pending, suspended, waiting
    for a retry, or running under a live (or parked, null) lease."""
    return (
        Q(status__in=(StepStatus.SCHEDULED, StepStatus.PENDING, StepStatus.SUSPENDED))
        | Q(status=StepStatus.FAILED, attempt__lt=F("retries") + 1)
        | Q(status=StepStatus.RUNNING, lease_expires_at__isnull=True)
        | Q(status=StepStatus.RUNNING, lease_expires_at__gte=EpochMs())
    )


def waiting(now: datetime | None = None) -> Q:
    """A step whose timer (a retry's delay, a sleep, a schedule) is still to fall due."""
    q = Q(status__in=(StepStatus.SCHEDULED, StepStatus.PENDING), available_at__isnull=False) | Q(
        status=StepStatus.FAILED, attempt__lt=F("retries") + 1, available_at__isnull=False
    )
    return q if now is None else q & Q(available_at__gt=now)


class OrmStore(OrmClaims):
    """Every operation through the ORM."""

    vendor = "generic"

    # -- plumbing -------------------------------------------------------------------

    def atomic(self) -> AbstractContextManager[Any]:
        return transaction.atomic(using=self.using)

    def notify(self) -> None:
        pass  # polled

    def claims_serialised(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def as_stored(self, step_id: int, field: str, value: Any) -> Any:
        """``value`` as a read of the step's ``field`` returns it."""
        return value

    def worker_runs(self) -> QuerySet[WorkflowRun]:
        """Running runs a worker passes (not inline ones)."""
        return self.runs().filter(status=RunStatus.RUNNING, inline=False)

    # -- steps: the hot path -----------------------------------------------------------

    def insert_settled(
        self,
        step: NewStep,
        *,
        status: str,
        result: Any,
        error: Any,
        available_at: datetime | None,
        worker: str,
        started_at: datetime,
    ) -> tuple[int, Any] | None:
        now = timezone.now()
        try:
            with self.atomic():
                if not self.runs().filter(id=step.run_id, status=RunStatus.RUNNING).exists():
                    return None
                row = self.steps().create(
                    **step.columns(),
                    status=status,
                    result=result,
                    error=error,
                    attempt=1,
                    available_at=available_at,
                )
                self.attempts().create(
                    step_id=row.id,
                    attempt=1,
                    status=status,
                    result=result,
                    error=error,
                    worker=worker[:255],
                    finished_at=now,
                )
                # auto_now_add cannot be set on create: the attempt started earlier.
                self.attempts().filter(step_id=row.id, attempt=1).update(started_at=started_at)
        except IntegrityError:
            return None
        return row.id, self.as_stored(row.id, "result", result)

    def insert_claimed(
        self, step: NewStep, *, lease_ms: int, worker: str, park_wakes: int
    ) -> tuple[int, Any, int] | None:
        try:
            with self.atomic():
                # Only a running run's steps are claimed, and none of a paused queue.
                unpaused = ~Exists(QueuePause.objects.using(self.using).filter(queue=step.queue))
                running = self.runs().filter(unpaused, id=step.run_id, status=RunStatus.RUNNING)
                if not running.exists():
                    paused_look.forget(self.using)  # the queue may have been paused
                    return None
                started = timezone.now()  # read before the lease's clock: see claim_attempt
                row = self.steps().create(
                    **step.columns(),
                    status=StepStatus.RUNNING,
                    attempt=1,
                    claim_token=self.first_claim_token,
                    available_at=None,
                    lease_expires_at=EpochMs() + int(lease_ms),
                )
                self.attempts().create(
                    step_id=row.id,
                    attempt=1,
                    status=StepStatus.RUNNING,
                    worker=worker[:255],
                    started_at=started,
                )
                self.runs().filter(
                    id=step.run_id,
                    status=RunStatus.RUNNING,
                    wakes=park_wakes,
                    wake_at__isnull=False,
                ).update(wake_at=None, updated_at=timezone.now())
        except IntegrityError:
            return None
        return row.id, self.as_stored(row.id, "input", step.input), self.first_claim_token

    def settle(
        self,
        step_id: int,
        attempt: int,
        status: str,
        *,
        result: Any = None,
        error: Any = None,
        available_at: datetime | None = None,
        retries: int | None = None,
        wake: Wake = Wake.NONE,
        wake_at: datetime | None = None,
        token: int | None = None,
    ) -> Settled | None:
        now = timezone.now()
        with self.atomic():
            run_id = (
                self.steps()
                .filter(running_attempt(step_id, attempt, token))
                .select_for_update()
                .values_list("run_id", flat=True)
                .first()
            )
            if run_id is None:
                return None
            self.steps().filter(id=step_id).update(
                status=status,
                lease_expires_at=None,
                updated_at=now,
                result=result,
                error=error,
                available_at=available_at,
                retries=F("retries") if retries is None else retries,
            )
            self.attempts().filter(step_id=step_id, attempt=attempt).update(
                status=status, finished_at=now, result=result, error=error
            )
            # The run as it was before any wake this settle makes.
            run_status, run_wakes, workflow, created_at = (
                self.runs()
                .filter(id=run_id)
                .values_list("status", "wakes", "workflow", "created_at")
                .get()
            )
            ended = wake is Wake.END and self._end_run_with(run_id, result, now)
            if wake is Wake.END and not ended:
                wake = Wake.NOW  # a parent step waits on it: a pass ends it
            if wake is not Wake.NONE and not ended:
                counted = 1 if wake is Wake.NOW else 0
                woken = (
                    self.runs()
                    .filter(id=run_id, status=RunStatus.RUNNING)
                    .update(wake_at=wake_at or now, wakes=F("wakes") + counted, updated_at=now)
                )
                if woken and wake is Wake.NOW:
                    self.notify()
        stored = self.as_stored(step_id, "result", result)
        return Settled(run_id, run_status, run_wakes, stored, ended, workflow, created_at)

    def _end_run_with(self, run_id: uuid.UUID, output: Any, now: datetime) -> bool:
        """Complete the running run ``run_id`` with ``output``, unless a parent step
        waits on it (its end settles that step, which a pass does): whether it ended."""
        if self.steps().filter(child_run_id=run_id, status=StepStatus.RUNNING).exists():
            return False
        return bool(
            self.runs()
            .filter(id=run_id, status=RunStatus.RUNNING)
            .update(status=RunStatus.COMPLETED, output=output, wake_at=None, updated_at=now)
        )

    def refresh_lease(
        self, step_id: int, lease_ms: int | None, attempt: int, token: int | None = None
    ) -> bool:
        expires = None if lease_ms is None else EpochMs() + int(lease_ms)
        fence = running_attempt(step_id, attempt, token)
        return bool(self.steps().filter(fence).update(lease_expires_at=expires))

    # -- finding work --------------------------------------------------------------------

    def claim_due_run_rows(self, now: datetime, until: datetime, limit: int) -> list[DueRun]:
        stepped = Exists(self.steps().filter(run_id=OuterRef("id")))
        with self.claims_serialised(), self.atomic():
            runs = list(
                self.worker_runs()
                .filter(wake_at__lte=now, key_waiting=False)
                .order_by(*RUN_CLAIM_ORDER)
                .select_for_update(skip_locked=True)
                .annotate(stepped=stepped)[:limit]
            )
            if runs:
                self.runs().filter(id__in=[run.id for run in runs]).update(wake_at=until)
        for run in runs:
            run.wake_at = until
        return [DueRun(run, stepless=not run.stepped) for run in runs]

    def ready_steps_exist(self, now: datetime, queues: Sequence[str]) -> bool:
        return True  # the claim's own query is as cheap here

    def _queued(self, queues: Sequence[str]) -> QuerySet[WorkflowStep]:
        steps = self.steps().filter(kind=StepKind.QUEUED)
        return steps.filter(queue__in=list(queues)) if queues else steps

    def lock_ready_steps(
        self, now: datetime, queues: Sequence[str], limit: int, full: Sequence[str] = ()
    ) -> list[WorkflowStep]:
        steps = without_paused(self._queued(queues), self.using)
        if full:
            steps = steps.exclude(queue__in=list(full))
        # Read in claim order off pikku_step_claim_order (whose condition is repeated
        # so the planner may use it), the first ready steps end the read, however many
        # wait behind them: not every ready step sorted. The step's run is looked up
        # by its key for each step read (a LIMITed scalar subquery is never turned
        # into a join; IN or EXISTS may be, which reads every running run).
        passed = self.worker_runs().filter(id=OuterRef("run_id")).order_by().values("id")[:1]
        return list(
            steps.filter(ready(now), status__in=CLAIMABLE_STATUSES)
            .alias(passed_run=Subquery(passed))
            .filter(passed_run__isnull=False)
            .order_by(*STEP_CLAIM_ORDER)
            .select_for_update(skip_locked=True)
            .annotate(store_now=EpochMs())[:limit]
        )

    def limited_claim(self, queues: Sequence[str]) -> AbstractContextManager[Any]:
        # Claims are serialised in this process, and the database allows one worker
        # process (SQLite): the transaction alone is enough.
        return self.atomic()

    def live_claims(self, queue: str) -> int:
        return (
            self._queued([queue])
            .filter(status=StepStatus.RUNNING, lease_expires_at__gte=EpochMs())
            .count()
        )

    def ready_steps_of(self, run_ids: Sequence[uuid.UUID], now: datetime) -> list[WorkflowStep]:
        return list(
            self._queued(())
            .annotate(store_now=EpochMs())
            .filter(ready(now), run_id__in=list(run_ids))
            .order_by(*STEP_CLAIM_ORDER)
        )

    def next_due(self, now: datetime, queues: Sequence[str]) -> NextDue:
        # The three earliest times, each read in its index's order, in one statement.
        steps = self._queued(queues).order_by()
        firsts = [
            steps.filter(status=StepStatus.RUNNING, lease_expires_at__gt=EpochMs())
            .order_by("lease_expires_at")
            .values("lease_expires_at")[:1],
            steps.filter(waiting(now)).order_by("available_at").values("available_at")[:1],
            self.worker_runs().filter(wake_at__gt=now).order_by("wake_at").values("wake_at")[:1],
        ]
        parts = [q.query.get_compiler(self.using).as_sql() for q in firsts]
        parts.append(self.steps().query.get_compiler(self.using).compile(EpochMs()))
        sql = "SELECT " + ", ".join(f"({part})" for part, _ in parts)
        connection = connections[self.using]
        with connection.cursor() as cursor:
            cursor.execute(sql, [param for _, values in parts for param in values])
            lapse, due, wake, store_now = cursor.fetchone()
        return NextDue(
            lapse_in_ms=None if lapse is None else int(lapse - store_now),
            step_due=_read(WorkflowStep, "available_at", due, connection),
            run_due=_read(WorkflowRun, "wake_at", wake, connection),
        )

    def next_due_of(self, run_ids: Sequence[uuid.UUID]) -> datetime | None:
        found = (
            self.steps()
            .filter(waiting(), run_id__in=list(run_ids))
            .aggregate(at=Min("available_at"))
        )
        at: datetime | None = found["at"]
        return at

    def stalled_runs(self, idle_since: datetime, limit: int) -> list[uuid.UUID]:
        flying = self.steps().filter(run_id=OuterRef("id")).filter(in_flight())
        return list(
            self.worker_runs()
            .filter(wake_at__isnull=True, updated_at__lt=idle_since, key_waiting=False)
            .exclude(Exists(flying))
            .order_by()
            .values_list("id", flat=True)[:limit]
        )

    def work_pending(self, until: datetime, queues: Sequence[str]) -> bool:
        if self.worker_runs().filter(wake_at__lte=until).exists():
            return True
        steps = (
            self._queued(queues)
            .filter(run__status=RunStatus.RUNNING, run__inline=False)
            .exclude(paused(self.using))
        )
        due = Q(
            status__in=(StepStatus.SCHEDULED, StepStatus.PENDING, StepStatus.RUNNING),
            available_at__lte=until,
        ) | Q(status=StepStatus.FAILED, attempt__lt=F("retries") + 1, available_at__lte=until)
        return steps.filter(due).exists() or steps.filter(status=StepStatus.RUNNING).exists()

    # -- runs --------------------------------------------------------------------------

    def finish_run(
        self,
        run_id: uuid.UUID,
        status: str,
        output: Any,
        error: Any,
        *,
        wake_at: datetime | None = None,
    ) -> bool | None:
        return None

    def create_run(
        self, run: WorkflowRun, opening: NewStep | None, due_at: datetime | None
    ) -> None:
        with self.atomic():
            run.save(force_insert=True, using=self.using)
            if opening is not None:
                (step,) = scheduled_steps([(opening, due_at)])
                step.save(force_insert=True, using=self.using)
            if not run.inline:
                self.notify()

    def create_runs(self, runs: Sequence[NewRun], wake_at: datetime) -> list[uuid.UUID]:
        ids = []
        for new in runs:
            key = new.idempotency_key
            turn = contextlib.nullcontext() if key is None else self.key_turn(new.workflow, key)
            try:
                with turn, self.atomic():
                    run = new.row(wake_at)
                    run.save(force_insert=True, using=self.using)
                ids.append(run.id)
            except IntegrityError:
                if key is None:
                    raise
                ids.append(self.keyed_run(new.workflow, key).id)
        if ids:
            self.notify()
        return ids


__all__ = [
    "RUN_CLAIM_ORDER",
    "STEP_CLAIM_ORDER",
    "OrmStore",
    "in_flight",
    "ready",
    "waiting",
]


def _read(model: type[Any], name: str, value: Any, connection: Any) -> Any:
    """``value`` of ``model``'s field ``name`` read by a plain cursor, converted as the
    ORM converts it (SQLite hands datetimes back as text)."""
    if value is None:
        return None
    col = model._meta.get_field(name).get_col(model._meta.db_table)
    for convert in connection.ops.get_db_converters(col):
        value = convert(value, col, connection)
    return value
