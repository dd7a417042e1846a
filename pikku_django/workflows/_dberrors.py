"""Database errors sorted by what to do about them: try again, or give up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError

T = TypeVar("T")

#: How often a write that hit a passing error (a deadlock, a lock wait) is made.
WRITE_TRIES = 4


def is_transient(exc: DatabaseError) -> bool:
    """Whether a database error passes by itself: a lost connection, a serialization
    failure, a deadlock, a lock wait, a statement cut short or a server short of
    resources (not bad data, a bad query or a limit every try would hit again)."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    driver = type(cause).__module__ if cause is not None else ""
    if driver.startswith("sqlite3"):
        # SQLite reports a missing table or a bad query as an OperationalError too.
        return any(word in str(cause).lower() for word in ("locked", "busy", "i/o"))
    if driver.startswith("MySQLdb"):
        args: tuple[Any, ...] = tuple(getattr(cause, "args", ()))
        return bool(args) and args[0] in MYSQL_TRANSIENT
    if driver.startswith("psycopg"):
        # psycopg 3 names it sqlstate, psycopg2 pgcode; none: the client lost the server.
        code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        return not code or code[:2] in POSTGRESQL_TRANSIENT_CLASSES or code in POSTGRESQL_TRANSIENT
    return True  # raised without a driver's error: taken as passing, as a lost connection


#: MariaDB/MySQL error codes that pass by themselves: lock wait, deadlock, a REPEATABLE
#: READ row changed since the snapshot (MariaDB's serialization failure with
#: ``innodb_snapshot_isolation``), a table changed under the transaction, a statement
#: interrupted or past ``max_statement_time``, too many connections, shutdown, and the
#: client's lost or refused connection.
MYSQL_TRANSIENT = frozenset(
    {1205, 1213, 1020, 1412, 1317, 1969, 1040, 1053, 1927, 2002, 2003, 2006, 2013, 4031}
)

#: PostgreSQL SQLSTATE classes that pass by themselves: connection exception (08),
#: transaction rollback (40: serialization failure, deadlock), insufficient resources
#: (53: disk full, out of memory, too many connections) and operator intervention
#: (57: query cancelled, statement timeout, shutdown, cannot connect now).
POSTGRESQL_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57"})

#: Other PostgreSQL SQLSTATEs that pass: lock not available (``lock_timeout``, NOWAIT),
#: object in use, system and I/O errors, snapshot too old. Not program limits (54),
#: other prerequisite states (55000), configuration or foreign-data errors, which every
#: try would hit again.
POSTGRESQL_TRANSIENT = frozenset({"55P03", "55006", "58000", "58030", "72000"})


def retrying(write: Callable[[], T], *, tries: int = WRITE_TRIES, pause: float = 0.05) -> T:
    """``write()``, made again (with a growing pause) while it fails with a passing
    error such as a deadlock or a lock-wait timeout; other errors propagate at once."""
    for attempt in range(1, tries + 1):
        try:
            return write()
        except DatabaseError as exc:
            if attempt == tries or not is_transient(exc):
                raise
            time.sleep(pause * 2 ** (attempt - 1))
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = [
    "MYSQL_TRANSIENT",
    "POSTGRESQL_TRANSIENT",
    "POSTGRESQL_TRANSIENT_CLASSES",
    "is_transient",
    "retrying",
]
