"""PostgreSQL's chained writes: a step's success and what the pass after it does (store
the next step claimed, or end the run) in one statement, and the claimed step's insert
that both this and the plain claim are built from."""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.utils import timezone

from pikku_django.dbclock import POSTGRESQL_NOW_MS
from pikku_django.leases.base import Lease
from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.prepared import fetch, fetch_one
from pikku_django.workflows._pauses import paused_look
from pikku_django.workflows._values import (
    Chained,
    DueRun,
    FirstStepClaimed,
    NewStep,
    RunLeaseAsk,
    StepDone,
)
from pikku_django.workflows.store._pg_finish import (
    finish_run_params,
    finish_run_sql,
    step_done_ctes,
)
from pikku_django.workflows.store._pg_first import (
    claim_due_runs_first_params,
    claim_due_runs_first_sql,
)
from pikku_django.workflows.store._pg_sql import (
    ATTEMPTS,
    NEW_STEP_FIELDS,
    RUNS,
    STEP_STATE_FIELDS,
    STEPS,
    _c,
    _from_db,
    _jsonb,
    _loads,
    _q,
    claim_due_runs_sql,
    not_paused,
)
from pikku_django.workflows.store.base import ChainedWrites, columns


def jsonb_form(value: Any) -> Any:
    """``value`` (plain JSON) with each object's keys in the order ``jsonb`` keeps them:
    shorter keys first, then by their UTF-8 bytes (a repeated key cannot occur)."""
    if isinstance(value, dict):
        ordered = sorted(value.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode()))
        return {k: jsonb_form(v) for k, v in ordered}
    if isinstance(value, list):
        return [jsonb_form(v) for v in value]
    return value


def jsonb_text(value: Any) -> str | None:
    """``value`` as ``jsonb::text`` prints it, when :func:`jsonb_form` gave it: the
    statements compare it with what they stored (SQL NULL for None, as stored)."""
    return None if value is None else json.dumps(value, ensure_ascii=False)


@functools.cache
def insert_claimed_sql(after_step: bool = False) -> str:
    """Store a queued step as claimed (its first attempt running under a lease) if its
    run is running and its queue is not paused, and park the run unless it was woken
    since ``park_wakes``.

    Parameters: the step's columns (:data:`NEW_STEP_FIELDS`), running, lease ms,
    created at, updated at, run id, running, the step's queue; attempt status, worker, started at;
    updated at, run id, running, park wakes. Returns the step's id and input as text.

    ``after_step``: the run's step success first (:func:`step_done_ctes`, its
    parameters first), the claim only if that was recorded with its result as
    expected (its text, a parameter after the claim's "running"), and else the run due
    at a time given last (parameters: pass wake at, updated at, run id, running).
    Returns the result as stored, then the step's id and input, then the run's status
    and wakes; no row when the success was not recorded."""

    def s(name: str) -> str:
        return _c(WorkflowStep, name)

    def r(name: str) -> str:
        return _c(WorkflowRun, name)

    new_cols = columns(WorkflowStep, NEW_STEP_FIELDS + STEP_STATE_FIELDS, _q)
    new_vals = "%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s"
    attempt_cols = columns(
        StepAttempt, ("step_id", "attempt", "status", "worker", "started_at"), _q
    )
    guard = (
        " AND EXISTS (SELECT 1 FROM done WHERE done.result IS NOT DISTINCT FROM %s)"
        if after_step
        else ""
    )
    sql = (
        f"WITH {step_done_ctes() + ', ' if after_step else ''}"
        f"s AS (INSERT INTO {STEPS} ({new_cols}) "
        f"SELECT {new_vals}, %s, NULL, NULL, 1, NULL, {POSTGRESQL_NOW_MS} + %s, %s, %s "
        f"WHERE EXISTS (SELECT 1 FROM {RUNS} WHERE {r('id')} = %s AND {r('status')} = %s) "
        f"AND {not_paused('%s')}{guard} ON CONFLICT ({s('run_id')}, {s('name')}) DO NOTHING "
        f"RETURNING {s('id')} AS id, {s('input')} AS input), "
        f"a AS (INSERT INTO {ATTEMPTS} ({attempt_cols}) SELECT id, 1, %s, %s, %s FROM s), "
        f"r AS (UPDATE {RUNS} SET {r('wake_at')} = NULL, {r('updated_at')} = %s "
        f"WHERE {r('id')} = %s AND {r('status')} = %s AND {r('wakes')} = %s "
        f"AND {r('wake_at')} IS NOT NULL AND EXISTS (SELECT 1 FROM s))"
    )
    if not after_step:
        return sql + " SELECT id, input::text FROM s"
    return sql + (
        f", rp AS (UPDATE {RUNS} SET {r('wake_at')} = %s, {r('updated_at')} = %s "
        f"WHERE {r('id')} = %s AND {r('status')} = %s AND NOT EXISTS (SELECT 1 FROM s) "
        f"AND EXISTS (SELECT 1 FROM done)) "
        f"SELECT done.result, s.id, s.input::text, run.{r('status')}, run.{r('wakes')} "
        f"FROM done LEFT JOIN s ON true JOIN {RUNS} run ON run.{r('id')} = done.run_id"
    )


