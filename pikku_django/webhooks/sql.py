"""Webhook SQL: reading a source's switch and secrets, and storing an accepted event
(its receipt and its workflow run, both or neither).

On PostgreSQL an event is one statement: the receipt, the run only when the receipt
was new, and the workers' wake-up, so outside a transaction it needs no BEGIN or
COMMIT of its own. With a :class:`Gate` the same statement first checks that the
source is still enabled with the credential values the request was verified
against, and stores nothing otherwise. Every other database gets two INSERTs in one
transaction, the run first (MariaDB and MySQL check foreign keys at once), where the
receipt's unique constraint refuses a redelivery and takes the run back with it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import DataError, IntegrityError, connections, transaction
from django.db.models import Model
from django.utils import timezone

from pikku_django.models import (
    CredentialValue,
    RunStatus,
    TriggerSource,
    WebhookReceipt,
    WorkflowRun,
)
from pikku_django.prepared import fetch, fetch_on, write_together
from pikku_django.workflows.sql import CHANNEL

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
RECEIPT_FIELDS = ("source", "event", "provider_id", "run_id", "received_at")
RECEIPT_KEY = ("source", "event", "provider_id")


#: The channel PostgreSQL notifies when a source's row or a credential value changes
#: (a trigger, migration 0005), so web processes drop the switches and secrets they keep.
SOURCES_CHANNEL = "pikku_sources"


class SourceChanged(Exception):
    """A gated store found the source disabled, or its credential values changed."""


@dataclass(frozen=True)
class Gate:
    """What a request was answered against: the stored event is written only if the
    source ``source`` is still enabled and ``credential``'s active values still join
    (oldest first, comma-separated ciphertexts) to ``fingerprint``."""

    source: str
    credential: str
    fingerprint: str


def _state_sql(quote: Callable[[str], str]) -> str:
    source = TriggerSource._meta
    value = CredentialValue._meta

    def col(meta: Any, name: str) -> str:
        return quote(meta.get_field(name).column)

    return (
        f"SELECT s.{col(source, 'enabled')}, c.{col(value, 'ciphertext')} "
        f"FROM {quote(source.db_table)} s LEFT JOIN {quote(value.db_table)} c "
        f"ON c.{col(value, 'credential')} = %s AND c.{col(value, 'active')} = %s "
        f"WHERE s.{col(source, 'name')} = %s ORDER BY c.{quote(value.pk.column)}"
    )


_state_sql_by_vendor: dict[str, str] = {}


def read_source_state(using: str, source: str, credential: str) -> tuple[bool | None, list[str]]:
    """``source``'s switch (None when it has no row) and ``credential``'s active
    ciphertexts, oldest first, in one query."""
    return read_state(connections[using], source, credential)


def read_state(connection: Any, source: str, credential: str) -> tuple[bool | None, list[str]]:
    """:func:`read_source_state` on a connection object."""
    sql = _state_sql_by_vendor.get(connection.vendor)
    if sql is None:
        sql = _state_sql_by_vendor[connection.vendor] = _state_sql(connection.ops.quote_name)
    rows = fetch_on(connection, sql, [credential, True, source])
    if not rows:
        return None, []
    return bool(rows[0][0]), [token for _, token in rows if token]


def fingerprint_of(ciphertexts: list[str]) -> str:
    """The gate's fingerprint of a credential's active ciphertexts (oldest first)."""
    return ",".join(ciphertexts)


@dataclass(frozen=True)
class NewEvent:
    """An accepted event: its receipt, and the run of ``workflow`` it starts.

    The run's input is ``{"source", "event", "id", "data"}``, or
    ``{"handler": handler, "event": {...}}`` when ``handler`` (a step name) is set.
    ``data_json`` is the event's data as JSON text, None for no data (JSON null);
    ``data_checked`` False says it is the request's text, which the database checks
    is one JSON value before storing anything.
    """

    source: str
    event: str
    provider_id: str
    data_json: str | None
    workflow: str
    idempotency_key: str
    handler: str | None = None
    data_checked: bool = True

    def input_json(self, *, data: bool = True) -> str:
        """The run's input as JSON text, the same as ``json.dumps`` of it (with
        ``data`` False, with null for the data)."""
        value = "null" if self.data_json is None or not data else self.data_json
        event = (
            f'{{"source": {json.dumps(self.source)}, "event": {json.dumps(self.event)}, '
            f'"id": {json.dumps(self.provider_id)}, "data": {value}}}'
        )
        if self.handler is None:
            return event
        return f'{{"handler": {json.dumps(self.handler)}, "event": {event}}}'

    def data_path(self) -> list[str]:
        """Where the data sits in the run's input."""
        return ["data"] if self.handler is None else ["event", "data"]


