"""Every SQL statement of the PostgreSQL store, by name, grouped by what it does:
start, look, claim, settle, end. Announcements ride in the statements that make the
work (``pg_notify`` on :mod:`pikku_django.wakeups`' channels); a bare announcement is
:func:`pikku_django.wakeups.announce`.

Tables and columns are named from the models' ``_meta``; each statement is built
once per process, on first use (:func:`statement`). A statement's parameters are
listed in its entry's comment, in order; ``postgresql_rows`` builds them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.models import JSONField

from pikku_django.dbclock import POSTGRESQL_NOW_MS
from pikku_django.leases.sql import (
    POSTGRESQL_FIRST_TOKEN,
    PostgreSQLLeaseSQL,
    postgresql_next_token,
)
from pikku_django.models import (
    CLAIMABLE_STATUSES,
    AttemptStatus,
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


# -- start ---------------------------------------------------------------------------


def _runs_with_keys() -> str:
    """Parameters: the workflows, the keys."""
    return (
        f"SELECT {r('id')}, {r('workflow')}, {r('idempotency_key')} FROM {RUNS} "
        f"WHERE ({r('workflow')}, {r('idempotency_key')}) IN "
        f"(SELECT * FROM unnest(%s::text[], %s::text[]))"
    )


_INSERT_FIELDS: dict[tuple[type[Any], bool], list[Any]] = {}


def insert_fields(model: type[Any], auto_pk: bool) -> list[Any]:
    """The fields whose values an INSERT of ``model`` takes, in order (without its auto
    primary key when ``auto_pk``)."""
    found = _INSERT_FIELDS.get((model, auto_pk))
    if found is None:
        meta = model._meta
        found = [
            f
            for f in meta.local_concrete_fields
            if not (auto_pk and f is meta.auto_field) and not f.generated
        ]
        _INSERT_FIELDS[(model, auto_pk)] = found
    return found


def _insert(model: type[Any], auto_pk: bool) -> str:
    """The INSERT of a ``model`` row (JSON sent as text)."""
    fields = insert_fields(model, auto_pk)
    marks = ", ".join("%s::jsonb" if isinstance(f, JSONField) else "%s" for f in fields)
    cols = ", ".join(q(str(f.column)) for f in fields)
    return f"INSERT INTO {_t(model)} ({cols}) VALUES ({marks})"


def _start_run(opening: bool, announce: bool) -> str:
    """A new run and (``opening``) its first step, in one statement, and (``announce``)
    its announcement. Parameters: the run's fields (:func:`insert_fields`), the step's
    (its id made by the database), then the work channel (``announce``)."""
    parts = [f"r AS ({_insert(WorkflowRun, False)} RETURNING {r('id')})"]
    if opening:
        parts.append(f"s AS ({_insert(WorkflowStep, True)})")
    return f"WITH {', '.join(parts)} SELECT " + (
        "count(pg_notify(%s, '')) FROM r" if announce else "count(*) FROM r"
    )


def _postgresql() -> Any:
    """A PostgreSQL connection's wrapper (not connected), for its column types."""
    return next(c for c in connections.all() if c.vendor == "postgresql")


def _insert_unnest(model: type[Any], auto_pk: bool, where: str = "") -> str:
    """The INSERT of ``model`` rows from one array per field (:func:`insert_fields`,
    JSON as text), as ``unnest`` reads them (aliased ``n.c0``, ``n.c1``...)."""
    fields = insert_fields(model, auto_pk)
    connection = _postgresql()
    arrays = ", ".join(
        "%s::text[]" if isinstance(f, JSONField) else f"%s::{f.db_type(connection)}[]"
        for f in fields
    )
    picks = ", ".join(
        f"n.c{i}::jsonb" if isinstance(f, JSONField) else f"n.c{i}" for i, f in enumerate(fields)
    )
    cols = ", ".join(q(str(f.column)) for f in fields)
    names = ", ".join(f"c{i}" for i in range(len(fields)))
    return (
        f"INSERT INTO {_t(model)} ({cols}) SELECT {picks} FROM unnest({arrays}) AS n({names})"
        f"{where}"
    )


