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
    failure, a deadlock or a lock wait (not bad data or a bad query)."""
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
    return True  # PostgreSQL: connection, serialization, deadlock, lock and admin errors


#: MariaDB/MySQL error codes that pass by themselves: lock wait, deadlock, too many
#: connections, shutdown, and the client's lost or refused connection.
MYSQL_TRANSIENT = frozenset({1205, 1213, 1040, 1053, 1927, 2002, 2003, 2006, 2013, 4031})


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


__all__ = ["MYSQL_TRANSIENT", "is_transient", "retrying"]
