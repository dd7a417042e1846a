"""The PostgreSQL due-run claim that also stores each claimed run's first step claimed:
the queued step found when the run started (``WorkflowRun.first_step``), so that the
worker runs it at once and the run's first pass never happens."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from pikku_django.dbclock import POSTGRESQL_NOW_MS
from pikku_django.leases.sql import PostgreSQLLeaseSQL
from pikku_django.models import (
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows._values import FirstStepAsk, RunLeaseAsk
from pikku_django.workflows.store._pg_sql import (
    ATTEMPTS,
    NEW_STEP_FIELDS,
    NO_CAP,
    RUNS,
    STEP_STATE_FIELDS,
    STEPS,
    _all_columns,
    _c,
    _q,
    not_paused,
    step_lease_sql,
)
from pikku_django.workflows.store.base import columns

#: How each column of the new step is read from the run's ``first_step`` (``o.h``), in
#: the order of :data:`NEW_STEP_FIELDS`.
_FROM_HINT = {
    "run_id": "o.id",
    "name": "o.h->>'name'",
    "kind": f"'{StepKind.QUEUED}'",
    "function": "o.h->>'function'",
    "input": "o.h->'input'",
    "retries": "(o.h->>'retries')::integer",
    "retry_delay": "(o.h->>'retry_delay')::double precision",
    "backoff": "o.h->>'backoff'",
    "queue": "o.h->>'queue'",
    "transactional": "(o.h->>'transactional')::boolean",
    "priority": "o.priority",
    "timeout": "(o.h->>'timeout')::double precision",
}


@functools.cache
def claim_due_runs_first_sql(served: bool) -> str:
    """Claim up to N due worker runs with their leases, as ``claim_due_runs_sql(leased=
    True)`` does, and store the first step of each claimed run that has none yet, a
    ``first_step``, its lease taken, and a workflow this code knows, claimed by the
    worker (its first attempt running); such a run is parked, the others pushed back
    to ``until``. Every claimed run's ``first_step`` is cleared.

    ``served``: only a first step of the worker's queues (else of any queue). Never one
    of a limited queue (their claims are counted elsewhere). Parameters: see
    :func:`claim_due_runs_first_params`. Each row: the run's columns, whether it had no
    steps, the lease's token and expiry (NULL where another holder has it), then the
    step's id, its ``first_step`` as text and its lease in ms (NULL where none was
    stored)."""

    def r(name: str) -> str:
        return _c(WorkflowRun, name)

    def s(name: str) -> str:
        return _c(WorkflowStep, name)

    hint_queue = "(c.h->>'queue')"
    timeout = "(c.h->>'timeout')::double precision"
    lease = step_lease_sql(hint_queue, timeout, no_cap=f"{NO_CAP}::bigint")
    only_served = f" AND {hint_queue} = ANY(%s::text[])" if served else ""
    new_cols = columns(WorkflowStep, NEW_STEP_FIELDS + STEP_STATE_FIELDS, _q)
    new_vals = ", ".join(_FROM_HINT[name] for name in NEW_STEP_FIELDS)
    attempt_cols = columns(
        StepAttempt, ("step_id", "attempt", "status", "worker", "started_at"), _q
    )
    key = f"%s || c.{r('id')}::text"
    return (
        f"WITH c AS (SELECT {r('id')} AS id, {r('priority')} AS priority, "
        f"{r('workflow')} AS workflow, {r('first_step')} AS h, "
        f"NOT EXISTS (SELECT 1 FROM {STEPS} WHERE {s('run_id')} = {RUNS}.{r('id')}) AS stepless "
        f"FROM {RUNS} WHERE {r('status')} = '{RunStatus.RUNNING}' "
        f"AND NOT {r('inline')} AND NOT {r('key_waiting')} AND {r('wake_at')} <= %s "
        f"ORDER BY {r('priority')} DESC, {r('wake_at')} LIMIT %s FOR UPDATE SKIP LOCKED), "
        f"l AS (INSERT INTO pikku_lease AS l (key, holder, token, expires_at) "
        f"SELECT {key}, %s, 1, {POSTGRESQL_NOW_MS} + %s FROM c "
        f"{PostgreSQLLeaseSQL.TAKE_ON_CONFLICT} RETURNING l.key, l.token, l.expires_at), "
        f"o AS (SELECT c.id, c.priority, c.h, {lease} AS lease FROM c "
        f"JOIN l ON l.key = {key} WHERE c.stepless AND c.h IS NOT NULL "
        f"AND c.workflow = ANY(%s::text[]) AND NOT {hint_queue} = ANY(%s::text[]){only_served} "
        f"AND {not_paused(hint_queue)}), "
        f"s AS (INSERT INTO {STEPS} ({new_cols}) SELECT {new_vals}, "
        f"'{StepStatus.RUNNING}', NULL, NULL, 1, NULL, {POSTGRESQL_NOW_MS} + o.lease, "
        f"%s::timestamptz, %s::timestamptz "
        f"FROM o ON CONFLICT ({s('run_id')}, {s('name')}) DO NOTHING "
        f"RETURNING {s('id')} AS id, {s('run_id')} AS run_id), "
        f"a AS (INSERT INTO {ATTEMPTS} ({attempt_cols}) "
        f"SELECT s.id, 1, '{StepStatus.RUNNING}', %s::text, %s::timestamptz FROM s), "
        f"u AS (UPDATE {RUNS} SET {r('wake_at')} = CASE WHEN {RUNS}.{r('id')} IN "
        f"(SELECT run_id FROM s) THEN NULL ELSE %s::timestamptz END, {r('first_step')} = NULL "
        f"WHERE {r('id')} = ANY(ARRAY(SELECT id FROM c)) "
        f"RETURNING {_all_columns(WorkflowRun)}) "
        f"SELECT u.*, c.stepless, l.token, l.expires_at, s.id, o.h::text, o.lease FROM u "
        f"JOIN c ON c.id = u.{r('id')} LEFT JOIN l ON l.key = {key} "
        f"LEFT JOIN s ON s.run_id = c.id LEFT JOIN o ON o.id = s.run_id"
    )


def claim_due_runs_first_params(
    now: datetime, until: datetime, limit: int, ask: RunLeaseAsk, first: FirstStepAsk, stamp: Any
) -> list[Any]:
    """The parameters of :func:`claim_due_runs_first_sql` (``stamp``: the rows' times)."""
    served = [list(first.queues)] if first.queues else []
    lease = [ask.prefix, ask.holder, ask.ttl_ms, ask.ttl_ms, ask.ttl_ms]
    return [
        now,
        limit,
        *lease,
        list(first.lease_queues),
        list(first.lease_ms),
        first.default_lease_ms,
        ask.prefix,
        list(first.workflows),
        list(first.left_out),
        *served,
        stamp,
        stamp,
        first.worker[:255],
        stamp,
        until,
        ask.prefix,
    ]
