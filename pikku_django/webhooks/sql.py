"""Webhook SQL: reading a source's switch and secrets, and storing an accepted event
as its receipt, with the input of the run a worker is to start for it.

An event is one INSERT, so outside a transaction it needs no BEGIN or COMMIT of its
own; the receipt's unique constraint refuses a redelivery. On PostgreSQL the same
statement wakes the workers (``NOTIFY``) and, with a :class:`Gate`, first checks that
the source is still enabled with the credential values the request was verified
against, storing nothing otherwise. A worker on PostgreSQL starts a batch of waiting
receipts' runs through the workflow engine
(:func:`pikku_django.webhooks.dispatch.start_waiting_runs`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import DataError, IntegrityError, OperationalError, connections, transaction
from django.db.models import Model
from django.utils import timezone

from pikku_django.models import CredentialValue, TriggerSource, WebhookDigest, WebhookReceipt
from pikku_django.prepared import fetch_nothing_on, fetch_on
from pikku_django.wakeups import RECEIPTS_WAITING, WORK_CHANNEL

logger = logging.getLogger(__name__)

RECEIPT_FIELDS = ("source", "event", "provider_id", "received_at", "workflow", "input")
RECEIPT_KEY = ("source", "event", "provider_id")


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
        return quote(str(meta.get_field(name).column))

    return (
        f"SELECT s.{col(source, 'enabled')}, c.{col(value, 'ciphertext')} "
        f"FROM {quote(source.db_table)} s LEFT JOIN {quote(value.db_table)} c "
        f"ON c.{col(value, 'credential')} = %s AND c.{col(value, 'active')} = %s "
        f"WHERE s.{col(source, 'name')} = %s ORDER BY c.{quote(str(value.pk.column))}"
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


def claims_digest_with_receipt(using: str) -> bool:
    """Whether :func:`store_event` claims a request's digest in the receipt's own
    statement (else the caller claims it in a transaction around the store)."""
    return connections[using].vendor == "postgresql"


def fingerprint_of(ciphertexts: list[str]) -> str:
    """The gate's fingerprint of a credential's active ciphertexts (oldest first)."""
    return ",".join(ciphertexts)


@dataclass(frozen=True)
class NewEvent:
    """An accepted event: its receipt, and the run of ``workflow`` it is to start.

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


def idempotency_key(source: str, event: str, provider_id: str) -> str:
    """The idempotency key of the run an event starts."""
    return f"webhook:{source}:{event}:{provider_id}"[:255]


#: Built statements by (vendor, notify, gate, checked, claim): a handful, made on first use.
_built: dict[tuple[str, bool, bool, bool, bool], str] = {}


def _columns(model: type[Model], names: tuple[str, ...], quote: Callable[[str], str]) -> str:
    fields = {f.attname: f for f in model._meta.concrete_fields}
    return ", ".join(quote(str(fields[name].column)) for name in names)


def _postgresql(
    quote: Callable[[str], str], notify: bool, gate: bool, checked: bool, claim: bool = False
) -> str:
    """One statement: its row is (the gate opened, a receipt was stored, notified).

    With ``claim``, it first records the request's digest for the source, and stores
    the receipt only when that digest is new (a concurrent claim of it waits for the
    other's commit, then stores nothing)."""
    # Unchecked data is parsed by jsonb on its own, then set into the input.
    run_input = "%s::jsonb" if checked else "jsonb_set(%s::jsonb, %s::text[], %s::jsonb)"
    values = f"%s::text, %s::text, %s::text, %s::timestamptz, %s::text, {run_input}"
    if gate:
        source = TriggerSource._meta
        value = CredentialValue._meta

        def s(name: str) -> str:
            return _columns(TriggerSource, (name,), quote)

        def v(name: str) -> str:
            return _columns(CredentialValue, (name,), quote)

        head = (
            f"WITH gate AS (SELECT 1 FROM {quote(source.db_table)} "
            f"WHERE {s('name')} = %s AND {s('enabled')} "
            f"AND COALESCE((SELECT string_agg({v('ciphertext')}, ',' "
            f"ORDER BY {quote(str(value.pk.column))}) FROM {quote(value.db_table)} "
            f"WHERE {v('credential')} = %s AND {v('active')}), '') = %s), "
        )
        rows = f"SELECT {values} FROM gate"
        opened = "(SELECT count(*) FROM gate)"
    else:
        head = "WITH "
        rows = f"VALUES ({values})"
        opened = "1"
    if claim:
        digests = quote(WebhookDigest._meta.db_table)
        claimed = _columns(WebhookDigest, ("source", "digest", "received_at"), quote)
        key = _columns(WebhookDigest, ("source", "digest"), quote)
        head += (
            f"claim AS (INSERT INTO {digests} ({claimed}) "
            f"SELECT %s::text, %s::text, %s::timestamptz{' FROM gate' if gate else ''} "
            f"ON CONFLICT ({key}) DO NOTHING RETURNING 1), "
        )
        rows = f"SELECT {values} FROM {'gate, ' if gate else ''}claim"
    woken = "NULL"
    if notify:
        woken = f"(SELECT pg_notify('{WORK_CHANNEL}', '{RECEIPTS_WAITING}') FROM receipt)"
    return (
        f"{head}receipt AS ("
        f"INSERT INTO {quote(WebhookReceipt._meta.db_table)} "
        f"({_columns(WebhookReceipt, RECEIPT_FIELDS, quote)}) {rows} "
        f"ON CONFLICT ({_columns(WebhookReceipt, RECEIPT_KEY, quote)}) DO NOTHING "
        f"RETURNING 1) "
        f"SELECT {opened}, (SELECT count(*) FROM receipt), {woken}"
    )


