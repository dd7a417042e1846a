"""The workflow store on PostgreSQL: each hot operation as one prepared statement
(data-modifying CTEs), which needs no BEGIN or COMMIT of its own.

Tables and columns are named from the models' ``_meta``; statements are built once
per process.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.db import connections
from django.utils import timezone

from pikku_django.models import (
    RunStatus,
    StepAttempt,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.prepared import fetch, fetch_one
from pikku_django.wakeups import RUN_DONE_CHANNEL, WORK_CHANNEL, announce, announcer
from pikku_django.workflows._pauses import paused_look
from pikku_django.workflows._values import DueRun, NewStep, Settled, Wake
from pikku_django.workflows.store._pg_chained import (
    PostgresChainedWrites,
    claimed_params,
    insert_claimed_sql,
)
from pikku_django.workflows.store._pg_finish import finish_run_params, finish_run_sql
from pikku_django.workflows.store._pg_fresh import PostgresFreshClaims, queue_locks
from pikku_django.workflows.store._pg_sql import (
    ATTEMPTS,
    NEW_STEP_FIELDS,
    RUNS,
    STEP_STATE_FIELDS,
    STEPS,
    _c,
    _from_db,
    _insert_sql,
    _jsonb,
    _loads,
    _q,
    _ready_exists,
    claim_due_runs_sql,
)
from pikku_django.workflows.store.base import NewRun, columns
from pikku_django.workflows.store.orm import OrmStore

RUN_FIELDS = ("id", "workflow", "status", "input", "output", "error", "suspend_reason")
RUN_FIELDS_REST = ("inline", "idempotency_key", "wake_at", "wakes", "created_at", "updated_at")
RUN_OPTION_FIELDS = ("priority", "queue", "start_at", "deadline_at")


@functools.cache
def _statements() -> dict[str, str]:
    """Each statement, built on first use."""
    step, run, att = WorkflowStep, WorkflowRun, StepAttempt

    def s(name: str) -> str:
        return _c(step, name)

    def r(name: str) -> str:
        return _c(run, name)

    def a(name: str) -> str:
        return _c(att, name)

    new_cols = columns(step, NEW_STEP_FIELDS + STEP_STATE_FIELDS, _q)
    new_vals = "%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s"
    run_is_running = f"EXISTS (SELECT 1 FROM {RUNS} WHERE {r('id')} = %s AND {r('status')} = %s)"
    conflict = f"ON CONFLICT ({s('run_id')}, {s('name')}) DO NOTHING"
    attempt_cols = columns(att, ("step_id", "attempt", "status", "result", "error"), _q)
    attempt_tail = columns(att, ("worker", "started_at", "finished_at"), _q)
    return {
        # One statement per shape, so that a generic plan fits each.
        "ready_steps_exist": _ready_exists(""),
        "ready_steps_exist_on": _ready_exists(f" AND {s('queue')} = ANY(%s)"),
        "retries_or_lapsed_exist": _ready_exists("", fresh=False),
        "retries_or_lapsed_exist_on": _ready_exists(f" AND {s('queue')} = ANY(%s)", fresh=False),
        "insert_settled": (
            f"WITH s AS (INSERT INTO {STEPS} ({new_cols}) "
            f"SELECT {new_vals}, %s, %s::jsonb, %s::jsonb, 1, %s, NULL, %s, %s "
            f"WHERE {run_is_running} {conflict} "
            f"RETURNING {s('id')} AS id, {s('result')} AS result) "
            f"INSERT INTO {ATTEMPTS} ({attempt_cols}, {attempt_tail}) "
            f"SELECT id, 1, %s, result, %s::jsonb, %s, %s, %s FROM s "
            f"RETURNING {a('step_id')}, {a('result')}::text"
        ),
        "settle": (
            f"WITH s AS (UPDATE {STEPS} SET {s('status')} = %s, {s('lease_expires_at')} = NULL, "
            f"{s('updated_at')} = %s, {s('result')} = %s::jsonb, {s('error')} = %s::jsonb, "
            f"{s('available_at')} = %s, {s('retries')} = COALESCE(%s, {s('retries')}) "
            f"WHERE {s('id')} = %s AND {s('attempt')} = %s AND {s('status')} = %s "
            f"RETURNING {s('run_id')} AS run_id, {s('result')}::text AS result, "
            f"{s('result')} AS stored), "
            f"a AS (UPDATE {ATTEMPTS} SET {a('status')} = %s, {a('finished_at')} = %s, "
            f"{a('result')} = %s::jsonb, {a('error')} = %s::jsonb "
            f"WHERE {a('step_id')} = %s AND {a('attempt')} = %s AND EXISTS (SELECT 1 FROM s)), "
            # Wake.END: the run ends with the step's result, unless a parent step waits
            # on it (then it is woken, for a pass to end it).
            f"e AS (SELECT %s AND NOT EXISTS (SELECT 1 FROM {STEPS} WHERE "
            f"{s('child_run')} = (SELECT run_id FROM s) AND {s('status')} = "
            f"'{StepStatus.RUNNING}') AS ending), "
            f"r AS (UPDATE {RUNS} SET "
            f"{r('wake_at')} = CASE WHEN e.ending THEN NULL ELSE %s::timestamptz END, "
            f"{r('wakes')} = {RUNS}.{r('wakes')} + CASE WHEN e.ending THEN 0 ELSE %s::bigint END, "
            f"{r('status')} = CASE WHEN e.ending THEN '{RunStatus.COMPLETED}' "
            f"ELSE {RUNS}.{r('status')} END, "
            f"{r('output')} = CASE WHEN e.ending THEN s.stored ELSE {RUNS}.{r('output')} END, "
            f"{r('updated_at')} = %s FROM e, s WHERE %s AND {RUNS}.{r('id')} = s.run_id "
            f"AND {RUNS}.{r('status')} = %s RETURNING e.ending AS ended) "
            f"SELECT s.run_id, s.result, run.{r('status')}, run.{r('wakes')}, "
            f"(SELECT count(CASE WHEN r.ended THEN pg_notify(%s, s.run_id::text) "
            f"ELSE pg_notify(%s, '') END) FROM r WHERE %s), "
            f"COALESCE((SELECT bool_or(r.ended) FROM r), false), "
            f"run.{r('workflow')}, run.{r('created_at')} "
            f"FROM s JOIN {RUNS} run ON run.{r('id')} = s.run_id"
        ),
        "create_runs": (
            f"INSERT INTO {RUNS} "
            f"({columns(run, RUN_FIELDS + RUN_FIELDS_REST + RUN_OPTION_FIELDS, _q)}) "
            f"SELECT u, w, %s, i::jsonb, NULL, NULL, '', false, k, GREATEST(%s, a), 0, %s, %s, "
            f"p, q, a, d "
            f"FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::smallint[], "
            f"%s::text[], %s::timestamptz[], %s::timestamptz[]) "
            f"WITH ORDINALITY AS n(u, w, i, k, p, q, a, d, o) "
            f"ORDER BY o ON CONFLICT ({r('workflow')}, {r('idempotency_key')}) DO NOTHING "
            f"RETURNING {r('id')}"
        ),
        "runs_with_keys": (
            f"SELECT {r('id')}, {r('workflow')}, {r('idempotency_key')} FROM {RUNS} "
            f"WHERE ({r('workflow')}, {r('idempotency_key')}) IN "
            f"(SELECT * FROM unnest(%s::text[], %s::text[]))"
        ),
    }


class PostgresStore(PostgresChainedWrites, PostgresFreshClaims, OrmStore):
    """PostgreSQL: the hot path as single statements, and LISTEN/NOTIFY."""

    vendor = "postgresql"
    exact_ready_look = True
    searches_input_text = True

    def _sql(self, name: str) -> str:
        return _statements()[name]

    def notify(self) -> None:
        announce(self.using, notifying=self.notifying)

    def claim_due_run_rows(self, now: datetime, until: datetime, limit: int) -> list[DueRun]:
        rows = fetch(self.using, claim_due_runs_sql(), [until, now, limit])
        return [DueRun(_from_db(self.using, WorkflowRun, row[:-1]), row[-1]) for row in rows]

    def limited_claim(self, queues: Sequence[str]) -> AbstractContextManager[None]:
        return queue_locks(self.using, queues)

    def ready_steps_exist(self, now: datetime, queues: Sequence[str]) -> bool:
        if queues:
            served = list(queues)
            sql, params = self._sql("ready_steps_exist_on"), [now, served, now, served, served]
        else:
            sql, params = self._sql("ready_steps_exist"), [now, now]
        return bool(fetch_one(self.using, sql, params)[0])

    def retries_or_lapsed_exist(self, now: datetime, queues: Sequence[str]) -> bool:
        if queues:
            served = list(queues)
            sql, params = self._sql("retries_or_lapsed_exist_on"), [now, served, served]
        else:
            sql, params = self._sql("retries_or_lapsed_exist"), [now]
        return bool(fetch_one(self.using, sql, params)[0])

    def finish_run(
        self,
        run_id: uuid.UUID,
        status: str,
        output: Any,
        error: Any,
        *,
        wake_at: datetime | None = None,
    ) -> bool | None:
        # A plain parent step settles in the same transaction as its child's end, which
        # the ORM path does; parallel branches settle in this statement.
        now = timezone.now()
        params = finish_run_params(
            run_id, status, output, error, now=now, wake_at=wake_at or now, notifying=self.notifying
        )
        changed, waiting, _woken, _announced = fetch_one(self.using, finish_run_sql(), params)
        return None if waiting else bool(changed)

    @staticmethod
    def _step_params(step: NewStep) -> list[Any]:
        values = step.columns()
        values["input"] = _jsonb(step.input)
        return [values[name] for name in NEW_STEP_FIELDS]

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
        row = fetch_one(self.using, self._sql("insert_settled"), params)
        return None if row is None else (row[0], _loads(row[1]))

    def insert_claimed(
        self, step: NewStep, *, lease_ms: int, worker: str, park_wakes: int
    ) -> tuple[int, Any] | None:
        params = claimed_params(step, lease_ms, worker, park_wakes, timezone.now())
        row = fetch_one(self.using, insert_claimed_sql(), params)
        if row is None:
            paused_look.forget(self.using)  # the queue may have been paused
            return None
        return row[0], _loads(row[1])

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
    ) -> Settled | None:
        now = timezone.now()
        ending = wake is Wake.END
        waking = wake is Wake.NOW or ending  # END falls back to a wake
        touching = wake is not Wake.NONE
        res, err = _jsonb(result), _jsonb(error)
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
            ending,
            (wake_at or now) if touching else None,
            1 if waking else 0,
            now,
            touching,
            RunStatus.RUNNING,
            RUN_DONE_CHANNEL,
            WORK_CHANNEL,
            waking and self.notifying,
        ]
        row = fetch_one(self.using, self._sql("settle"), params)
        if row is None:
            return None
        # The run as this statement's snapshot saw it (before any wake it made).
        return Settled(row[0], row[2], row[3], _loads(row[1]), bool(row[5]), row[6], row[7])

    def create_run(
        self, run: WorkflowRun, opening: NewStep | None, due_at: datetime | None
    ) -> None:
        connection = connections[self.using]
        if run.idempotency_key is not None and connection.in_atomic_block:
            # A taken key must not break the caller's transaction: in a savepoint.
            with self.atomic():
                self._insert_run(run, opening, due_at)
            return
        # One statement, in the caller's transaction if there is one: no BEGIN or
        # COMMIT of its own, and the announcement is sent when that commits.
        self._insert_run(run, opening, due_at)

    def _insert_run(
        self, run: WorkflowRun, opening: NewStep | None, due_at: datetime | None
    ) -> None:
        sql, params = _insert_sql(run)
        parts = [f"r AS ({sql} RETURNING {_c(WorkflowRun, 'id')})"]
        if opening is not None:
            step = WorkflowStep(
                **opening.columns(), status=StepStatus.SCHEDULED, available_at=due_at
            )
            sql, values = _insert_sql(step)
            parts.append(f"s AS ({sql})")
            params.extend(values)
        announcing = self.notifying and not run.inline
        # A busy process announces one start in a window, and the rest after it.
        announce = announcing and announcer.inline(self.using)
        sql = f"WITH {', '.join(parts)} SELECT " + (
            "count(pg_notify(%s, '')) FROM r" if announce else "count(*) FROM r"
        )
        fetch(self.using, sql, [*params, WORK_CHANNEL] if announce else params)
        if announcing and not announce:
            announcer.after_commit(self.using)
        run._state.adding = False
        run._state.db = self.using

    def create_runs(self, runs: Sequence[NewRun], wake_at: datetime) -> list[uuid.UUID]:
        if not runs:
            return []
        if any(new.run_options.concurrency_key is not None for new in runs):
            return super().create_runs(runs, wake_at)  # keyed runs wait for a slot
        now = timezone.now()
        ids = [uuid.uuid4() for _ in runs]
        params = [
            RunStatus.RUNNING,
            wake_at,
            now,
            now,
            ids,
            [new.workflow for new in runs],
            [_jsonb(new.input) for new in runs],
            [new.idempotency_key for new in runs],
            [new.run_options.priority for new in runs],
            [new.run_options.queue for new in runs],
            [new.run_options.start_at for new in runs],
            [new.run_options.deadline_at for new in runs],
        ]
        made = {row[0] for row in fetch(self.using, self._sql("create_runs"), params)}
        if len(made) < len(runs):  # some keys were taken (or repeated): those runs exist
            taken = [new for i, new in zip(ids, runs, strict=True) if i not in made]
            rows = fetch(
                self.using,
                self._sql("runs_with_keys"),
                [[new.workflow for new in taken], [new.idempotency_key for new in taken]],
            )
            existing = {(w, k): i for i, w, k in rows}
            ids = [
                i if i in made else existing[(new.workflow, new.idempotency_key)]
                for i, new in zip(ids, runs, strict=True)
            ]
        if made:
            self.notify()
        return ids