@dataclass(frozen=True)
class _Statements:
    """One vendor's SQL: ``single`` (PostgreSQL), or ``run`` then ``receipt``."""

    single: str = ""
    run: str = ""
    receipt: str = ""


#: Built statements by (vendor, notify, gate, checked): a handful, made on first use.
_built: dict[tuple[str, bool, bool, bool], _Statements] = {}


def _columns(model: type[Model], names: tuple[str, ...], quote: Callable[[str], str]) -> str:
    fields = {f.attname: f for f in model._meta.concrete_fields}
    return ", ".join(quote(fields[name].column) for name in names)


def _postgresql(
    quote: Callable[[str], str], notify: bool, gate: bool, checked: bool
) -> _Statements:
    run_id = quote(WebhookReceipt._meta.get_field("run").column)
    receipt_values = "%s::text, %s::text, %s::text, %s::uuid, %s::timestamptz"
    if gate:
        source = TriggerSource._meta
        value = CredentialValue._meta
        head = (
            f"WITH gate AS (SELECT 1 FROM {quote(source.db_table)} "
            f"WHERE {quote(source.get_field('name').column)} = %s "
            f"AND {quote(source.get_field('enabled').column)} "
            f"AND COALESCE((SELECT string_agg({quote(value.get_field('ciphertext').column)}, ',' "
            f"ORDER BY {quote(value.pk.column)}) FROM {quote(value.db_table)} "
            f"WHERE {quote(value.get_field('credential').column)} = %s "
            f"AND {quote(value.get_field('active').column)}), '') = %s), "
        )
        receipt_rows = f"SELECT {receipt_values} FROM gate"
        opened = "(SELECT count(*) FROM gate)"
    else:
        head = "WITH "
        receipt_rows = f"VALUES ({receipt_values})"
        opened = "1"
    woken = f"(SELECT pg_notify('{CHANNEL}', '') FROM run)" if notify else "NULL"
    # Unchecked data is parsed by jsonb on its own, then set into the input.
    run_input = "%s::jsonb" if checked else "jsonb_set(%s::jsonb, %s::text[], %s::jsonb)"
    return _Statements(
        single=(
            f"{head}receipt AS ("
            f"INSERT INTO {quote(WebhookReceipt._meta.db_table)} "
            f"({_columns(WebhookReceipt, RECEIPT_FIELDS, quote)}) {receipt_rows} "
            f"ON CONFLICT ({_columns(WebhookReceipt, RECEIPT_KEY, quote)}) DO NOTHING "
            f"RETURNING {run_id}), "
            f"run AS ("
            f"INSERT INTO {quote(WorkflowRun._meta.db_table)} "
            f"({_columns(WorkflowRun, RUN_FIELDS, quote)}) "
            f"SELECT {run_id}, %s, %s, {run_input}, NULL, NULL, '', false, %s, %s, 0, %s, %s "
            f"FROM receipt RETURNING {quote(WorkflowRun._meta.pk.column)}) "
            f"SELECT {opened}, (SELECT count(*) FROM run), {woken}"
        )
    )


def _portable(quote: Callable[[str], str], vendor: str, checked: bool) -> _Statements:
    def columns(model: type[Model], names: tuple[str, ...]) -> str:
        return f"INSERT INTO {quote(model._meta.db_table)} ({_columns(model, names, quote)}) "

    values = ", ".join(["%s"] * len(RUN_FIELDS))
    if checked:
        run = f"{columns(WorkflowRun, RUN_FIELDS)}VALUES ({values})"
    else:  # stored only if the data is one JSON value (nothing else can hide in the input)
        dual = " FROM DUAL" if vendor == "mysql" else ""
        run = f"{columns(WorkflowRun, RUN_FIELDS)}SELECT {values}{dual} WHERE JSON_VALID(%s)"
    receipt = ", ".join(["%s"] * len(RECEIPT_FIELDS))
    return _Statements(
        run=run, receipt=f"{columns(WebhookReceipt, RECEIPT_FIELDS)}VALUES ({receipt})"
    )