def step_done_params(done: StepDone, now: datetime) -> list[Any]:
    """The parameters of :func:`step_done_ctes` for ``done``."""
    result = _jsonb(done.result)
    succeeded, running = StepStatus.SUCCEEDED, StepStatus.RUNNING
    step, attempt, ended = done.step_id, done.attempt, done.finished_at or now
    return [succeeded, now, result, step, attempt, running, succeeded, ended, result, step, attempt]


def claimed_params(
    step: NewStep,
    lease_ms: int,
    worker: str,
    park_wakes: int,
    now: datetime,
    *,
    guard: Sequence[Any] = (),
) -> list[Any]:
    """The parameters of :func:`insert_claimed_sql` after the success's: ``guard`` is
    the expected result's text in the chained form."""
    values = step.columns()
    values["input"] = _jsonb(step.input)
    running = StepStatus.RUNNING
    return [
        *(values[name] for name in NEW_STEP_FIELDS),
        running,
        int(lease_ms),
        now,
        now,
        step.run_id,
        RunStatus.RUNNING,
        values["queue"],
        *guard,
        running,
        worker[:255],
        now,
        now,
        step.run_id,
        RunStatus.RUNNING,
        park_wakes,
    ]


class PostgresChainedWrites(ChainedWrites):
    """:class:`~pikku_django.workflows.store.base.ChainedWrites` as single statements."""

    using: str
    chains_in_one_statement = True
    takes_run_leases = True

    def _announcing(self) -> bool:
        """Whether run ends are announced (the store's ``notifying``)."""
        return bool(getattr(self, "notifying", False))

    def json_as_stored(self, value: Any) -> Any:
        return jsonb_form(value)

    def settle_then_claim(
        self,
        done: StepDone,
        step: NewStep,
        *,
        lease_ms: int,
        worker: str,
        park_wakes: int,
        pass_wake_at: datetime,
    ) -> Chained | None:
        now = timezone.now()
        params = [
            *step_done_params(done, now),
            *claimed_params(
                step, lease_ms, worker, park_wakes, now, guard=[jsonb_text(done.result)]
            ),
            pass_wake_at,
            now,
            step.run_id,
            RunStatus.RUNNING,
        ]
        row = fetch_one(self.using, insert_claimed_sql(after_step=True), params)
        if row is None:
            return None
        result_text, step_id, input_text, run_status, run_wakes = row
        same = result_text == jsonb_text(done.result)
        claimed = None if step_id is None else (step_id, _loads(input_text))
        if claimed is None:
            paused_look.forget(self.using)  # the queue may have been paused
        return Chained(_loads(result_text), run_status, run_wakes, same, claimed)

    def settle_then_finish(
        self,
        done: StepDone,
        run_id: uuid.UUID,
        status: str,
        output: Any,
        error: Any,
        *,
        wake_at: datetime,
        pass_wake_at: datetime,
        release: Lease | None = None,
    ) -> Chained | None:
        now = timezone.now()
        params = step_done_params(done, now) + finish_run_params(
            run_id,
            status,
            output,
            error,
            now=now,
            wake_at=wake_at,
            notifying=self._announcing(),
            pass_wake_at=pass_wake_at,
            release=release,
        )
        sql = finish_run_sql(after_step=True, release=release is not None)
        row = fetch_one(self.using, sql, params)
        if row is None:
            return None
        changed, waiting, _woken, _announced, result_text, run_status, run_wakes = row[:7]
        finished = None if waiting else bool(changed)
        released = bool(row[7]) if release is not None and changed else None
        return Chained(
            _loads(result_text), run_status, run_wakes, finished=finished, released=released
        )

    def claim_due_runs_leased(
        self, now: datetime, until: datetime, limit: int, ask: RunLeaseAsk
    ) -> list[DueRun]:
        asked_at = time.monotonic()
        first = ask.first
        if first is not None:
            sql = claim_due_runs_first_sql(served=bool(first.queues))
            params = claim_due_runs_first_params(now, until, limit, ask, first, timezone.now())
        else:
            sql = claim_due_runs_sql(leased=True)
            params = [until, now, limit, ask.prefix, ask.holder, ask.ttl_ms, ask.ttl_ms]
            params += [ask.ttl_ms, ask.prefix]
        claimed = []
        for row in fetch(self.using, sql, params):
            end = len(row) - (6 if first is not None else 3)
            run = _from_db(self.using, WorkflowRun, row[:end])
            stepless, token, expires_at = row[end : end + 3]
            lease = None
            if token is not None:
                lease = Lease(f"{ask.prefix}{run.id}", ask.holder, int(token), int(expires_at))
            stored = None
            if first is not None and row[-3] is not None:
                stored = FirstStepClaimed(int(row[-3]), _loads(row[-2]), int(row[-1]))
            due = DueRun(run, stepless, lease, asked_at, lease is None, stored)
            claimed.append(due)
        return claimed
