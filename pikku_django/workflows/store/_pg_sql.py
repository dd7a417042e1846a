"""The SQL of the PostgreSQL store: names, the ready rule, rows read back, the claim of
steps not attempted yet, and new rows' INSERTs."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.models import JSONField

from pikku_django.dbclock import POSTGRESQL_NOW_MS
from pikku_django.leases.sql import PostgreSQLLeaseSQL
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
from pikku_django.models.fields import decode_stored_json
from pikku_django.workflows.store.base import columns


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _t(model: type[Any]) -> str:
    return _q(model._meta.db_table)


def _c(model: type[Any], name: str) -> str:
    return columns(model, (name,), _q)


#: Tables and the columns the statements use, by their model names.
RUNS, STEPS, ATTEMPTS = _t(WorkflowRun), _t(WorkflowStep), _t(StepAttempt)


def not_paused(queue: str) -> str:
    """The condition that the queue ``queue`` (an SQL expression) is not paused: every
    claim of a queued step has it, in the statement that takes the step. A LIMITed
    scalar subquery, looked up by the table's unique index for each step read: the
    planner never makes it a join (a NOT EXISTS may become an anti join that reads
    the whole backlog instead of the claim order's first steps)."""
    column = _c(QueuePause, "queue")
    return f"(SELECT 1 FROM {_t(QueuePause)} qp WHERE qp.{column} = {queue} LIMIT 1) IS NULL"


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
)


def _ready_branches() -> list[tuple[str, str]]:
    """The one rule of a ready step, as SQL: each branch's condition (the first two
    take ``now`` as a parameter) and the column its index orders it by."""

    def s(name: str) -> str:
        return _c(WorkflowStep, name)

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


@functools.cache
def claim_due_runs_sql(leased: bool = False) -> str:
    """Claim up to N due worker runs, each pushed back to a time (its pass's limit).
    Parameters: until, now, limit. Returns each run's columns and whether it has no
    steps.

    ``leased``: each claimed run's lease in ``pikku_lease`` is taken too, as the lease
    service's acquire takes it (parameters after those: key prefix, holder, ttl ms,
    then the upsert's ttl ms twice, then the key prefix again); the lease's token and
    expiry follow each row (NULL where another holder has it)."""

    def r(name: str) -> str:
        return _c(WorkflowRun, name)

    claim = (
        # = ANY(ARRAY(...)): the runs claimed are found by primary key whatever the
        # plan; with IN (...) a generic plan hash-joins the whole runs table.
        f"UPDATE {RUNS} SET {r('wake_at')} = %s, {r('first_step')} = NULL "
        f"WHERE {r('id')} = ANY(ARRAY("
        f"SELECT {r('id')} FROM {RUNS} WHERE {r('status')} = '{RunStatus.RUNNING}' "
        f"AND NOT {r('inline')} AND NOT {r('key_waiting')} "
        f"AND {r('wake_at')} <= %s ORDER BY {r('priority')} DESC, {r('wake_at')} LIMIT %s "
        f"FOR UPDATE SKIP LOCKED)) RETURNING {_all_columns(WorkflowRun)}, "
        f"NOT EXISTS (SELECT 1 FROM {STEPS} WHERE {_c(WorkflowStep, 'run_id')} = "
        f"{RUNS}.{r('id')}) AS stepless"
    )
    if not leased:
        return claim
    return (
        f"WITH c AS ({claim}), "
        f"l AS (INSERT INTO pikku_lease AS l (key, holder, token, expires_at) "
        f"SELECT %s || c.{r('id')}::text, %s, 1, {POSTGRESQL_NOW_MS} + %s FROM c "
        f"{PostgreSQLLeaseSQL.TAKE_ON_CONFLICT} RETURNING l.key, l.token, l.expires_at) "
        f"SELECT c.*, l.token, l.expires_at FROM c "
        f"LEFT JOIN l ON l.key = %s || c.{r('id')}::text"
    )


