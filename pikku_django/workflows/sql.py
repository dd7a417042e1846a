"""The workflow engine's SQL on its hot path, and waking idle workers.

Each operation here is one atomic unit: storing or settling a step, claiming due
runs, ending a run. :class:`StepWrites` does it with the ORM in a transaction on
every database; :class:`PostgresStepWrites` does the same as a single prepared
statement (data-modifying CTEs), which needs no BEGIN or COMMIT of its own. Values
written are handed back as a read of the database returns them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.utils import timezone

from pikku_django.dbclock import POSTGRESQL_NOW_MS, EpochMs
from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.prepared import fetch, fetch_one

if TYPE_CHECKING:
    from pikku_django.workflows.engine import WorkflowEngine

#: The PostgreSQL channel that new work is announced on.
CHANNEL = "pikku_work"


def notify_work(using: str) -> None:
    """Announce new work (delivered when the current transaction commits)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])


@dataclass(frozen=True)
class NewStep:
    """The columns of a step row written with its first attempt."""

    run_id: uuid.UUID
    name: str
    kind: str
    function: str
    input: Any
    retries: int
    retry_delay: float
    backoff: str
    queue: str
    transactional: bool


@dataclass(frozen=True)
class Settled:
    """A settled attempt: its run as the settle found it, and the result as stored."""

    run_id: uuid.UUID
    run_status: str
    run_wakes: int
    result: Any


#: What a settled attempt does to its run: nothing (the thread that settled it
#: passes it next, or a pass is not needed yet), or wake it for any worker now and
#: announce it.
WAKE_NONE, WAKE_NOW = "none", "now"