def _start_runs(openings: bool, announce: bool) -> str:
    """New runs (those whose idempotency key is taken left out) and (``openings``)
    the opening steps of those made, in one statement, and (``announce``) one
    announcement if any was made. Parameters: an array per run field
    (:func:`insert_fields`), then (``openings``) per step field, then the work channel
    (``announce``). Returns the ids of the runs made."""
    made = (
        f"made AS ({_insert_unnest(WorkflowRun, False)} "
        f"ON CONFLICT ({r('workflow')}, {r('idempotency_key')}) DO NOTHING "
        f"RETURNING {r('id')} AS id)"
    )
    parts = [made]
    if openings:
        run_id = [f.attname for f in insert_fields(WorkflowStep, True)].index("run_id")
        where = f" WHERE n.c{run_id} IN (SELECT id FROM made)"
        parts.append(f"opened AS ({_insert_unnest(WorkflowStep, True, where)})")
    if not announce:
        return f"WITH {', '.join(parts)} SELECT id FROM made"
    parts.append(
        "told AS (SELECT count(pg_notify(%s, '')) AS n FROM (SELECT 1 FROM made LIMIT 1) AS one)"
    )
    return f"WITH {', '.join(parts)} SELECT id, (SELECT n FROM told) FROM made"


# -- look: whether work is ready, without claiming it ----------------------------------


def _ready_exists(served: bool, *, fresh: bool = True) -> str:
    """Whether a queued step is ready (without ``fresh``: a due retry or a lapsed
    claim), paused queues' too: one EXISTS per branch, each read in its partial
    index's order. Parameters: per branch, now (not the lapsed one's), then the
    queues served (``served``)."""
    kind = f"{s('kind')} = '{StepKind.QUEUED}'"
    queue = f" AND {s('queue')} = ANY(%s)" if served else ""
    branches = _ready_branches() if fresh else _ready_branches()[1:]
    return "SELECT " + " OR ".join(
        f"EXISTS (SELECT 1 FROM {STEPS} WHERE {kind} AND {cond}{queue} ORDER BY {order} LIMIT 1)"
        for cond, order in branches
    )


def _first_fresh_queue(fresh_on: bool) -> str:
    """The queue of the first step :func:`claim_fresh` would claim (no lock taken).
    Parameters: now, the queues served (``fresh_on``)."""
    return (
        f"SELECT {s('queue')} {_fresh_from(fresh_on, excluding=False)} "
        f"ORDER BY {s('priority')} DESC, {s('id')} LIMIT 1"
    )


# -- claim ---------------------------------------------------------------------------