def _ready_exists(queue: str, *, fresh: bool = True) -> str:
    """Whether a queued step is ready (without ``fresh``: a due retry or a lapsed
    claim), paused queues' too (the claims leave those, and the look stays on its
    indexes alone): one EXISTS per branch, each read in its partial index's order, so that
    even a generic plan takes the index."""
    kind = f"{_c(WorkflowStep, 'kind')} = '{StepKind.QUEUED}'"
    branches = _ready_branches() if fresh else _ready_branches()[1:]
    return "SELECT " + " OR ".join(
        f"EXISTS (SELECT 1 FROM {STEPS} WHERE {kind} AND {cond}{queue} ORDER BY {order} LIMIT 1)"
        for cond, order in branches
    )


def _all_columns(model: type[Any]) -> str:
    """Every concrete column of ``model``, in the order of its fields (for ``from_db``)."""
    return ", ".join(_q(str(f.column)) for f in model._meta.concrete_fields)


def _from_db(using: str, model: type[Any], row: Sequence[Any]) -> Any:
    """A model instance from a row of :func:`_all_columns`, its values converted as
    the ORM converts them (JSON columns arrive as text)."""
    connection = connections[using]
    fields = model._meta.concrete_fields
    values = [
        f.from_db_value(v, None, connection) if hasattr(f, "from_db_value") else v
        for f, v in zip(fields, row, strict=True)
    ]
    return model.from_db(using, [f.attname for f in fields], values)


#: The lease of a step without a timeout is not capped (the largest bigint).
NO_CAP = 2**63 - 1


def _fresh_from(fresh_on: bool, excluding: bool = True) -> str:
    """FROM and WHERE of the ready steps not attempted yet, of running worker runs, on
    queues not paused:
    parameters now, the queues served (``fresh_on``) and the queues left out
    (``excluding``; without, the form a generic plan estimates well: the planner
    guesses that ``<> ALL`` of an unknown array leaves almost no step of a queue).

    Read in claim order off pikku_step_claim_order (whose condition is repeated, so
    that the planner may use it), the first ready steps end the read however long
    the backlog behind them; each step's run is looked up by its key (a LIMITed
    scalar subquery is never made a join over every running run)."""

    def s(name: str) -> str:
        return _c(WorkflowStep, name)

    def r(name: str) -> str:
        return _c(WorkflowRun, name)

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


def _first_fresh_queue(*, fresh_on: bool) -> str:
    """The queue of the first step :func:`_claim_fresh` would claim (no lock taken)."""
    s = functools.partial(_c, WorkflowStep)
    return (
        f"SELECT {s('queue')} {_fresh_from(fresh_on, excluding=False)} "
        f"ORDER BY {s('priority')} DESC, {s('id')} LIMIT 1"
    )


def step_lease_sql(queue: str, timeout: str, *, no_cap: str) -> str:
    """The lease in ms a claim of a step of ``queue`` takes (SQL expressions): the
    queue's own lease or the default, never past ``timeout`` (``no_cap`` where it has
    none). Parameters: the queues with their own lease, those leases, the default."""
    return (
        f"LEAST(COALESCE((SELECT q.l FROM unnest(%s::text[], %s::bigint[]) AS q(n, l) "
        f"WHERE q.n = {queue}), %s::bigint), CASE WHEN {timeout} IS NULL "
        f"THEN {no_cap} ELSE GREATEST(1, floor({timeout} * 1000))::bigint END)"
    )