class StepWrites:
    """The hot-path operations through the ORM, each in one transaction."""

    def __init__(self, engine: WorkflowEngine) -> None:
        self.engine = engine
        self.using = engine.using

    def _as_stored(self, step_id: int, field: str, value: Any) -> Any:
        """``value`` as a read of the step's ``field`` returns it: MySQL's JSON type
        reorders keys and normalises numbers; MariaDB and SQLite keep the text."""
        connection = connections[self.using]
        if value is None or connection.vendor != "mysql" or connection.mysql_is_mariadb:
            return value
        return (
            WorkflowStep.objects.using(self.using)
            .filter(id=step_id)
            .values_list(field, flat=True)
            .first()
        )

    def _run_wake(self, wake: str) -> datetime | None:
        return self.engine.clock.now() if wake == WAKE_NOW else None

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
        """Insert a step with its first attempt already settled, while its run is
        running: its id and result as stored; None (nothing written) if the step
        exists or the run is no longer running."""
        now = timezone.now()
        try:
            with transaction.atomic(using=self.using):
                running = WorkflowRun.objects.using(self.using).filter(
                    id=step.run_id, status=RunStatus.RUNNING
                )
                if not running.exists():
                    return None
                row = WorkflowStep.objects.using(self.using).create(
                    **step_columns(step),
                    status=status,
                    result=result,
                    error=error,
                    attempt=1,
                    available_at=available_at,
                )
                StepAttempt.objects.using(self.using).create(
                    step_id=row.id,
                    attempt=1,
                    status=status,
                    result=result,
                    error=error,
                    worker=worker[:255],
                    finished_at=now,
                )
                # auto_now_add cannot be set on create: the attempt started earlier.
                StepAttempt.objects.using(self.using).filter(step_id=row.id, attempt=1).update(
                    started_at=started_at
                )
        except IntegrityError:
            return None
        return row.id, self._as_stored(row.id, "result", result)

    def insert_claimed(
        self, step: NewStep, *, lease_ms: int, worker: str, park_wakes: int
    ) -> tuple[int, Any] | None:
        """Insert a step running as attempt 1 under this worker's lease, and park its
        run unless it was woken since ``park_wakes``: its id and input as stored; None
        (nothing written) if the step exists or the run is no longer running."""
        runs = WorkflowRun.objects.using(self.using)
        try:
            with transaction.atomic(using=self.using):
                if not runs.filter(id=step.run_id, status=RunStatus.RUNNING).exists():
                    return None  # only a running run's steps are claimed
                row = WorkflowStep.objects.using(self.using).create(
                    **step_columns(step),
                    status=StepStatus.RUNNING,
                    attempt=1,
                    available_at=None,
                    lease_expires_at=EpochMs() + int(lease_ms),
                )
                StepAttempt.objects.using(self.using).create(
                    step_id=row.id, attempt=1, status=StepStatus.RUNNING, worker=worker[:255]
                )
                runs.filter(
                    id=step.run_id,
                    status=RunStatus.RUNNING,
                    wakes=park_wakes,
                    wake_at__isnull=False,
                ).update(wake_at=None, updated_at=timezone.now())
        except IntegrityError:
            return None
        return row.id, self._as_stored(row.id, "input", step.input)

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
        wake: str = WAKE_NONE,
    ) -> Settled | None:
        """Write an attempt's outcome on its step and history row, fenced by ``attempt``
        (only while the step is still running under it), and wake its run as asked.

        None if the attempt was superseded (nothing written).
        """
        now = timezone.now()
        with transaction.atomic(using=self.using):
            steps = WorkflowStep.objects.using(self.using)
            run_id = (
                steps.filter(id=step_id, attempt=attempt, status=StepStatus.RUNNING)
                .select_for_update()
                .values_list("run_id", flat=True)
                .first()
            )
            if run_id is None:
                return None
            steps.filter(id=step_id).update(
                status=status,
                lease_expires_at=None,
                updated_at=now,
                result=result,
                error=error,
                available_at=available_at,
                retries=F("retries") if retries is None else retries,
            )
            StepAttempt.objects.using(self.using).filter(step_id=step_id, attempt=attempt).update(
                status=status, finished_at=now, result=result, error=error
            )
            run_wake = self._run_wake(wake)
            if run_wake is not None:
                woken = (
                    WorkflowRun.objects.using(self.using)
                    .filter(id=run_id, status=RunStatus.RUNNING)
                    .update(wake_at=run_wake, wakes=F("wakes") + 1, updated_at=now)
                )
                if woken and wake == WAKE_NOW:
                    self.engine.notify()
            runs = WorkflowRun.objects.using(self.using).filter(id=run_id)
            run_status, run_wakes = runs.values_list("status", "wakes").get()
        return Settled(run_id, run_status, run_wakes, self._as_stored(step_id, "result", result))

    def claim_due_runs(self, now: datetime, until: datetime, limit: int) -> list[uuid.UUID] | None:
        """Runs due at ``now``, each pushed back to ``until``; None where the caller's
        ORM transaction does it instead."""
        return None

    def ready_steps_exist(self, now: datetime, queues: list[str]) -> bool:
        """Whether a queued step may be ready to claim (a cheap look, before claiming)."""
        return True

    def finish_run(self, run_id: uuid.UUID, status: str, output: Any, error: Any) -> bool | None:
        """End a run no parent step waits on: whether it changed; None where the
        caller's ORM transaction must do it (another database, or a waiting parent)."""
        return None