def _claim_step() -> str:
    """The claim decision for one step, made and carried out in one statement (the
    rule lives here alone on PostgreSQL). The step is locked, then judged:

    - ``claim``: scheduled or pending, or failed with an attempt left, and due
      (no ``available_at``, or at most ``now``); or running under a lapsed lease
      with an attempt left and not past its timeout. Taken as its next attempt if
      its run is running and (pausable) its queue is not paused; a lapsed attempt
      is closed as superseded.
    - ``timed_out``: running under a lapsed lease, its attempt begun at least its
      timeout ago (the caller closes it by its retry policy);
    - ``expired``: running under a lapsed lease, no attempt left: failed here with
      the error given, fenced by its attempt;
    - ``none``: live, parked, settled, not due, or failed for good.

    Parameters: step id, now, now; pausable; lease ms, updated at; superseded at;
    worker, started at; the error (JSON text), updated at; the error, finished at.
    Returns the verdict, whether this claimed (or failed) the step, the attempt
    judged, whether it was running, the new attempt's start and its claim token."""
    running, failed = f"'{StepStatus.RUNNING}'", f"'{StepStatus.FAILED}'"
    lapsed = f"st.{s('lease_expires_at')} < {POSTGRESQL_NOW_MS}"
    attempt_left = f"st.{s('attempt')} < st.{s('retries')} + 1"
    timed_out = (
        f"st.{s('timeout')} IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {ATTEMPTS} pa "
        f"WHERE pa.{a('step_id')} = st.{s('id')} AND pa.{a('attempt')} = st.{s('attempt')} "
        f"AND pa.{a('started_at')} + st.{s('timeout')} * interval '1 second' > %s)"
    )
    due = f"(st.{s('available_at')} IS NULL OR st.{s('available_at')} <= %s)"
    verdict = (
        f"CASE WHEN st.{s('status')} = {running} THEN CASE WHEN NOT COALESCE({lapsed}, false) "
        f"THEN 'none' WHEN {timed_out} THEN 'timed_out' WHEN {attempt_left} THEN 'claim' "
        f"ELSE 'expired' END "
        f"WHEN st.{s('status')} IN ('{StepStatus.SUCCEEDED}', '{StepStatus.SUSPENDED}') "
        f"THEN 'none' WHEN NOT {due} THEN 'none' "
        f"WHEN st.{s('status')} = {failed} AND NOT {attempt_left} THEN 'none' "
        f"ELSE 'claim' END"
    )

    def step(name: str) -> str:
        return f"{STEPS}.{s(name)}"

    def att(name: str) -> str:
        return f"{ATTEMPTS}.{a(name)}"

    # Each write is fenced by the step's status and attempt as judged (and a lapsed
    # claim by its lease), whatever committed since the snapshot.
    fence = f"{step('id')} = d.id AND {step('status')} = d.status AND {step('attempt')} = d.attempt"
    still_lapsed = f"(d.status <> {running} OR {step('lease_expires_at')} < {POSTGRESQL_NOW_MS})"
    live_run = (
        f"(SELECT 1 FROM {RUNS} run WHERE run.{r('id')} = {step('run_id')} "
        f"AND run.{r('status')} = '{RunStatus.RUNNING}' LIMIT 1) IS NOT NULL"
    )
    return (
        f"WITH st AS (SELECT * FROM {STEPS} WHERE {s('id')} = %s FOR UPDATE), "
        f"d AS (SELECT st.{s('id')} AS id, st.{s('status')} AS status, "
        f"st.{s('attempt')} AS attempt, {verdict} AS verdict FROM st), "
        f"c AS (UPDATE {STEPS} SET {claimed('d.attempt', '%s')} "
        f"FROM d WHERE d.verdict = 'claim' AND {fence} "
        f"AND {still_lapsed} AND {live_run} "
        f"AND (NOT %s OR {step('kind')} <> '{StepKind.QUEUED}' "
        f"OR {not_paused(step('queue'))}) "
        f"RETURNING {step('id')} AS id, {step('attempt')} AS attempt, "
        f"{step('claim_token')} AS token), "
        f"sup AS (UPDATE {ATTEMPTS} SET {a('status')} = '{AttemptStatus.SUPERSEDED}', "
        f"{a('finished_at')} = %s FROM d WHERE d.status = {running} "
        f"AND {att('step_id')} IN (SELECT id FROM c) AND {att('attempt')} = d.attempt "
        f"AND {att('status')} = '{AttemptStatus.RUNNING}'), "
        f"n AS ({_START_ATTEMPTS} id, attempt, {running}, %s, %s FROM c "
        f"RETURNING {a('started_at')} AS started), "
        f"x AS (UPDATE {STEPS} SET {s('status')} = {failed}, {s('error')} = %s::jsonb, "
        f"{s('lease_expires_at')} = NULL, {s('available_at')} = NULL, {s('updated_at')} = %s "
        f"FROM d WHERE d.verdict = 'expired' AND {fence} "
        f"AND {step('lease_expires_at')} < {POSTGRESQL_NOW_MS} RETURNING {step('id')} AS id), "
        f"xa AS (UPDATE {ATTEMPTS} SET {a('status')} = {failed}, {a('error')} = %s::jsonb, "
        f"{a('finished_at')} = %s FROM d WHERE {att('step_id')} IN (SELECT id FROM x) "
        f"AND {att('attempt')} = d.attempt) "
        f"SELECT d.verdict, EXISTS (SELECT 1 FROM c) OR EXISTS (SELECT 1 FROM x), d.attempt, "
        f"d.status = {running}, (SELECT started FROM n), (SELECT token FROM c) FROM d"
    )