def _claim_fresh(
    *,
    fresh_on: bool,
    concurrency: bool = False,
    rated: bool = False,
    excluding: bool = True,
    limit: int | None = None,
) -> str:
    """The claim of fresh steps in one statement. ``concurrency`` and ``rated`` (for
    one limited queue, the ``fresh_on`` form with that queue alone) bound it by the
    queue's room and by the rate slots the statement locks, and stamp the slots used;
    each row of a limited form ends with the slots locked and the steps wanted (see
    :func:`_limit_ctes`), and it returns one row of NULL columns when it claims none.
    A ``limit`` (the forms without limits) is written into the statement instead of
    taken as a parameter: the generic plan then knows it, and is cheaper than a
    custom plan and its planning (an unknown LIMIT is guessed at a tenth of the rows)."""
    step, att = WorkflowStep, StepAttempt

    def s(name: str) -> str:
        return _c(step, name)

    lease = step_lease_sql(s("queue"), s("timeout"), no_cap="%s::bigint")
    returned = ", ".join(f"{STEPS}.{_q(str(f.column))}" for f in step._meta.concrete_fields)
    attempt_cols = columns(att, ("step_id", "attempt", "status", "worker", "started_at"), _q)
    limited = concurrency or rated
    ctes, limit_sql, stamp = _limit_ctes(concurrency=concurrency, rated=rated)
    if limit is not None and not limited:
        limit_sql = str(int(limit))
    # A limited claim's attempt starts on the store's clock as its statement runs: after
    # every claim and end that its count saw, and with the rate slot's stamp.
    started = "clock_timestamp()" if limited else "%s"
    in_order = f"u.{s('priority')} DESC, u.{s('id')}"
    last = f"SELECT * FROM u ORDER BY {in_order}"
    if limited:
        locked = "(SELECT count(*) FROM sl)" if rated else "0"
        last = (
            f"SELECT u.*, {locked}, (SELECT n FROM w) FROM (VALUES (1)) AS one(x) "
            f"LEFT JOIN u ON true ORDER BY {in_order}"
        )
    return (
        f"WITH {ctes}c AS (SELECT {s('id')} AS id, {lease} AS lease "
        f"{_fresh_from(fresh_on, excluding)} "
        f"ORDER BY {s('priority')} DESC, {s('id')} LIMIT {limit_sql} FOR UPDATE SKIP LOCKED), "
        f"u AS (UPDATE {STEPS} SET {s('status')} = '{StepStatus.RUNNING}', "
        f"{s('attempt')} = {STEPS}.{s('attempt')} + 1, {s('result')} = NULL, "
        f"{s('error')} = NULL, {s('available_at')} = NULL, "
        f"{s('lease_expires_at')} = {POSTGRESQL_NOW_MS} + c.lease, {s('updated_at')} = %s "
        # = ANY(ARRAY(...)): the steps claimed are found by primary key whatever the
        # plan, which cannot tell how many rows c holds (its LIMIT may be a subquery).
        f"FROM c WHERE {STEPS}.{s('id')} = c.id "
        f"AND {STEPS}.{s('id')} = ANY(ARRAY(SELECT id FROM c)) "
        f"RETURNING {returned}, c.lease AS lease), "
        f"a AS (INSERT INTO {ATTEMPTS} ({attempt_cols}) "
        f"SELECT u.{s('id')}, u.{s('attempt')}, '{StepStatus.RUNNING}', %s, {started} FROM u)"
        f"{stamp} "
        f"{last}"
    )


