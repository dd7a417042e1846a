"""Values in and out of the PostgreSQL store's statements: JSON as text, rows read
back as model instances, and each statement's parameters in its order (see
``postgresql_sql``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import JSONField

from pikku_django.leases.base import Lease
from pikku_django.models import RunStatus, StepStatus
from pikku_django.models.fields import decode_stored_json
from pikku_django.wakeups import RUN_DONE_CHANNEL, WORK_CHANNEL
from pikku_django.workflows._values import FirstStepAsk, NewStep, RunLeaseAsk, StepDone
from pikku_django.workflows.compose._child_outcome import child_step_outcome
from pikku_django.workflows.store.postgresql_sql import NEW_STEP_FIELDS, insert_fields


def loads(text: str | None) -> Any:
    """A JSON column read back as text, decoded as the ORM decodes it (an
    :class:`~pikku_django.models.fields.UnreadableJSON` when Python cannot read it)."""
    return None if text is None else decode_stored_json(text)


def jsonb(value: Any) -> str | None:
    """A JSON value as text for a ``::jsonb`` parameter (SQL NULL for None, as the ORM)."""
    return None if value is None else json.dumps(value)


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


def from_db(using: str, model: type[Any], row: Sequence[Any]) -> Any:
    """A model instance from a row of ``all_columns``, its values converted as the ORM
    converts them (JSON columns arrive as text)."""
    connection = connections[using]
    fields = model._meta.concrete_fields
    values = [
        f.from_db_value(v, None, connection) if hasattr(f, "from_db_value") else v
        for f, v in zip(fields, row, strict=True)
    ]
    return model.from_db(using, [f.attname for f in fields], values)


def insert_values(obj: Any) -> list[Any]:
    """The values of the INSERT of the new model instance ``obj`` (its ``auto_now``
    fields filled in on ``obj`` as ``save()`` fills them)."""
    values = []
    for f in insert_fields(type(obj), obj.pk is None):
        value = f.pre_save(obj, add=True)
        values.append(jsonb(value) if isinstance(f, JSONField) else value)
    return values


def start_runs_params(runs: Sequence[Any], steps: Sequence[Any]) -> list[Any]:
    """The parameters of ``start_runs`` (and its forms with steps): an array per
    inserted column of the new ``runs``, then of their opening ``steps``."""
    return [
        list(column)
        for objs in (runs, steps)
        for column in zip(*(insert_values(obj) for obj in objs), strict=True)
    ]


def step_params(step: NewStep) -> list[Any]:
    """A new step's columns (:data:`NEW_STEP_FIELDS`)."""
    values = step.columns()
    values["input"] = jsonb(step.input)
    return [values[name] for name in NEW_STEP_FIELDS]


def step_done_params(done: StepDone, now: datetime) -> list[Any]:
    """The parameters of the ``done`` CTEs for ``done``."""
    result = jsonb(done.result)
    succeeded, running = StepStatus.SUCCEEDED, StepStatus.RUNNING
    step, attempt, ended = done.step_id, done.attempt, done.finished_at or now
    fence = [step, attempt, running, done.claim_token]
    return [succeeded, now, result, *fence, succeeded, ended, result, step, attempt]


def claimed_params(
    step: NewStep,
    lease_ms: int,
    worker: str,
    park_wakes: int,
    now: datetime,
    *,
    guard: Sequence[Any] = (),
) -> list[Any]:
    """The parameters of ``insert_claimed`` (after the success's in
    ``settle_then_claim``, whose expected result's text is ``guard``)."""
    running = StepStatus.RUNNING
    columns = step_params(step)
    return [
        *columns,
        running,
        int(lease_ms),
        now,
        now,
        step.run_id,
        RunStatus.RUNNING,
        columns[NEW_STEP_FIELDS.index("queue")],
        *guard,
        running,
        worker[:255],
        now,
        now,
        step.run_id,
        RunStatus.RUNNING,
        park_wakes,
    ]


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
    """The parameters of ``finish_run`` (``settle_then_finish`` with ``pass_wake_at``,
    its released form with ``release``), after the step success's where it has one."""
    step_status, result, step_error = child_step_outcome(run_id, status, output, error)
    failed = step_status == StepStatus.FAILED
    params = [
        run_id,
        status,
        jsonb(output),
        jsonb(error),
        now,
        run_id,
        step_status,
        jsonb(result),
        jsonb(step_error),
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


def claim_due_runs_first_params(
    now: datetime, until: datetime, limit: int, ask: RunLeaseAsk, first: FirstStepAsk, stamp: Any
) -> list[Any]:
    """The parameters of ``claim_due_runs_first`` (``stamp``: the rows' times)."""
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
