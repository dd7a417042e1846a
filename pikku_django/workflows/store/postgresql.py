"""The workflow store on PostgreSQL: each hot operation as one prepared statement
(data-modifying CTEs), which needs no BEGIN or COMMIT of its own. The statements are
all in ``postgresql_sql``, named; the claims in ``postgresql_claims``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections
from django.utils import timezone

from pikku_django.leases.base import Lease
from pikku_django.models import RunStatus, StepStatus, WorkflowRun
from pikku_django.prepared import fetch, fetch_one
from pikku_django.wakeups import RUN_DONE_CHANNEL, WORK_CHANNEL, announce, announcer
from pikku_django.workflows._values import Chained, NewStep, Settled, StepDone, Wake
from pikku_django.workflows.control._pause_conditions import paused_look
from pikku_django.workflows.store.base import NewRun
from pikku_django.workflows.store.bulk_starts import saved, scheduled_steps
from pikku_django.workflows.store.postgresql_claims import PostgresClaims
from pikku_django.workflows.store.postgresql_rows import (
    claimed_params,
    finish_run_params,
    insert_values,
    jsonb,
    jsonb_form,
    jsonb_text,
    loads,
    start_runs_params,
    step_done_params,
    step_params,
)
from pikku_django.workflows.store.postgresql_sql import statement


class PostgresStore(PostgresClaims):
    """PostgreSQL: the hot path as single statements, and LISTEN/NOTIFY."""

    vendor = "postgresql"
    exact_ready_look = True
    searches_input_text = True
    chains_in_one_statement = True

    # -- wake-up ---------------------------------------------------------------------

    def notify(self) -> None:
        announce(self.using, notifying=self.notifying)

    # -- look ------------------------------------------------------------------------

    def ready_steps_exist(self, now: datetime, queues: Sequence[str]) -> bool:
        if queues:
            served = list(queues)
            sql, params = statement("ready_steps_exist_on"), [now, served, now, served, served]
        else:
            sql, params = statement("ready_steps_exist"), [now, now]
        return bool(fetch_one(self.using, sql, params)[0])

    def retries_or_lapsed_exist(self, now: datetime, queues: Sequence[str]) -> bool:
        if queues:
            served = list(queues)
            sql, params = statement("retries_or_lapsed_exist_on"), [now, served, served]
        else:
            sql, params = statement("retries_or_lapsed_exist"), [now]
        return bool(fetch_one(self.using, sql, params)[0])

    # -- settle and end -----------------------------------------------------------------

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
        row = fetch_one(self.using, statement("finish_run"), params)
        changed, waiting, _woken, _announced = row
        return None if waiting else bool(changed)

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
        res, err = jsonb(result), jsonb(error)
        params = [
            *step_params(step),
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
        row = fetch_one(self.using, statement("insert_settled"), params)
        return None if row is None else (row[0], loads(row[1]))

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
        token: int | None = None,
    ) -> Settled | None:
        now = timezone.now()
        ending = wake is Wake.END
        waking = wake is Wake.NOW or ending  # END falls back to a wake
        touching = wake is not Wake.NONE
        res, err = jsonb(result), jsonb(error)
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
            token,
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
        row = fetch_one(self.using, statement("settle"), params)
        if row is None:
            return None
        # The run as this statement's snapshot saw it (before any wake it made).
        return Settled(row[0], row[2], row[3], loads(row[1]), bool(row[5]), row[6], row[7])

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
        row = fetch_one(self.using, statement("settle_then_claim"), params)
        if row is None:
            return None
        result_text, step_id, input_text, run_status, run_wakes, token = row
        same = result_text == jsonb_text(done.result)
        claimed = None if step_id is None else (step_id, loads(input_text), int(token))
        if claimed is None:
            paused_look.forget(self.using)  # the queue may have been paused
        return Chained(loads(result_text), run_status, run_wakes, same, claimed)

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
            notifying=self.notifying,
            pass_wake_at=pass_wake_at,
            release=release,
        )
        name = "settle_then_finish" + ("_released" if release is not None else "")
        row = fetch_one(self.using, statement(name), params)
        if row is None:
            return None
        changed, waiting, _woken, _announced, result_text, run_status, run_wakes = row[:7]
        finished = None if waiting else bool(changed)
        released = bool(row[7]) if release is not None and changed else None
        return Chained(
            loads(result_text), run_status, run_wakes, finished=finished, released=released
        )

    # -- start -----------------------------------------------------------------------

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
        params = insert_values(run)
        if opening is not None:
            (step,) = scheduled_steps([(opening, due_at)])
            params.extend(insert_values(step))
        announcing = self.notifying and not run.inline
        # A busy process announces one start in a window, and the rest after it.
        announce = announcing and announcer.inline(self.using)
        name = "start_run" + ("_with_step" if opening is not None else "")
        name += "_announced" if announce else ""
        fetch(self.using, statement(name), [*params, WORK_CHANNEL] if announce else params)
        if announcing and not announce:
            announcer.after_commit(self.using)
        saved([run], {run.id}, self.using)

    def insert_runs(
        self, runs: Sequence[WorkflowRun], openings: Sequence[tuple[NewStep, datetime]]
    ) -> set[uuid.UUID]:
        if not runs:
            return set()
        steps = scheduled_steps(openings)
        name = "start_runs" + ("_with_steps" if steps else "")
        params = start_runs_params(runs, steps)
        if self.notifying:  # one announcement for the batch, sent as it commits
            name, params = name + "_announced", [*params, WORK_CHANNEL]
        made = {row[0] for row in fetch(self.using, statement(name), params)}
        saved(runs, made, self.using)
        return made

    def create_runs(self, runs: Sequence[NewRun], wake_at: datetime) -> list[uuid.UUID]:
        rows = [new.row(wake_at) for new in runs]
        made = self.insert_runs(rows, [])
        ids = [row.id for row in rows]
        if len(made) < len(rows):  # some keys were taken (or repeated): those runs exist
            taken = [new for i, new in zip(ids, runs, strict=True) if i not in made]
            found = fetch(
                self.using,
                statement("runs_with_keys"),
                [[new.workflow for new in taken], [new.idempotency_key for new in taken]],
            )
            existing = {(w, k): i for i, w, k in found}
            ids = [
                i if i in made else existing[(new.workflow, new.idempotency_key)]
                for i, new in zip(ids, runs, strict=True)
            ]
        return ids