def claim_fresh(
    *,
    fresh_on: bool,
    concurrency: bool = False,
    rated: bool = False,
    excluding: bool = True,
    limit: int | None = None,
) -> str:
    """The claim of fresh steps (scheduled or pending, and due) in one statement, each
    as its next attempt under its queue's lease (capped by its timeout), in the claim
    order. ``concurrency`` and ``rated`` (one limited queue, ``fresh_on`` that queue
    alone) bound it by the queue's room and by the rate slots it locks, and stamp the
    slots used; each row then ends with the slots locked and the steps wanted, and one
    row of NULL columns comes back when none is claimed. A ``limit`` (the forms
    without limits) is written in: the generic plan then knows it.

    Parameters: the limits' (:func:`_limit_ctes`), the queues' names and leases, the
    default lease, the no-cap, now, the queues served (``fresh_on``), the queues left
    out (``excluding``), the LIMIT (not with ``limit``; twice when ``rated``), updated
    at, worker, started at (not when limited: the statement's own clock)."""
    lease = step_lease(s("queue"), s("timeout"), no_cap="%s::bigint")
    returned = ", ".join(f"{STEPS}.{q(str(f.column))}" for f in WorkflowStep._meta.concrete_fields)
    limited = concurrency or rated
    ctes, limit_sql, stamp = _limit_ctes(concurrency=concurrency, rated=rated)
    if limit is not None and not limited:
        limit_sql = str(int(limit))
    # A limited claim's attempt starts on the store's clock as its statement runs: after
    # every claim and end that its count saw, and with the rate slot's stamp.
    started = "clock_timestamp()" if limited else "%s"
    in_order = f"u.{s('priority')} DESC, u.{s('id')}"
    prior = f"{STEPS}.{s('attempt')}"  # the attempt the claim follows
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
        f"u AS (UPDATE {STEPS} SET {claimed(prior, 'c.lease')} "
        # = ANY(ARRAY(...)): the steps claimed are found by primary key whatever the
        # plan, which cannot tell how many rows c holds (its LIMIT may be a subquery).
        f"FROM c WHERE {STEPS}.{s('id')} = c.id "
        f"AND {STEPS}.{s('id')} = ANY(ARRAY(SELECT id FROM c)) "
        f"RETURNING {returned}, c.lease AS lease), "
        f"a AS ({_START_ATTEMPTS} u.{s('id')}, u.{s('attempt')}, '{StepStatus.RUNNING}', "
        f"%s, {started} FROM u)"
        f"{stamp} "
        f"{last}"
    )


def _limit_ctes(*, concurrency: bool, rated: bool) -> tuple[str, str, str]:
    """The CTEs that bound a limited queue's claim, the claim's LIMIT, and the CTE that
    stamps the rate slots used.

    ``w``: the steps wanted, the caller's limit less, with ``concurrency``, the
    queue's steps claimed under a lease that has not lapsed (counted by a statement
    that began after the caller took the queue's lock). ``sl`` (``rated``): up to
    that many of the queue's slots below the rate's count and used more than a
    period ago, locked with SKIP LOCKED, oldest first; a slot stamped meanwhile is
    re-checked as it is locked, and skipped. Parameters: with ``concurrency``, the
    limit and the queue; with ``rated``, the queue, the rate's count and its period
    in ms; then the caller's limit (twice when ``rated``)."""
    if not (concurrency or rated):
        return "", "%s", ""
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


def _queue_lock() -> str:
    """A limited queue's advisory lock, held to the transaction's end. Parameters: the
    lock space, the queue's lock name."""
    return "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"


def _claim_due_runs(leased: bool = False) -> str:
    """Claim up to N due worker runs, each pushed back to ``until`` (its pass's limit).
    Parameters: until, now, limit. Returns each run's columns and whether it has no
    steps. ``leased``: each run's lease in ``pikku_lease`` is taken too, as the lease
    service's acquire takes it (parameters after those: key prefix, holder, ttl ms,
    the upsert's ttl ms twice, the key prefix again); its token and expiry follow
    each row (NULL where another holder has it)."""
    claim = (
        # = ANY(ARRAY(...)): the runs claimed are found by primary key whatever the
        # plan; with IN (...) a generic plan hash-joins the whole runs table.
        f"UPDATE {RUNS} SET {r('wake_at')} = %s, {r('first_step')} = NULL "
        f"WHERE {r('id')} = ANY(ARRAY(SELECT {r('id')} {_DUE_RUNS})) "
        f"RETURNING {all_columns(WorkflowRun)}, {_STEPLESS}"
    )
    if not leased:
        return claim
    return (
        f"WITH c AS ({claim}), {_TAKE_RUN_LEASES} "
        f"SELECT c.*, l.token, l.expires_at FROM c LEFT JOIN l ON l.key = {_RUN_LEASE_KEY}"
    )


