"""pikku_django's own hot-path statements, run on Django's connection with less overhead.

Django's cursors bind parameters client-side and prepare nothing. The few
statements pikku_django runs on every step or webhook go through :func:`fetch`
instead: on PostgreSQL bound server-side and prepared, so it plans each once per
connection (``PIKKU["PREPARED_STATEMENTS"]`` turns this off, behind PgBouncer before
1.21 in transaction mode); on SQLite straight on the driver's cursor. MariaDB and
MySQL run them through Django's cursor. Either way Django's execute wrappers and
query log see every statement, and driver errors become Django's.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction

from pikku_django.conf import pikku_settings


def fetch(using: str, sql: str, params: list[Any]) -> list[Any]:
    """Run ``sql`` on Django's connection ``using`` (in its transaction, if any): its rows."""
    return fetch_on(connections[using], sql, params)


def fetch_on(connection: Any, sql: str, params: list[Any]) -> list[Any]:
    """:func:`fetch` on a connection object (``connections[using]``)."""
    vendor = connection.vendor
    if vendor == "sqlite":
        with connection.wrap_database_errors:
            cursor = _sqlite_cursor(connection)
            try:
                _logged(connection, cursor, sql, params, _qmark(sql))
                return cursor.fetchall()
            finally:
                cursor.close()
    if vendor != "postgresql" or not pikku_settings.PREPARED_STATEMENTS:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
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


def _sqlite_cursor(connection: Any) -> Any:
    """A cursor of the driver's connection, as Django's own cursor() would check it
    (connected, not in a broken transaction); call inside ``wrap_database_errors``."""
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    return connection.connection.cursor()


@functools.lru_cache(maxsize=64)
def _qmark(sql: str) -> str:
    """``%s`` placeholders as SQLite's ``?`` (and ``%%`` as ``%``), as Django converts them."""
    return re.sub(r"(?<!%)%s", "?", sql).replace("%%", "%")


def write_together(
    using: str, statements: Sequence[tuple[str, list[Any], Exception | None]]
) -> None:
    """Run ``statements`` in one transaction: all or none.

    Each is SQL, its parameters, and an exception to raise (after rolling back) when
    it changes no row, or None. Inside the caller's transaction, a savepoint. On
    SQLite in autocommit, one ``BEGIN IMMEDIATE`` ... ``COMMIT`` on the driver's
    connection.
    """
    connection = connections[using]
    connection.ensure_connection()
    if connection.vendor != "sqlite" or connection.in_atomic_block or not connection.autocommit:
        with transaction.atomic(using=using):
            for sql, params, refused in statements:
                if not fetch_nothing(using, sql, params) and refused is not None:
                    raise refused
        return
    with connection.wrap_database_errors:
        cursor = _sqlite_cursor(connection)
        raw = connection.connection
        execute = _sqlite_executor(connection, cursor)
        try:
            execute("BEGIN IMMEDIATE", None)
            try:
                for sql, params, refused in statements:
                    execute(sql, params)
                    if refused is not None and not cursor.rowcount:
                        raise refused
                execute("COMMIT", None)
            except BaseException:
                if raw.in_transaction:
                    raw.rollback()
                raise
        finally:
            cursor.close()


def _sqlite_executor(connection: Any, cursor: Any) -> Callable[[str, Any], Any]:
    """``execute(sql, params)`` on SQLite's driver ``cursor``: straight through when
    nothing watches the statements, else as :func:`_logged` runs them."""
    if not connection.execute_wrappers and not connection.queries_logged:
        return lambda sql, params: cursor.execute(_qmark(sql), () if params is None else params)
    return lambda sql, params: _logged(connection, cursor, sql, params, _qmark(sql))


def fetch_nothing(using: str, sql: str, params: list[Any]) -> int:
    """Run a statement that returns no rows, as :func:`fetch` runs one: the number of
    rows it changed."""
    connection = connections[using]
    if connection.vendor == "sqlite":
        with connection.wrap_database_errors:
            cursor = _sqlite_cursor(connection)
            try:
                _logged(connection, cursor, sql, params, _qmark(sql))
                return int(cursor.rowcount)
            finally:
                cursor.close()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def fetch_one(using: str, sql: str, params: list[Any]) -> Any:
    """The first row of ``sql`` (None if none)."""
    rows = fetch(using, sql, params)
    return rows[0] if rows else None
