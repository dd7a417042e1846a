"""The store's clock in epoch milliseconds, as SQL for each database vendor.

PostgreSQL and MariaDB/MySQL read their own clock, so a worker whose clock is
wrong cannot stretch or take a lease. SQLite is single-host: it is handed this
process's clock.
"""

from __future__ import annotations

import time
from typing import Any

from django.db.models import BigIntegerField, Expression

POSTGRESQL_NOW_MS = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
MYSQL_NOW_MS = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)"


def process_now_ms() -> int:
    """This process's wall clock in epoch milliseconds."""
    return int(time.time() * 1000)


class EpochMs(Expression):
    """``now`` in epoch milliseconds on the database's clock (the process's on SQLite)."""

    output_field = BigIntegerField()

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        return "%s", (process_now_ms(),)

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        return POSTGRESQL_NOW_MS, ()

    def as_mysql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        return MYSQL_NOW_MS, ()


def store_now_ms(using: str) -> int:
    """Read the store's clock once."""
    from django.db import connections

    connection = connections[using]
    if connection.vendor == "postgresql":
        sql = f"SELECT {POSTGRESQL_NOW_MS}"
    elif connection.vendor == "mysql":
        sql = f"SELECT {MYSQL_NOW_MS}"
    else:
        return process_now_ms()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])