#: How each column of a run's first step is read from its ``first_step`` (``o.h``),
#: in the order of :data:`NEW_STEP_FIELDS`.
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


def _claim_due_runs_first(served: bool) -> str:
    """The leased claim of due runs that also stores each claimed run's first step
    (its ``first_step``, found when it started) claimed by the worker, for a stepless
    run of a workflow this code knows whose lease was taken; such a run is parked,
    the others pushed back to ``until``. Every claimed run's ``first_step`` is
    cleared. ``served``: only a first step of the worker's queues. Never one of a
    limited queue.

    Parameters: now, limit; key prefix, holder, ttl ms twice, ttl ms; the queues'
    names and leases, the default lease; key prefix; the workflows known, the queues
    left out, the queues served (``served``); created at, updated at; worker, started
    at; until; key prefix. Each row: the run's columns, stepless, the lease's token
    and expiry, then the step's id, its ``first_step`` as text, its lease in ms and
    its claim token."""
    hint_queue = "(c.h->>'queue')"
    timeout = "(c.h->>'timeout')::double precision"
    lease = step_lease(hint_queue, timeout, no_cap=f"{NO_CAP}::bigint")
    only_served = f" AND {hint_queue} = ANY(%s::text[])" if served else ""
    new_vals = ", ".join(_FROM_HINT[name] for name in NEW_STEP_FIELDS)
    key = _RUN_LEASE_KEY
    return (
        f"WITH c AS (SELECT {r('id')} AS id, {r('priority')} AS priority, "
        f"{r('workflow')} AS workflow, {r('first_step')} AS h, {_STEPLESS} {_DUE_RUNS}), "
        f"{_TAKE_RUN_LEASES}, "
        f"o AS (SELECT c.id, c.priority, c.h, {lease} AS lease FROM c "
        f"JOIN l ON l.key = {key} WHERE c.stepless AND c.h IS NOT NULL "
        f"AND c.workflow = ANY(%s::text[]) AND NOT {hint_queue} = ANY(%s::text[]){only_served} "
        f"AND {not_paused(hint_queue)}), "
        f"s AS (INSERT INTO {STEPS} ({_NEW_STEP_COLS}) SELECT {new_vals}, "
        f"'{StepStatus.RUNNING}', NULL, NULL, 1, NULL, {POSTGRESQL_NOW_MS} + o.lease, "
        f"%s::timestamptz, %s::timestamptz, {FIRST_CLAIM_TOKEN} "
        f"FROM o {_ON_STEP_CONFLICT} "
        f"RETURNING {s('id')} AS id, {s('run_id')} AS run_id, {s('claim_token')} AS token), "
        f"a AS ({_START_ATTEMPTS} s.id, 1, '{StepStatus.RUNNING}', %s::text, "
        f"%s::timestamptz FROM s), "
        f"u AS (UPDATE {RUNS} SET {r('wake_at')} = CASE WHEN {RUNS}.{r('id')} IN "
        f"(SELECT run_id FROM s) THEN NULL ELSE %s::timestamptz END, {r('first_step')} = NULL "
        f"WHERE {r('id')} = ANY(ARRAY(SELECT id FROM c)) "
        f"RETURNING {all_columns(WorkflowRun)}) "
        f"SELECT u.*, c.stepless, l.token, l.expires_at, s.id, o.h::text, o.lease, s.token "
        f"FROM u "
        f"JOIN c ON c.id = u.{r('id')} LEFT JOIN l ON l.key = {key} "
        f"LEFT JOIN s ON s.run_id = c.id LEFT JOIN o ON o.id = s.run_id"
    )


