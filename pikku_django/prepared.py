"""pikku_django's own hot-path statements on PostgreSQL, bound server-side and prepared.

Django's cursors bind parameters client-side and prepare nothing. The few
statements pikku_django runs on every step or webhook go through :func:`fetch`
instead, so PostgreSQL plans each once per connection. ``PIKKU["PREPARED_STATEMENTS"]``
turns this off (behind PgBouncer before 1.21 in transaction mode); every other
database runs them through Django's cursor.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from django.db import connections


def fetch(using: str, sql: str, params: list[Any]) -> list[Any]:
    """Run ``sql`` on Django's connection ``using`` (in its transaction, if any): its rows."""
    from pikku_django.conf import pikku_settings

    connection = connections[using]
    if connection.vendor != "postgresql" or not pikku_settings.PREPARED_STATEMENTS:
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

                def execute(sql: str, params: Any, many: bool, context: dict[str, Any]) -> None:
                    cursor.execute(sql, params, prepare=True)

                # As Django's own cursors do: execute wrappers see the statement, and
                # so does the query log while it is on (DEBUG, assertNumQueries).
                for wrapper in reversed(connection.execute_wrappers):
                    execute = functools.partial(wrapper, execute)
                started = time.monotonic()
                execute(sql, params, False, {"connection": connection, "cursor": cursor})
                if connection.queries_logged:
                    connection.queries_log.append(
                        {"sql": sql, "time": f"{time.monotonic() - started:.3f}"}
                    )
                return cursor.fetchall()
        finally:
            raw.prepare_threshold = threshold


def fetch_one(using: str, sql: str, params: list[Any]) -> Any:
    """The first row of ``sql`` (None if none)."""
    rows = fetch(using, sql, params)
    return rows[0] if rows else None