def _limit_ctes(*, concurrency: bool, rated: bool) -> tuple[str, str, str]:
    """The CTEs that bound a limited queue's claim, the claim's LIMIT, and the CTE that
    stamps the rate slots used.

    ``w``: the steps wanted, the caller's limit less, with ``concurrency``, the
    queue's steps claimed under a lease that has not lapsed (counted by a statement
    that began after the caller took the queue's lock, so every other claim of the
    queue is in its snapshot). ``sl`` (``rated``): up to that many of the queue's
    slots below the rate's count and used more than a period ago, locked with SKIP
    LOCKED, oldest first; a slot stamped by a claim that committed meanwhile is
    re-checked as it is locked, and skipped. The steps claimed are at most the slots
    locked, and as many slots are stamped with the store's clock. Parameters, in
    order: with ``concurrency``, the limit and the queue; with ``rated``, the queue,
    the rate's count and its period in ms; then the caller's limit (twice when
    ``rated``: the slots', then the steps')."""
    if not (concurrency or rated):
        return "", "%s", ""
    step = WorkflowStep

    def s(name: str) -> str:
        return _c(step, name)

    ctes = []
    if concurrency:
        ctes.append(
            f"room AS (SELECT %s::bigint - count(*) AS n FROM {STEPS} "
            f"WHERE {s('kind')} = '{StepKind.QUEUED}' AND {s('queue')} = %s "
            f"AND {s('status')} = '{StepStatus.RUNNING}' "
            f"AND {s('lease_expires_at')} >= {POSTGRESQL_NOW_MS}), "
        )
    if not rated:
        ctes.append("w AS (SELECT GREATEST(0, LEAST(%s::bigint, (SELECT n FROM room))) AS n), ")
        return "".join(ctes), "(SELECT n FROM w)", ""
    slots = _t(QueueClaim)

    def k(name: str) -> str:
        return _c(QueueClaim, name)

    ctes.append(
        f"sl AS (SELECT {k('id')} AS id FROM {slots} WHERE {k('queue')} = %s "
        f"AND {k('slot')} < %s AND {k('claimed_ms')} <= {POSTGRESQL_NOW_MS} - %s::bigint "
        f"ORDER BY {k('claimed_ms')} LIMIT (SELECT n FROM w) FOR UPDATE SKIP LOCKED), "
    )
    wanted = "GREATEST(0, LEAST(%s::bigint, (SELECT n FROM room)))" if concurrency else "%s::bigint"
    # w comes first: sl's LIMIT reads it.
    ctes.insert(len(ctes) - 1, f"w AS (SELECT {wanted} AS n), ")
    stamp = (
        f", st AS (UPDATE {slots} SET {k('claimed_ms')} = {POSTGRESQL_NOW_MS} "
        f"WHERE {k('id')} IN (SELECT id FROM sl ORDER BY id LIMIT (SELECT count(*) FROM u)))"
    )
    return "".join(ctes), "LEAST(%s::bigint, (SELECT count(*) FROM sl))", stamp


def _insert_sql(obj: Any) -> tuple[str, list[Any]]:
    """The INSERT of the new model instance ``obj`` (its ``auto_now`` fields filled in
    on ``obj`` as ``save()`` fills them), without running it."""
    sql, fields = _insert_shape(type(obj), obj.pk is None)
    values = []
    for f in fields:
        value = f.pre_save(obj, add=True)
        values.append(_jsonb(value) if isinstance(f, JSONField) else value)
    return sql, values


_INSERT_SHAPES: dict[tuple[type[Any], bool], tuple[str, list[Any]]] = {}


def _insert_shape(model: type[Any], auto_pk: bool) -> tuple[str, list[Any]]:
    """The INSERT statement of ``model`` (without its auto primary key when
    ``auto_pk``), and the fields whose values it takes, in order. The values of the
    models' fields (UUIDs, datetimes, numbers, text) need no conversion on PostgreSQL
    but JSON, which is sent as text."""
    found = _INSERT_SHAPES.get((model, auto_pk))
    if found is None:
        meta = model._meta
        fields = [
            f
            for f in meta.local_concrete_fields
            if not (auto_pk and f is meta.auto_field) and not f.generated
        ]
        marks = ", ".join("%s::jsonb" if isinstance(f, JSONField) else "%s" for f in fields)
        cols = ", ".join(_q(str(f.column)) for f in fields)
        found = f"INSERT INTO {_t(model)} ({cols}) VALUES ({marks})", fields
        _INSERT_SHAPES[(model, auto_pk)] = found
    return found


def _loads(text: str | None) -> Any:
    """A JSON column read back as text, decoded as the ORM decodes it (an
    :class:`~pikku_django.models.fields.UnreadableJSON` when Python cannot read it)."""
    return None if text is None else decode_stored_json(text)


def _jsonb(value: Any) -> str | None:
    """A JSON value as text for a ``::jsonb`` parameter (SQL NULL for None, as the ORM)."""
    return None if value is None else json.dumps(value)