def _insert_claimed(after_step: bool = False) -> str:
    """Store a queued step as claimed (its first attempt running under a lease) if its
    run is running and its queue is not paused, and park the run unless it was woken
    since ``park_wakes``.

    Parameters: the step's columns (:data:`NEW_STEP_FIELDS`), running, lease ms,
    created at, updated at, run id, running, the step's queue; attempt status, worker,
    started at; updated at, run id, running, park wakes. Returns the step's id,
    input as text and claim token.

    ``after_step`` (``settle_then_claim``): the step success first (the ``done``
    CTEs, their parameters first), the claim only if that was recorded with its
    result as expected (its text, a parameter after the claim's "running"), and else
    the run due at a time given last (parameters: pass wake at, updated at, run id,
    running). Returns the result as stored, the step's id and input, the run's status
    and wakes, the step's claim token; no row when the success was not recorded."""
    guard = (
        " AND EXISTS (SELECT 1 FROM done WHERE done.result IS NOT DISTINCT FROM %s)"
        if after_step
        else ""
    )
    sql = (
        f"WITH {_step_done_ctes() + ', ' if after_step else ''}"
        f"s AS (INSERT INTO {STEPS} ({_NEW_STEP_COLS}) "
        f"SELECT {_NEW_STEP_VALS}, %s, NULL, NULL, 1, NULL, {POSTGRESQL_NOW_MS} + %s, %s, %s, "
        f"{FIRST_CLAIM_TOKEN} WHERE {_RUN_IN_STATUS} "
        f"AND {not_paused('%s')}{guard} {_ON_STEP_CONFLICT} "
        f"RETURNING {s('id')} AS id, {s('input')} AS input, {s('claim_token')} AS token), "
        f"a AS ({_START_ATTEMPTS} id, 1, %s, %s, %s FROM s), "
        f"r AS (UPDATE {RUNS} SET {r('wake_at')} = NULL, {r('updated_at')} = %s "
        f"WHERE {r('id')} = %s AND {r('status')} = %s AND {r('wakes')} = %s "
        f"AND {r('wake_at')} IS NOT NULL AND EXISTS (SELECT 1 FROM s))"
    )
    if not after_step:
        return sql + " SELECT id, input::text, token FROM s"
    return sql + (
        f", rp AS (UPDATE {RUNS} SET {r('wake_at')} = %s, {r('updated_at')} = %s "
        f"WHERE {r('id')} = %s AND {r('status')} = %s AND NOT EXISTS (SELECT 1 FROM s) "
        f"AND EXISTS (SELECT 1 FROM done)) "
        f"SELECT done.result, s.id, s.input::text, run.{r('status')}, run.{r('wakes')}, s.token "
        f"FROM done LEFT JOIN s ON true JOIN {RUNS} run ON run.{r('id')} = done.run_id"
    )


# -- settle --------------------------------------------------------------------------


def _insert_settled() -> str:
    """A step inserted with its first attempt settled, while its run runs. Parameters:
    the step's columns, status, result, error, available at, created at, updated at,
    run id, running; the attempt's status, error, worker, started at, finished at."""
    attempt_cols = columns(StepAttempt, ("step_id", "attempt", "status", "result", "error"), q)
    attempt_tail = columns(StepAttempt, ("worker", "started_at", "finished_at"), q)
    return (
        f"WITH s AS (INSERT INTO {STEPS} ({_NEW_STEP_COLS}) "
        f"SELECT {_NEW_STEP_VALS}, %s, %s::jsonb, %s::jsonb, 1, %s, NULL, %s, %s, 0 "
        f"WHERE {_RUN_IN_STATUS} {_ON_STEP_CONFLICT} "
        f"RETURNING {s('id')} AS id, {s('result')} AS result) "
        f"INSERT INTO {ATTEMPTS} ({attempt_cols}, {attempt_tail}) "
        f"SELECT id, 1, %s, result, %s::jsonb, %s, %s, %s FROM s "
        f"RETURNING {a('step_id')}, {a('result')}::text"
    )


def _settle() -> str:
    """An attempt's outcome, fenced by its claim, and its run woken, made due or
    ended (``Wake``). Parameters: status, updated at, result, error, available at,
    retries (NULL: kept), step id, attempt, running, claim token; status, finished at, result,
    error, step id, attempt; ending; wake at, wakes added, updated at, touching,
    running; the run-end channel, the work channel, announcing."""
    return (
        f"WITH s AS (UPDATE {STEPS} SET {s('status')} = %s, {s('lease_expires_at')} = NULL, "
        f"{s('updated_at')} = %s, {s('result')} = %s::jsonb, {s('error')} = %s::jsonb, "
        f"{s('available_at')} = %s, {s('retries')} = COALESCE(%s, {s('retries')}) "
        f"WHERE {CLAIM_FENCE} "
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
    )