def statements_for(
    using: str, *, notify: bool, gate: bool = False, checked: bool = True
) -> _Statements:
    """The statements for ``using``'s vendor, built once per vendor and shape
    (``gate`` only on PostgreSQL; ``checked`` False when the data is still to be
    checked as JSON)."""
    return _statements(connections[using], notify, gate, checked)


def _statements(connection: Any, notify: bool, gate: bool, checked: bool) -> _Statements:
    vendor = connection.vendor
    postgresql = vendor == "postgresql"
    key = (vendor, notify, gate and postgresql, checked)
    found = _built.get(key)
    if found is None:
        quote = connection.ops.quote_name
        found = _built[key] = (
            _postgresql(quote, notify, gate, checked)
            if postgresql
            else _portable(quote, vendor, checked)
        )
    return found


#: A new run's status.
_RUNNING = RunStatus.RUNNING.value


def store_event(
    using: str,
    new: NewEvent,
    *,
    wake_at: datetime,
    notify: bool,
    gate: Gate | None = None,
    now: datetime | None = None,
) -> bool:
    """Store ``new``'s receipt and start its run, due at ``wake_at``: both or neither.

    ``now`` is when it was received (default: ``timezone.now()``). False, with
    nothing stored, when the receipt (or the run's idempotency key) already exists.
    ``notify`` wakes idle workers when the run is committed. With ``gate``
    (PostgreSQL), :class:`SourceChanged` when the source no longer matches it, and
    ``DataError`` when the data is not JSON the database takes; either way nothing
    is stored.
    """
    connection = connections[using]
    postgresql = connection.vendor == "postgresql"
    gated = gate is not None and postgresql
    checked = new.data_checked or new.data_json is None
    statements = _statements(connection, notify, gated, checked)
    received = timezone.now() if now is None else now
    now = _db_datetime(connection, received)
    due = now if wake_at is received else _db_datetime(connection, wake_at)
    run_id = uuid.uuid4()
    if not connection.features.has_native_uuid_field:
        run_id = run_id.hex  # as UUIDField stores it there
    try:
        if postgresql:
            params: list[Any] = []
            if gated:
                assert gate is not None
                params += [gate.source, gate.credential, gate.fingerprint]
            params += [new.source, new.event, new.provider_id, run_id, now, new.workflow, _RUNNING]
            if checked:
                params.append(new.input_json())
            else:
                params += [new.input_json(data=False), new.data_path(), new.data_json]
            params += [new.idempotency_key, due, now, now]
            opened, started, _ = _run_single(using, statements.single, params)
            if not opened:
                raise SourceChanged(new.source)
            return bool(started)
        run = [run_id, new.workflow, _RUNNING, new.input_json(), None, None, "", False]
        run += [new.idempotency_key, due, 0, now, now]
        not_json = None
        if not checked:
            run.append(new.data_json)
            not_json = DataError(f"the data of {new.source}:{new.event} is not JSON")
        receipt = [new.source, new.event, new.provider_id, run_id, now]
        write_together(
            using, [(statements.run, run, not_json), (statements.receipt, receipt, None)]
        )
    except IntegrityError as exc:
        logger.debug("Webhook %s:%s %s not stored: %s", new.source, new.event, new.provider_id, exc)
        return False
    return True


def _db_datetime(connection: Any, value: datetime) -> Any:
    """``value`` as ``connection`` stores a datetime field: Django's adaptation, with
    SQLite's usual case (a UTC value, a UTC connection) done directly."""
    if connection.vendor == "sqlite" and value.tzinfo is UTC and connection.timezone is UTC:
        return str(value.replace(tzinfo=None))
    return connection.ops.adapt_datetimefield_value(value)


def _run_single(using: str, sql: str, params: list[Any]) -> Any:
    """Run the one statement: its one row."""
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        # Inside the caller's transaction: a savepoint, so a refused run leaves it usable.
        with transaction.atomic(using=using):
            return fetch(using, sql, params)[0]
    return fetch(using, sql, params)[0]
