"""Storing an accepted webhook event: its receipt and its workflow run, both or neither.

On PostgreSQL this is one statement: the receipt, the run only when the receipt was
new, and the workers' wake-up, so outside a transaction it needs no BEGIN or COMMIT
of its own. Every other database gets two INSERTs in one transaction, the run first
(MariaDB and MySQL check foreign keys at once), where the receipt's unique
constraint refuses a redelivery and takes the run back with it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Model
from django.utils import timezone

from pikku_django.models import RunStatus, WebhookReceipt, WorkflowRun
from pikku_django.prepared import fetch
from pikku_django.workflows.sql import CHANNEL, notify_work

logger = logging.getLogger(__name__)

RUN_FIELDS = (
    "id",
    "workflow",
    "status",
    "input",
    "output",
    "error",
    "suspend_reason",
    "inline",
    "idempotency_key",
    "wake_at",
    "wakes",
    "created_at",
    "updated_at",
)
RECEIPT_FIELDS = ("source", "event", "provider_id", "data", "run_id", "received_at")
RECEIPT_KEY = ("source", "event", "provider_id")


@dataclass(frozen=True)
class NewEvent:
    """An accepted event: its receipt, and the run of ``workflow`` it starts.

    The run's input is ``{"source", "event", "id", "data"}``, or
    ``{"handler": handler, "event": {...}}`` when ``handler`` (a step name) is set.
    ``data_json`` is the event's data as JSON text, None for no data (SQL NULL).
    """

    source: str
    event: str
    provider_id: str
    data_json: str | None
    workflow: str
    idempotency_key: str
    handler: str | None = None

    def input_json(self) -> str:
        """The run's input as JSON text, the same as ``json.dumps`` of it."""
        event = (
            f'{{"source": {json.dumps(self.source)}, "event": {json.dumps(self.event)}, '
            f'"id": {json.dumps(self.provider_id)}, '
            f'"data": {"null" if self.data_json is None else self.data_json}}}'
        )
        if self.handler is None:
            return event
        return f'{{"handler": {json.dumps(self.handler)}, "event": {event}}}'


@dataclass(frozen=True)
class _Statements:
    """One vendor's SQL: ``single`` (PostgreSQL), or ``run`` then ``receipt``."""

    single: str = ""
    run: str = ""
    receipt: str = ""


#: Built statements by (vendor, notify, handler): a handful, made on first use.
_built: dict[tuple[str, bool, bool], _Statements] = {}


def _columns(model: type[Model], names: tuple[str, ...], quote: Callable[[str], str]) -> str:
    fields = {f.attname: f for f in model._meta.concrete_fields}
    return ", ".join(quote(fields[name].column) for name in names)


def _postgresql(quote: Callable[[str], str], notify: bool, handler: bool) -> _Statements:
    run_id = quote(WebhookReceipt._meta.get_field("run").column)
    data = quote(WebhookReceipt._meta.get_field("data").column)
    event = "jsonb_build_object('source', %s::text, 'event', %s::text, 'id', %s::text, "
    event += f"'data', {data})"
    run_input = f"jsonb_build_object('handler', %s::text, 'event', {event})" if handler else event
    last = f"SELECT pg_notify('{CHANNEL}', '') FROM run" if notify else "SELECT 1 FROM run"
    return _Statements(
        single=(
            f"WITH receipt AS ("
            f"INSERT INTO {quote(WebhookReceipt._meta.db_table)} "
            f"({_columns(WebhookReceipt, RECEIPT_FIELDS, quote)}) "
            f"VALUES (%s, %s, %s, %s::jsonb, %s, %s) "
            f"ON CONFLICT ({_columns(WebhookReceipt, RECEIPT_KEY, quote)}) DO NOTHING "
            f"RETURNING {run_id}, {data}), "
            f"run AS ("
            f"INSERT INTO {quote(WorkflowRun._meta.db_table)} "
            f"({_columns(WorkflowRun, RUN_FIELDS, quote)}) "
            f"SELECT {run_id}, %s, %s, {run_input}, NULL, NULL, '', false, %s, %s, 0, %s, %s "
            f"FROM receipt RETURNING {quote(WorkflowRun._meta.pk.column)}) "
            f"{last}"
        )
    )


def _portable(quote: Callable[[str], str]) -> _Statements:
    def insert(model: type[Model], names: tuple[str, ...]) -> str:
        values = ", ".join(["%s"] * len(names))
        return (
            f"INSERT INTO {quote(model._meta.db_table)} "
            f"({_columns(model, names, quote)}) VALUES ({values})"
        )

    return _Statements(
        run=insert(WorkflowRun, RUN_FIELDS), receipt=insert(WebhookReceipt, RECEIPT_FIELDS)
    )


def statements_for(using: str, *, notify: bool, handler: bool) -> _Statements:
    """The statements for ``using``'s vendor, built once per vendor and shape."""
    connection = connections[using]
    key = (connection.vendor, notify, handler)
    found = _built.get(key)
    if found is None:
        quote = connection.ops.quote_name
        found = _built[key] = (
            _postgresql(quote, notify, handler)
            if connection.vendor == "postgresql"
            else _portable(quote)
        )
    return found


def store_event(using: str, new: NewEvent, *, wake_at: datetime, notify: bool) -> bool:
    """Store ``new``'s receipt and start its run, due at ``wake_at``: both or neither.

    False, with nothing stored, when the receipt (or the run's idempotency key)
    already exists. ``notify`` wakes idle workers when the run is committed.
    """
    connection = connections[using]
    statements = statements_for(using, notify=notify, handler=new.handler is not None)
    adapt = connection.ops.adapt_datetimefield_value
    now = adapt(timezone.now())
    due = adapt(wake_at)
    run_id = WorkflowRun._meta.pk.get_db_prep_value(uuid.uuid4(), connection)
    status = RunStatus.RUNNING.value
    try:
        if statements.single:
            params: list[Any] = [new.source, new.event, new.provider_id, new.data_json]
            params += [run_id, now, new.workflow, status]
            if new.handler is not None:
                params.append(new.handler)
            params += [new.source, new.event, new.provider_id, new.idempotency_key, due, now, now]
            return _run_single(using, statements.single, params)
        with transaction.atomic(using=using), connection.cursor() as cursor:
            run = [run_id, new.workflow, status, new.input_json(), None, None, "", False]
            run += [new.idempotency_key, due, 0, now, now]
            cursor.execute(statements.run, run)
            cursor.execute(
                statements.receipt,
                [new.source, new.event, new.provider_id, new.data_json, run_id, now],
            )
            if notify:
                notify_work(using)
    except IntegrityError as exc:
        logger.debug("Webhook %s:%s %s not stored: %s", new.source, new.event, new.provider_id, exc)
        return False
    return True


def _run_single(using: str, sql: str, params: list[Any]) -> bool:
    """Run the one statement; True when it started a run."""
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        # Inside the caller's transaction: a savepoint, so a refused run leaves it usable.
        with transaction.atomic(using=using):
            return bool(fetch(using, sql, params))
    return bool(fetch(using, sql, params))