# -- end of a run --------------------------------------------------------------------


def _finish_run(after_step: bool = False, release: bool = False) -> str:
    """A run's end, and the parallel-group branch steps waiting on it (their attempt,
    their group's count of open branches, and a wake of the parent run once that
    reaches zero or a branch failed). A run a plain child step waits on is left to
    the ORM path: nothing changes, and the parent is reported waiting.

    Parameters: child id, status, output, error, updated at, child id, step status,
    step result, step error, failed, updated at, finished at, updated at, wake at,
    updated at, failed, then (``after_step``) pass wake at, updated at, run id, then
    (``release``) the lease's key, holder and token, then the work channel, the
    run-end channel, whether to announce the end there. Returns (changed, a plain
    parent waits, woken, announced).

    ``after_step`` (``settle_then_finish``): the step success first (the ``done``
    CTEs, their parameters before these), the end only if it was recorded, and where a
    plain parent waits, the run due at the pass wake; it returns the result as stored,
    and the run's status and wakes as well. ``release``: the run's lease released once
    the run ended, and whether it was, last."""
    running, step_running = f"'{RunStatus.RUNNING}'", f"'{StepStatus.RUNNING}'"
    attempt_cols = columns(
        StepAttempt,
        ("step_id", "attempt", "status", "result", "error", "worker", "started_at", "finished_at"),
        q,
    )
    done = _step_done_ctes() + ", " if after_step else ""
    recorded = " AND EXISTS (SELECT 1 FROM done)" if after_step else ""
    return (
        f"WITH {done}p AS (SELECT {s('id')} AS id, {s('group')} AS grp FROM {STEPS} "
        f"WHERE {s('child_run')} = %s AND {s('status')} = {step_running}), "
        f"plain AS (SELECT EXISTS (SELECT 1 FROM p WHERE grp IS NULL) AS waiting), "
        f"r AS (UPDATE {RUNS} SET {r('status')} = %s, {r('output')} = %s::jsonb, "
        f"{r('error')} = %s::jsonb, {r('wake_at')} = NULL, {r('updated_at')} = %s "
        f"WHERE {r('id')} = %s AND {r('status')} = {running} "
        f"AND NOT (SELECT waiting FROM plain){recorded} RETURNING {r('id')}), "
        f"s AS (UPDATE {STEPS} SET {s('status')} = %s, {s('result')} = %s::jsonb, "
        f"{s('error')} = %s::jsonb, {s('attempt')} = GREATEST({s('attempt')}, 1), "
        f"{s('lease_expires_at')} = NULL, "
        f"{s('retries')} = CASE WHEN %s THEN 0 ELSE {s('retries')} END, {s('updated_at')} = %s "
        f"WHERE {s('id')} IN (SELECT id FROM p) AND {s('status')} = {step_running} "
        f"AND EXISTS (SELECT 1 FROM r) "
        f"RETURNING {s('id')} AS id, {s('run_id')} AS run_id, {s('group')} AS grp, "
        f"{s('attempt')} AS attempt, {s('status')} AS status, {s('result')} AS result, "
        f"{s('error')} AS error), "
        f"a AS (INSERT INTO {ATTEMPTS} ({attempt_cols}) "
        f"SELECT id, attempt, status, result, error, '', %s, %s FROM s "
        f"ON CONFLICT ({a('step_id')}, {a('attempt')}) DO UPDATE SET "
        f"{a('status')} = EXCLUDED.{a('status')}, {a('result')} = EXCLUDED.{a('result')}, "
        f"{a('error')} = EXCLUDED.{a('error')}, "
        f"{a('finished_at')} = EXCLUDED.{a('finished_at')}), "
        f"g AS (UPDATE {STEPS} SET {s('open_branches')} = {s('open_branches')} - 1 "
        f"WHERE {s('id')} IN (SELECT grp FROM s) AND {s('status')} = {step_running} "
        f"RETURNING {s('open_branches')} AS open), "
        f"w AS (UPDATE {RUNS} SET {r('wake_at')} = %s, {r('wakes')} = {r('wakes')} + 1, "
        f"{r('updated_at')} = %s WHERE {r('id')} IN (SELECT run_id FROM s) "
        f"AND {r('status')} = {running} "
        f"AND EXISTS (SELECT 1 FROM g WHERE open <= 0 OR %s) RETURNING 1)"
        + (
            f", rp AS (UPDATE {RUNS} SET {r('wake_at')} = %s, {r('updated_at')} = %s "
            f"WHERE {r('id')} = %s AND {r('status')} = {running} "
            f"AND (SELECT waiting FROM plain){recorded}) "
            if after_step
            else " "
        )
        + (
            f", lr AS ({PostgreSQLLeaseSQL.RELEASE} AND EXISTS (SELECT 1 FROM r) RETURNING 1) "
            if release
            else ""
        )
        + f"SELECT EXISTS (SELECT 1 FROM r), (SELECT waiting FROM plain), "
        f"(SELECT count(pg_notify(%s, '')) FROM w), "
        f"(SELECT count(pg_notify(%s, r.{r('id')}::text)) FROM r WHERE %s)"
        + (
            f", done.result, run.{r('status')}, run.{r('wakes')}"
            + (", EXISTS (SELECT 1 FROM lr)" if release else "")
            + f" FROM done JOIN {RUNS} run ON run.{r('id')} = done.run_id"
            if after_step
            else ""
        )
    )


