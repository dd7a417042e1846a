"""The PostgreSQL store's names (tables, columns, constants) and the conditions its SQL shares."""

from __future__ import annotations

import functools
from typing import Any

from pikku_django.dbclock import POSTGRESQL_NOW_MS
from pikku_django.leases.sql import (
    POSTGRESQL_FIRST_TOKEN,
    PostgreSQLLeaseSQL,
    postgresql_next_token,
)
from pikku_django.models import (
    CLAIMABLE_STATUSES,
    QueueClaim,
    QueuePause,
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows.store.base import columns

# -- names ---------------------------------------------------------------------------


def q(name: str) -> str:
    """``name`` quoted as an identifier."""
    return '"' + name.replace('"', '""') + '"'


def _t(model: type[Any]) -> str:
    return q(model._meta.db_table)


def _c(model: type[Any], name: str) -> str:
    return columns(model, (name,), q)


#: A column of a run, a step, an attempt, a rate slot.
r, s, a, k = (
    functools.partial(_c, m) for m in (WorkflowRun, WorkflowStep, StepAttempt, QueueClaim)
)
RUNS, STEPS, ATTEMPTS = _t(WorkflowRun), _t(WorkflowStep), _t(StepAttempt)

#: The columns of a new step, as :class:`NewStep` names them.
NEW_STEP_FIELDS = (
    "run_id",
    "name",
    "kind",
    "function",
    "input",
    "retries",
    "retry_delay",
    "backoff",
    "queue",
    "transactional",
    "priority",
    "timeout",
)
#: Then the columns every insert of a step writes after those.
STEP_STATE_FIELDS = (
    "status",
    "result",
    "error",
    "attempt",
    "available_at",
    "lease_expires_at",
    "created_at",
    "updated_at",
    "claim_token",
)
#: The lease of a step without a timeout is not capped (the largest bigint).
NO_CAP = 2**63 - 1
#: The first key of the advisory locks that limited queues' claims take.
QUEUE_LOCK_SPACE = 0x70696B6B

_NEW_STEP_COLS = columns(WorkflowStep, NEW_STEP_FIELDS + STEP_STATE_FIELDS, q)
_NEW_STEP_VALS = "%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s"
_ATTEMPT_START_COLS = columns(
    StepAttempt, ("step_id", "attempt", "status", "worker", "started_at"), q
)
_ON_STEP_CONFLICT = f"ON CONFLICT ({s('run_id')}, {s('name')}) DO NOTHING"
#: The first attempts of the steps a SELECT gives (step id, attempt, status, worker, started).
_START_ATTEMPTS = f"INSERT INTO {ATTEMPTS} ({_ATTEMPT_START_COLS}) SELECT"
#: The run whose id is a parameter is in the status that is the next one.
_RUN_IN_STATUS = f"EXISTS (SELECT 1 FROM {RUNS} WHERE {r('id')} = %s AND {r('status')} = %s)"
#: Whether a run (of the runs table, unaliased) has no step yet.
_STEPLESS = f"NOT EXISTS (SELECT 1 FROM {STEPS} WHERE {s('run_id')} = {RUNS}.{r('id')}) AS stepless"
#: Due worker runs, in claim order, locked (parameters: now, the limit).
_DUE_RUNS = (
    f"FROM {RUNS} WHERE {r('status')} = '{RunStatus.RUNNING}' "
    f"AND NOT {r('inline')} AND NOT {r('key_waiting')} AND {r('wake_at')} <= %s "
    f"ORDER BY {r('priority')} DESC, {r('wake_at')} LIMIT %s FOR UPDATE SKIP LOCKED"
)
#: The lease key of a claimed run ``c`` (parameter: the key prefix).
_RUN_LEASE_KEY = f"%s || c.{r('id')}::text"
#: ``l``: the leases of the claimed runs ``c`` taken, as the lease service's acquire takes
#: them (parameters: key prefix, holder, ttl ms, then the upsert's).
_TAKE_RUN_LEASES = (
    f"l AS (INSERT INTO pikku_lease AS l (key, holder, token, expires_at) "
    f"SELECT {_RUN_LEASE_KEY}, %s, {POSTGRESQL_FIRST_TOKEN}, {POSTGRESQL_NOW_MS} + %s FROM c "
    f"{PostgreSQLLeaseSQL.TAKE_ON_CONFLICT} RETURNING l.key, l.token, l.expires_at)"
)


def all_columns(model: type[Any]) -> str:
    """Every concrete column of ``model``, in the order of its fields (for ``from_db``)."""
    return ", ".join(q(str(f.column)) for f in model._meta.concrete_fields)


# -- shared conditions ---------------------------------------------------------------


#: The claim token of a step's next claim (the lease tokens' rule), and of a step
#: inserted claimed.
NEXT_CLAIM_TOKEN = postgresql_next_token(s("claim_token"))
FIRST_CLAIM_TOKEN = POSTGRESQL_FIRST_TOKEN
#: The fence of every statement here that writes a claimed attempt's outcome (the
#: steps table unaliased; through the ORM it is ``step_writes.running_attempt``): the
#: step still running as that attempt under that claim. Parameters: step id,
#: attempt, running, claim token (NULL: fenced by the attempt alone).
CLAIM_FENCE = (
    f"{s('id')} = %s AND {s('attempt')} = %s AND {s('status')} = %s "
    f"AND {s('claim_token')} = COALESCE(%s::bigint, {s('claim_token')})"
)


def claimed(attempt: str, lease: str) -> str:
    """The SET of a step claimed as attempt ``attempt`` + 1 under a lease of ``lease``
    ms (SQL expressions), with its next claim token. Parameter: updated at."""
    return (
        f"{s('status')} = '{StepStatus.RUNNING}', {s('attempt')} = {attempt} + 1, "
        f"{s('claim_token')} = {NEXT_CLAIM_TOKEN}, "
        f"{s('result')} = NULL, {s('error')} = NULL, {s('available_at')} = NULL, "
        f"{s('lease_expires_at')} = {POSTGRESQL_NOW_MS} + {lease}, {s('updated_at')} = %s"
    )


def not_paused(queue: str) -> str:
    """The queue ``queue`` (an SQL expression) is not paused. A LIMITed scalar
    subquery, looked up by the table's unique index for each step read: the planner
    never makes it a join (a NOT EXISTS may become an anti join over the backlog)."""
    column = _c(QueuePause, "queue")
    return f"(SELECT 1 FROM {_t(QueuePause)} qp WHERE qp.{column} = {queue} LIMIT 1) IS NULL"


def _ready_branches() -> list[tuple[str, str]]:
    """The one rule of a ready step, as SQL: each branch's condition (the first two
    take ``now`` as a parameter) and the column its index orders it by."""
    return [
        (
            f"{s('status')} IN ('{StepStatus.SCHEDULED}', '{StepStatus.PENDING}') "
            f"AND {s('available_at')} <= %s",
            s("available_at"),
        ),
        (
            f"{s('status')} = '{StepStatus.FAILED}' AND {s('attempt')} < {s('retries')} + 1 "
            f"AND {s('available_at')} <= %s",
            s("available_at"),
        ),
        (
            f"{s('status')} = '{StepStatus.RUNNING}' "
            f"AND {s('lease_expires_at')} < {POSTGRESQL_NOW_MS}",
            s("lease_expires_at"),
        ),
    ]


def step_lease(queue: str, timeout: str, *, no_cap: str) -> str:
    """The lease in ms a claim of a step of ``queue`` takes (SQL expressions): the
    queue's own lease or the default, never past ``timeout`` (``no_cap`` where it has
    none). Parameters: the queues with their own lease, those leases, the default."""
    return (
        f"LEAST(COALESCE((SELECT q.l FROM unnest(%s::text[], %s::bigint[]) AS q(n, l) "
        f"WHERE q.n = {queue}), %s::bigint), CASE WHEN {timeout} IS NULL "
        f"THEN {no_cap} ELSE GREATEST(1, floor({timeout} * 1000))::bigint END)"
    )


def _fresh_from(fresh_on: bool, excluding: bool = True) -> str:
    """FROM and WHERE of the ready steps not attempted yet, of running worker runs, on
    queues not paused. Parameters: now, the queues served (``fresh_on``), the queues
    left out (``excluding``; without, the form a generic plan estimates well).

    Read in claim order off pikku_step_claim_order (whose condition is repeated, so
    that the planner may use it), the first ready steps end the read however long
    the backlog behind them; each step's run is looked up by its key."""
    served = f" AND {s('queue')} = ANY(%s)" if fresh_on else ""
    left_out = f" AND NOT {s('queue')} = ANY(%s)" if excluding else ""
    claimable = ", ".join(f"'{status}'" for status in CLAIMABLE_STATUSES)
    unpaused = not_paused(f"{STEPS}.{s('queue')}")
    return (
        f"FROM {STEPS} WHERE {s('kind')} = '{StepKind.QUEUED}' AND "
        f"{_ready_branches()[0][0]}{served}{left_out} "
        f"AND {s('status')} IN ({claimable}) AND {unpaused} "
        f"AND (SELECT run.{r('id')} FROM {RUNS} run WHERE run.{r('id')} = {STEPS}.{s('run_id')} "
        f"AND run.{r('status')} = '{RunStatus.RUNNING}' AND NOT run.{r('inline')} LIMIT 1) "
        f"IS NOT NULL"
    )


def _step_done_ctes() -> str:
    """``done`` and ``done_a``: a step attempt's success (``done`` returns the step's
    run and its result as text). Parameters: succeeded, updated at, result, step id,
    attempt, running, claim token; succeeded, finished at, result, step id, attempt."""
    return (
        f"done AS (UPDATE {STEPS} SET {s('status')} = %s, {s('lease_expires_at')} = NULL, "
        f"{s('updated_at')} = %s, {s('result')} = %s::jsonb, {s('error')} = NULL, "
        f"{s('available_at')} = NULL WHERE {CLAIM_FENCE} "
        f"RETURNING {s('run_id')} AS run_id, {s('result')}::text AS result), "
        f"done_a AS (UPDATE {ATTEMPTS} SET {a('status')} = %s, {a('finished_at')} = %s, "
        f"{a('result')} = %s::jsonb, {a('error')} = NULL "
        f"WHERE {a('step_id')} = %s AND {a('attempt')} = %s AND EXISTS (SELECT 1 FROM done))"
    )
