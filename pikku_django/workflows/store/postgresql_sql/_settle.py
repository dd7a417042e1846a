"""The PostgreSQL store's statements that settle attempts and end runs."""

from __future__ import annotations

from pikku_django.leases.sql import PostgreSQLLeaseSQL
from pikku_django.models import RunStatus, StepAttempt, StepStatus
from pikku_django.workflows.store.base import columns
from pikku_django.workflows.store.postgresql_sql._names import (
    _NEW_STEP_COLS,
    _NEW_STEP_VALS,
    _ON_STEP_CONFLICT,
    _RUN_IN_STATUS,
    ATTEMPTS,
    CLAIM_FENCE,
    RUNS,
    STEPS,
    _step_done_ctes,
    a,
    q,
    r,
    s,
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