# -- the catalogue -------------------------------------------------------------------

#: Every named statement and how it is built. A statement used in one shape per
#: parameter (the unlimited fresh claim's LIMIT) is built by :func:`claim_fresh`.
BUILDERS: dict[str, Callable[[], str]] = {
    # start
    "runs_with_keys": _runs_with_keys,
    "start_runs": lambda: _start_runs(False, False),
    "start_runs_announced": lambda: _start_runs(False, True),
    "start_runs_with_steps": lambda: _start_runs(True, False),
    "start_runs_with_steps_announced": lambda: _start_runs(True, True),
    "start_run": lambda: _start_run(False, False),
    "start_run_announced": lambda: _start_run(False, True),
    "start_run_with_step": lambda: _start_run(True, False),
    "start_run_with_step_announced": lambda: _start_run(True, True),
    # look (one statement per shape, so that a generic plan fits each)
    "ready_steps_exist": lambda: _ready_exists(False),
    "ready_steps_exist_on": lambda: _ready_exists(True),
    "retries_or_lapsed_exist": lambda: _ready_exists(False, fresh=False),
    "retries_or_lapsed_exist_on": lambda: _ready_exists(True, fresh=False),
    "first_fresh_queue": lambda: _first_fresh_queue(False),
    "first_fresh_queue_on": lambda: _first_fresh_queue(True),
    # claim
    "claim_step": _claim_step,
    "claim_limited_c": lambda: claim_fresh(fresh_on=True, concurrency=True, excluding=False),
    "claim_limited_r": lambda: claim_fresh(fresh_on=True, rated=True, excluding=False),
    "claim_limited_cr": lambda: claim_fresh(
        fresh_on=True, concurrency=True, rated=True, excluding=False
    ),
    "queue_lock": _queue_lock,
    "claim_due_runs": _claim_due_runs,
    "claim_due_runs_leased": lambda: _claim_due_runs(leased=True),
    "claim_due_runs_first": lambda: _claim_due_runs_first(False),
    "claim_due_runs_first_served": lambda: _claim_due_runs_first(True),
    "insert_claimed": _insert_claimed,
    # settle
    "insert_settled": _insert_settled,
    "settle": _settle,
    "settle_then_claim": lambda: _insert_claimed(after_step=True),
    "settle_then_finish": lambda: _finish_run(after_step=True),
    "settle_then_finish_released": lambda: _finish_run(after_step=True, release=True),
    # end of a run
    "finish_run": _finish_run,
    # wake-up
}


@functools.cache
def statement(name: str) -> str:
    """The statement ``name`` (see :data:`BUILDERS`), built on first use."""
    return BUILDERS[name]()


@functools.lru_cache(maxsize=64)
def unlimited_claim(fresh_on: bool, excluding: bool, limit: int) -> str:
    """The claim of fresh steps of the queues without limits, one statement per shape
    and LIMIT (see :func:`claim_fresh`)."""
    return claim_fresh(fresh_on=fresh_on, excluding=excluding, limit=limit)