def _portable(quote: Callable[[str], str], vendor: str, checked: bool) -> str:
    """One INSERT; unchecked data is stored only if it is one JSON value (so nothing
    else can hide in the input)."""
    values = ", ".join(["%s"] * len(RECEIPT_FIELDS))
    insert = (
        f"INSERT INTO {quote(WebhookReceipt._meta.db_table)} "
        f"({_columns(WebhookReceipt, RECEIPT_FIELDS, quote)}) "
    )
    if checked:
        return f"{insert}VALUES ({values})"
    dual = " FROM DUAL" if vendor == "mysql" else ""
    return f"{insert}SELECT {values}{dual} WHERE JSON_VALID(%s)"


def _statement(
    connection: Any, notify: bool, gate: bool, checked: bool, claim: bool = False
) -> str:
    """The statement for ``connection``'s vendor, built once per vendor and shape
    (``gate`` and ``claim`` only on PostgreSQL; ``checked`` False when the data is
    still to be checked as JSON)."""
    vendor = connection.vendor
    postgresql = vendor == "postgresql"
    key = (vendor, notify, gate and postgresql, checked, claim and postgresql)
    found = _built.get(key)
    if found is None:
        quote = connection.ops.quote_name
        found = _built[key] = (
            _postgresql(quote, notify, gate, checked, claim)
            if postgresql
            else _portable(quote, vendor, checked)
        )
    return found


def store_event(
    using: str,
    new: NewEvent,
    *,
    notify: bool,
    gate: Gate | None = None,
    now: datetime | None = None,
    digest: str | None = None,
) -> bool:
    """Store ``new``'s receipt, received at ``now`` (default: ``timezone.now()``), with
    the input of the run a worker is to start for it.

    False, with nothing stored, when the receipt already exists. ``notify`` wakes idle
    workers when the receipt is committed. With ``gate`` (PostgreSQL),
    :class:`SourceChanged` when the source no longer matches it. ``DataError`` when the
    data is not JSON the database takes; nothing is stored. With ``digest``
    (PostgreSQL only), the same statement records that ``new.source`` accepted the
    signed bytes of that SHA-256 (:class:`~pikku_django.models.WebhookDigest`), and
    stores nothing (False) when it had before.
    """
    connection = connections[using]
    postgresql = connection.vendor == "postgresql"
    if digest is not None and not postgresql:
        raise ValueError("a digest is claimed with the receipt only on PostgreSQL")
    gated = gate is not None and postgresql
    checked = new.data_checked or new.data_json is None
    sql = _statement(connection, notify, gated, checked, digest is not None)
    received = _db_datetime(connection, timezone.now() if now is None else now)
    params: list[Any] = []
    if gated:
        assert gate is not None
        params += [gate.source, gate.credential, gate.fingerprint]
    if digest is not None:
        params += [new.source, digest, received]
    params += [new.source, new.event, new.provider_id, received, new.workflow]
    try:
        if postgresql:
            if checked:
                params.append(new.input_json())
            else:
                params += [new.input_json(data=False), new.data_path(), new.data_json]
            opened, stored, _ = _in_savepoint(connection, fetch_on, sql, params)[0]
            if not opened:
                raise SourceChanged(new.source)
            return bool(stored)
        params.append(new.input_json())
        if checked:
            _in_savepoint(connection, fetch_nothing_on, sql, params)
            return True
        params.append(new.data_json)
        if not _in_savepoint(connection, fetch_nothing_on, sql, params):
            raise DataError(f"the data of {new.source}:{new.event} is not JSON")
    except IntegrityError as exc:
        logger.debug("Webhook %s:%s %s not stored: %s", new.source, new.event, new.provider_id, exc)
        return False
    except OperationalError as exc:
        if _refused_value(exc):
            raise DataError(
                f"the data of {new.source}:{new.event} cannot be stored: {exc}"
            ) from exc
        raise
    return True


#: MySQL and MariaDB errors that refuse a value, not the connection: a failed CHECK
#: (MariaDB's JSON_VALID, which refuses JSON nested 32 levels deep), and JSON text
#: MySQL cannot take or nest.
_MYSQL_VALUE_ERRORS = frozenset({3140, 3157, 3819, 4025})


def _refused_value(exc: OperationalError) -> bool:
    cause = exc.__cause__
    args: tuple[Any, ...] = getattr(cause, "args", ())
    return bool(args) and args[0] in _MYSQL_VALUE_ERRORS and "MySQLdb" in type(cause).__module__


def _db_datetime(connection: Any, value: datetime) -> Any:
    """``value`` as ``connection`` stores a datetime field: Django's adaptation, with
    SQLite's usual case (a UTC value, a UTC connection) done directly."""
    if connection.vendor == "sqlite" and value.tzinfo is UTC and connection.timezone is UTC:
        return str(value.replace(tzinfo=None))
    return connection.ops.adapt_datetimefield_value(value)


def _in_savepoint(connection: Any, run: Callable[..., Any], sql: str, params: list[Any]) -> Any:
    """``run(connection, sql, params)``; inside the caller's transaction, in a savepoint,
    so a refused statement leaves that transaction usable."""
    if connection.in_atomic_block or not connection.get_autocommit():
        with transaction.atomic(using=connection.alias):
            return run(connection, sql, params)
    return run(connection, sql, params)
