"""pikku_django's own hot-path statements, run on Django's connection with less overhead.

Django's cursors bind parameters client-side and prepare nothing. The few
statements pikku_django runs on every step or webhook go through :func:`fetch`
instead: on PostgreSQL bound server-side and prepared, so it plans each once per
connection (``PIKKU["PREPARED_STATEMENTS"]`` turns this off, and so does a pooler in
transaction mode named in ``PIKKU["DATABASE_POOLING"]``: the next transaction may run
on a server session that never prepared them, and the store's hot statements are
called as their PL/pgSQL functions instead, :mod:`pikku_django.workflows.store.routines`);
on SQLite straight on the driver's
cursor. MariaDB and MySQL run them through Django's cursor. Either way Django's execute
wrappers and query log see every statement, and driver errors become Django's.
"""

from __future__ import annotations

import functools
import operator
import re
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from pikku_django.conf import pikku_settings
from pikku_django.pooling import keeps_sessions

#: Set by the workflow store (:mod:`pikku_django.workflows.store.routines`): the call of
#: a statement's server-side function on a connection behind a transaction pooler, or
#: None where the statement runs as it is.
routine_call: Callable[[Any, str], str | None] | None = None


def fetch(using: str, sql: str, params: list[Any]) -> list[Any]:
    """Run ``sql`` on Django's connection ``using`` (in its transaction, if any): its rows."""
    return fetch_on(connections[using], sql, params)


def closed_by_server(raw: Any) -> bool:
    """Whether the server has closed this idle DB-API connection (restarted, or ended
    the session): its socket has something to read while no statement runs. No round
    trip; False for a connection without a socket (SQLite)."""
    if raw is None:
        return True
    fileno = getattr(raw, "fileno", None)
    if fileno is None:
        return False
    try:
        descriptor = fileno()
    except Exception:  # the driver knows the connection is gone (psycopg: "is lost")
        return True
    try:
        poller = select.poll()
        poller.register(descriptor, select.POLLIN | select.POLLPRI)
    except (OSError, ValueError, AttributeError):  # closed already, or no poll() here
        return bool(getattr(raw, "closed", False))
    return bool(poller.poll(0))


def _replace_if_closed(connection: Any) -> None:
    """Close Django's connection outside a transaction if its server closed it, so
    the next statement reconnects instead of failing."""
    raw = connection.connection
    if raw is None or connection.in_atomic_block or not closed_by_server(raw):
        return
    if connection.vendor == "postgresql" and not _postgresql_said_goodbye(raw):
        return  # a notification for a LISTEN of the project's own, say
    connection.close()


def _postgresql_said_goodbye(raw: Any) -> bool:
    """Whether what waits on an idle PostgreSQL connection is its end: nothing more, or
    an error (sent to an idle session only to end it). Under TLS it cannot be told, and
    the next statement finds out."""
    try:
        if raw.pgconn.ssl_in_use:
            return False
        descriptor = raw.fileno()
    except Exception:  # the driver knows the connection is gone
        return True
    try:
        with socket.fromfd(descriptor, socket.AF_INET, socket.SOCK_STREAM) as sock:
            first = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return first in (b"", b"E")


def fetch_on(connection: Any, sql: str, params: list[Any]) -> list[Any]:
    """:func:`fetch` on a connection object (``connections[using]``)."""
    _replace_if_closed(connection)
    vendor = connection.vendor
    if vendor == "sqlite":
        return list(_run_on_sqlite(connection, sql, params, _ROWS))
    if vendor == "postgresql" and routine_call is not None and not keeps_sessions(connection.alias):
        # Behind a transaction pooler: its function plans it once per server session.
        sql = routine_call(connection, sql) or sql
    if (
        vendor != "postgresql"
        or not pikku_settings.PREPARED_STATEMENTS
        or not keeps_sessions(connection.alias)
    ):
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())
    import psycopg

    with connection.wrap_database_errors:
        connection.ensure_connection()
        connection.validate_no_broken_transaction()
        raw = connection.connection
        threshold = raw.prepare_threshold
        if threshold is None:  # Django's default: psycopg then prepares nothing
            raw.prepare_threshold = 5
        try:
            with psycopg.Cursor(raw) as cursor:
                _logged(connection, cursor, sql, params, sql, prepare=True)
                return cursor.fetchall()
        finally:
            raw.prepare_threshold = threshold


def _logged(
    connection: Any, cursor: Any, sql: str, params: Any, driver_sql: str, **options: Any
) -> None:
    """Execute on the driver's ``cursor`` as Django's own cursors do: through the
    connection's execute wrappers, and into the query log while it is on (DEBUG,
    assertNumQueries)."""
    if not connection.execute_wrappers and not connection.queries_logged:
        cursor.execute(driver_sql, () if params is None else params, **options)
        return

    def execute(sql: str, params: Any, many: bool, context: dict[str, Any]) -> None:
        cursor.execute(driver_sql, () if params is None else params, **options)

    for wrapper in reversed(connection.execute_wrappers):
        execute = functools.partial(wrapper, execute)
    started = time.monotonic()
    execute(sql, params, False, {"connection": connection, "cursor": cursor})
    if connection.queries_logged:
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})


#: What a statement run on SQLite's driver cursor hands back: its rows, or its row count.
_ROWS = operator.methodcaller("fetchall")
_ROWCOUNT = operator.attrgetter("rowcount")


def _run_on_sqlite(connection: Any, sql: str, params: Any, result: Callable[[Any], Any]) -> Any:
    """``result(cursor)`` of the driver's cursor, having run ``sql`` in the connection's
    transaction (if any), checked as Django's own cursor() checks it."""
    with connection.wrap_database_errors:
        connection.ensure_connection()
        connection.validate_no_broken_transaction()
        cursor = connection.connection.cursor()
        try:
            _logged(connection, cursor, sql, params, _qmark(sql))
            return result(cursor)
        finally:
            cursor.close()


@functools.lru_cache(maxsize=64)
def _qmark(sql: str) -> str:
    """``%s`` placeholders as SQLite's ``?`` (and ``%%`` as ``%``), as Django converts them."""
    return re.sub(r"(?<!%)%s", "?", sql).replace("%%", "%")


def fetch_nothing_on(connection: Any, sql: str, params: list[Any]) -> int:
    """Run a statement that returns no rows on a connection object, as :func:`fetch_on`
    runs one: the number of rows it changed."""
    _replace_if_closed(connection)
    if connection.vendor == "sqlite":
        return int(_run_on_sqlite(connection, sql, params, _ROWCOUNT))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def fetch_one(using: str, sql: str, params: list[Any]) -> Any:
    """The first row of ``sql`` (None if none)."""
    rows = fetch(using, sql, params)
    return rows[0] if rows else None