class PostgresStepWrites(StepWrites):
    """The same writes, each as one PostgreSQL statement."""

    STEP_COLUMNS = (
        "run_id, name, kind, function, input, retries, retry_delay, backoff, queue, "
        "transactional, status, result, error, attempt, available_at, lease_expires_at, "
        "created_at, updated_at"
    )

    @property
    def prepared(self) -> bool:
        """Whether the statements are prepared (see :mod:`pikku_django.prepared`)."""
        from pikku_django.conf import pikku_settings

        return bool(pikku_settings.PREPARED_STATEMENTS)

    def _execute(self, sql: str, params: list[Any]) -> Any:
        """The statement's first row (None if none)."""
        return fetch_one(self.using, sql, params)

    def _execute_all(self, sql: str, params: list[Any]) -> list[Any]:
        return fetch(self.using, sql, params)

    def claim_due_runs(self, now: datetime, until: datetime, limit: int) -> list[uuid.UUID] | None:
        sql = """
            UPDATE pikku_workflow_run SET wake_at = %s
            WHERE id IN (
                SELECT id FROM pikku_workflow_run
                WHERE status = %s AND NOT inline AND wake_at <= %s
                ORDER BY wake_at LIMIT %s
                FOR UPDATE SKIP LOCKED
            )
            RETURNING id
        """
        return [row[0] for row in self._execute_all(sql, [until, RunStatus.RUNNING, now, limit])]

    def ready_steps_exist(self, now: datetime, queues: list[str]) -> bool:
        sql = f"""
            SELECT 1 FROM pikku_workflow_step
            WHERE kind = 'queued' AND (
                (status IN ('scheduled', 'pending') AND available_at <= %s)
                OR (status = 'failed' AND attempt < retries + 1 AND available_at <= %s)
                OR (status = 'running' AND lease_expires_at < {POSTGRESQL_NOW_MS})
            ) AND (%s OR queue = ANY(%s))
            LIMIT 1
        """
        return self._execute(sql, [now, now, not queues, queues]) is not None

    def finish_run(self, run_id: uuid.UUID, status: str, output: Any, error: Any) -> bool | None:
        # Only a run no parent step waits on: a parent's step settles in the same
        # transaction as its child's end, which the ORM path does.
        sql = """
            WITH p AS (
                SELECT EXISTS (
                    SELECT 1 FROM pikku_workflow_step WHERE child_run_id = %s AND status = %s
                ) AS waiting
            ), r AS (
                UPDATE pikku_workflow_run
                SET status = %s, output = %s::jsonb, error = %s::jsonb, wake_at = NULL,
                    updated_at = %s
                WHERE id = %s AND status = %s AND NOT (SELECT waiting FROM p)
                RETURNING id
            )
            SELECT EXISTS (SELECT 1 FROM r), (SELECT waiting FROM p)
        """
        params = [
            run_id,
            StepStatus.RUNNING,
            status,
            _jsonb(output),
            _jsonb(error),
            timezone.now(),
            run_id,
            RunStatus.RUNNING,
        ]
        changed, waiting = self._execute(sql, params)
        return None if waiting else bool(changed)

    @staticmethod
    def _step_params(step: NewStep) -> list[Any]:
        return [
            step.run_id,
            step.name,
            step.kind,
            step.function,
            _jsonb(step.input),
            step.retries,
            step.retry_delay,
            step.backoff,
            step.queue,
            step.transactional,
        ]

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
        sql = f"""
            WITH s AS (
                INSERT INTO pikku_workflow_step ({self.STEP_COLUMNS})
                SELECT %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s,
                       %s, %s::jsonb, %s::jsonb, 1, %s, NULL, %s, %s
                WHERE EXISTS (
                    SELECT 1 FROM pikku_workflow_run WHERE id = %s AND status = %s
                )
                ON CONFLICT (run_id, name) DO NOTHING
                RETURNING id, result
            )
            INSERT INTO pikku_step_attempt
                (step_id, attempt, status, result, error, worker, started_at, finished_at)
            SELECT id, 1, %s, result, %s::jsonb, %s, %s, %s FROM s
            RETURNING step_id, result::text
        """
        res, err = _jsonb(result), _jsonb(error)
        params = [
            *self._step_params(step),
            status,
            res,
            err,
            available_at,
            now,
            now,
            step.run_id,
            RunStatus.RUNNING,
            status,
            err,
            worker[:255],
            started_at,
            now,
        ]
        row = self._execute(sql, params)
        return None if row is None else (row[0], _loads(row[1]))

    def insert_claimed(
        self, step: NewStep, *, lease_ms: int, worker: str, park_wakes: int
    ) -> tuple[int, Any] | None:
        now = timezone.now()
        sql = f"""
            WITH s AS (
                INSERT INTO pikku_workflow_step ({self.STEP_COLUMNS})
                SELECT %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s,
                       %s, NULL, NULL, 1, NULL, {POSTGRESQL_NOW_MS} + %s, %s, %s
                WHERE EXISTS (
                    SELECT 1 FROM pikku_workflow_run WHERE id = %s AND status = %s
                )
                ON CONFLICT (run_id, name) DO NOTHING
                RETURNING id, input::text
            ), a AS (
                INSERT INTO pikku_step_attempt
                    (step_id, attempt, status, worker, started_at)
                SELECT id, 1, %s, %s, %s FROM s
            ), r AS (
                UPDATE pikku_workflow_run SET wake_at = NULL, updated_at = %s
                WHERE id = %s AND status = %s AND wakes = %s AND wake_at IS NOT NULL
                    AND EXISTS (SELECT 1 FROM s)
            )
            SELECT id, input FROM s
        """
        params = [
            *self._step_params(step),
            StepStatus.RUNNING,
            int(lease_ms),
            now,
            now,
            step.run_id,
            RunStatus.RUNNING,
            StepStatus.RUNNING,
            worker[:255],
            now,
            now,
            step.run_id,
            RunStatus.RUNNING,
            park_wakes,
        ]
        row = self._execute(sql, params)
        return None if row is None else (row[0], _loads(row[1]))

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
        wake: str = WAKE_NONE,
    ) -> Settled | None:
        now = timezone.now()
        run_wake = self._run_wake(wake)
        res, err = _jsonb(result), _jsonb(error)
        sql = """
            WITH s AS (
                UPDATE pikku_workflow_step
                SET status = %s, lease_expires_at = NULL, updated_at = %s, result = %s::jsonb,
                    error = %s::jsonb, available_at = %s, retries = COALESCE(%s, retries)
                WHERE id = %s AND attempt = %s AND status = %s
                RETURNING run_id, result::text
            ), a AS (
                UPDATE pikku_step_attempt
                SET status = %s, finished_at = %s, result = %s::jsonb, error = %s::jsonb
                WHERE step_id = %s AND attempt = %s AND EXISTS (SELECT 1 FROM s)
            ), r AS (
                UPDATE pikku_workflow_run
                SET wake_at = %s, wakes = wakes + 1, updated_at = %s
                WHERE %s AND id = (SELECT run_id FROM s) AND status = %s
                RETURNING 1
            )
            SELECT s.run_id, s.result, run.status, run.wakes,
                   (SELECT count(pg_notify(%s, '')) FROM r WHERE %s)
            FROM s JOIN pikku_workflow_run run ON run.id = s.run_id
        """
        params = [
            status,
            now,
            res,
            err,
            available_at,
            retries,
            step_id,
            attempt,
            StepStatus.RUNNING,
            status,
            now,
            res,
            err,
            step_id,
            attempt,
            run_wake,
            now,
            run_wake is not None,
            RunStatus.RUNNING,
            CHANNEL,
            wake == WAKE_NOW and _notifying(),
        ]
        row = self._execute(sql, params)
        if row is None:
            return None
        # The run as this statement's snapshot saw it (before any wake it made).
        return Settled(row[0], row[2], row[3], _loads(row[1]))


def step_writes(engine: WorkflowEngine) -> StepWrites:
    """The hot-path writes for the engine's database."""
    if connections[engine.using].vendor == "postgresql":
        return PostgresStepWrites(engine)
    return StepWrites(engine)


def step_columns(step: NewStep) -> dict[str, Any]:
    """A new step's columns as model field values."""
    return {
        "run_id": step.run_id,
        "name": step.name,
        "kind": step.kind,
        "function": step.function,
        "input": step.input,
        "retries": step.retries,
        "retry_delay": step.retry_delay,
        "backoff": step.backoff,
        "queue": step.queue,
        "transactional": step.transactional,
    }


def _loads(text: str | None) -> Any:
    """A JSON column read back as text, decoded as the ORM decodes it."""
    return None if text is None else json.loads(text)


def _jsonb(value: Any) -> str | None:
    """A JSON value as text for a ``::jsonb`` parameter (SQL NULL for None, as the ORM)."""
    return None if value is None else json.dumps(value)


def _notifying() -> bool:
    from pikku_django.conf import pikku_settings

    return bool(pikku_settings.WORKER_NOTIFY)
