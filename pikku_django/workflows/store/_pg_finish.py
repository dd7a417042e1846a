"""PostgreSQL's end of a run in one statement: the run, and the parallel-group branch
steps waiting on it (their attempt, their group's count of open branches, and a
wake of the parent run once that count reaches zero or a branch failed).

A run that a plain child step (``ctx.do``) waits on is left to the ORM path: the
statement then changes nothing and reports the parent waiting.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime
from typing import Any

from pikku_django.leases.base import Lease
from pikku_django.leases.sql import PostgreSQLLeaseSQL
from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.wakeups import RUN_DONE_CHANNEL, WORK_CHANNEL
from pikku_django.workflows._child_outcome import child_step_outcome
from pikku_django.workflows.store._pg_sql import _jsonb
from pikku_django.workflows.store.base import columns


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@functools.cache
def finish_run_sql(after_step: bool = False, release: bool = False) -> str:
    """Parameters: child id, status, output, error, updated at, child id, step status,
    step result, step error, failed, updated at, finished at, updated at, wake at,
    updated at, failed, channel, the run-end channel, whether to announce the end there.
    Returns (changed, a plain parent waits, ...): the end is announced with the change.

    ``after_step``: the run's step success first (:func:`step_done_ctes`, its
    parameters before these), the end only if it was recorded, and where a plain
    parent waits, the run due at a time given after "wake at" and its updated at
    (parameters: pass wake at, updated at, run id); it returns the result as stored,
    and the run's status and wakes as well. ``release`` (with ``after_step``): the
    run's lease released once the run ended (parameters after those: the lease's key,
    holder and token), and whether it was, last."""
    runs, steps, atts = (_q(m._meta.db_table) for m in (WorkflowRun, WorkflowStep, StepAttempt))

    def r(name: str) -> str:
        return columns(WorkflowRun, (name,), _q)

    def s(name: str) -> str:
        return columns(WorkflowStep, (name,), _q)

    def a(name: str) -> str:
        return columns(StepAttempt, (name,), _q)

    running = f"'{RunStatus.RUNNING}'"
    step_running = f"'{StepStatus.RUNNING}'"
    attempt_cols = columns(
        StepAttempt,
        ("step_id", "attempt", "status", "result", "error", "worker", "started_at", "finished_at"),
        _q,
    )
    done = step_done_ctes() + ", " if after_step else ""
    recorded = " AND EXISTS (SELECT 1 FROM done)" if after_step else ""
    return (
        f"WITH {done}p AS (SELECT {s('id')} AS id, {s('group')} AS grp FROM {steps} "
        f"WHERE {s('child_run')} = %s AND {s('status')} = {step_running}), "
        f"plain AS (SELECT EXISTS (SELECT 1 FROM p WHERE grp IS NULL) AS waiting), "
        f"r AS (UPDATE {runs} SET {r('status')} = %s, {r('output')} = %s::jsonb, "
        f"{r('error')} = %s::jsonb, {r('wake_at')} = NULL, {r('updated_at')} = %s "
        f"WHERE {r('id')} = %s AND {r('status')} = {running} "
        f"AND NOT (SELECT waiting FROM plain){recorded} RETURNING {r('id')}), "
        f"s AS (UPDATE {steps} SET {s('status')} = %s, {s('result')} = %s::jsonb, "
        f"{s('error')} = %s::jsonb, {s('attempt')} = GREATEST({s('attempt')}, 1), "
        f"{s('lease_expires_at')} = NULL, "
        f"{s('retries')} = CASE WHEN %s THEN 0 ELSE {s('retries')} END, {s('updated_at')} = %s "
        f"WHERE {s('id')} IN (SELECT id FROM p) AND {s('status')} = {step_running} "
        f"AND EXISTS (SELECT 1 FROM r) "
        f"RETURNING {s('id')} AS id, {s('run_id')} AS run_id, {s('group')} AS grp, "
        f"{s('attempt')} AS attempt, {s('status')} AS status, {s('result')} AS result, "
        f"{s('error')} AS error), "
        f"a AS (INSERT INTO {atts} ({attempt_cols}) "
        f"SELECT id, attempt, status, result, error, '', %s, %s FROM s "
        f"ON CONFLICT ({a('step_id')}, {a('attempt')}) DO UPDATE SET "
        f"{a('status')} = EXCLUDED.{a('status')}, {a('result')} = EXCLUDED.{a('result')}, "
        f"{a('error')} = EXCLUDED.{a('error')}, "
        f"{a('finished_at')} = EXCLUDED.{a('finished_at')}), "
        f"g AS (UPDATE {steps} SET {s('open_branches')} = {s('open_branches')} - 1 "
        f"WHERE {s('id')} IN (SELECT grp FROM s) AND {s('status')} = {step_running} "
        f"RETURNING {s('open_branches')} AS open), "
        f"w AS (UPDATE {runs} SET {r('wake_at')} = %s, {r('wakes')} = {r('wakes')} + 1, "
        f"{r('updated_at')} = %s WHERE {r('id')} IN (SELECT run_id FROM s) "
        f"AND {r('status')} = {running} "
        f"AND EXISTS (SELECT 1 FROM g WHERE open <= 0 OR %s) RETURNING 1)"
        + (
            f", rp AS (UPDATE {runs} SET {r('wake_at')} = %s, {r('updated_at')} = %s "
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
            + f" FROM done JOIN {runs} run ON run.{r('id')} = done.run_id"
            if after_step
            else ""
        )
    )


@functools.cache
def step_done_ctes() -> str:
    """``done`` and ``done_a``: a step attempt's success (``done`` returns the step's
    run and its result as text). Parameters: succeeded, updated at, result, step id,
    attempt, running; succeeded, finished at, result, step id, attempt."""
    steps, atts = (_q(m._meta.db_table) for m in (WorkflowStep, StepAttempt))

    def s(name: str) -> str:
        return columns(WorkflowStep, (name,), _q)

    def a(name: str) -> str:
        return columns(StepAttempt, (name,), _q)

    return (
        f"done AS (UPDATE {steps} SET {s('status')} = %s, {s('lease_expires_at')} = NULL, "
        f"{s('updated_at')} = %s, {s('result')} = %s::jsonb, {s('error')} = NULL, "
        f"{s('available_at')} = NULL "
        f"WHERE {s('id')} = %s AND {s('attempt')} = %s AND {s('status')} = %s "
        f"RETURNING {s('run_id')} AS run_id, {s('result')}::text AS result), "
        f"done_a AS (UPDATE {atts} SET {a('status')} = %s, {a('finished_at')} = %s, "
        f"{a('result')} = %s::jsonb, {a('error')} = NULL "
        f"WHERE {a('step_id')} = %s AND {a('attempt')} = %s AND EXISTS (SELECT 1 FROM done))"
    )


def finish_run_params(
    run_id: uuid.UUID,
    status: str,
    output: Any,
    error: Any,
    *,
    now: datetime,
    wake_at: datetime,
    notifying: bool,
    pass_wake_at: datetime | None = None,
    release: Lease | None = None,
) -> list[Any]:
    """The parameters of :func:`finish_run_sql` (``after_step`` with ``pass_wake_at``,
    ``release`` with ``release``), after the step success's where it has one."""
    step_status, result, step_error = child_step_outcome(run_id, status, output, error)
    failed = step_status == StepStatus.FAILED
    params = [
        run_id,
        status,
        _jsonb(output),
        _jsonb(error),
        now,
        run_id,
        step_status,
        _jsonb(result),
        _jsonb(step_error),
        failed,
        now,
        now,
        now,
        wake_at,
        now,
        failed,
    ]
    if pass_wake_at is not None:
        params += [pass_wake_at, now, run_id]
    if release is not None:
        params += [release.key, release.holder, release.token]
    return [*params, WORK_CHANNEL, RUN_DONE_CHANNEL, notifying]
