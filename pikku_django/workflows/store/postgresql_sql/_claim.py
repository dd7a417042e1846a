"""The PostgreSQL store's statements that look for ready work and claim it."""

from __future__ import annotations

from pikku_django.dbclock import POSTGRESQL_NOW_MS
from pikku_django.models import (
    AttemptStatus,
    QueueClaim,
    RunStatus,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows.store.postgresql_sql._names import (
    _DUE_RUNS,
    _NEW_STEP_COLS,
    _NEW_STEP_VALS,
    _ON_STEP_CONFLICT,
    _RUN_IN_STATUS,
    _RUN_LEASE_KEY,
    _START_ATTEMPTS,
    _STEPLESS,
    _TAKE_RUN_LEASES,
    ATTEMPTS,
    FIRST_CLAIM_TOKEN,
    NEW_STEP_FIELDS,
    NO_CAP,
    RUNS,
    STEPS,
    _fresh_from,
    _ready_branches,
    _step_done_ctes,
    _t,
    a,
    all_columns,
    claimed,
    k,
    not_paused,
    q,
    r,
    s,
    step_lease,
)

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
