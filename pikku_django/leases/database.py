"""The database lease backend: PostgreSQL, MariaDB/MySQL or SQLite through Django.

Lease statements run on connections of their own, in autocommit, so a lease
taken inside the caller's ``transaction.atomic()`` block takes effect at once
and never waits for, or rolls back with, anyone's transaction.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db import connections
from django.db.transaction import TransactionManagementError

from pikku_django.leases.base import (
    Lease,
    LeaseService,
    check_holder,
    check_key,
    check_lease,
    check_ttl,
)
from pikku_django.leases.sql import LeaseSQL, dialect_for
from pikku_django.pooling import keeps_sessions
from pikku_django.prepared import closed_by_server

logger = logging.getLogger(__name__)

_services: weakref.WeakSet[DatabaseLeaseService] = weakref.WeakSet()


class _ConnectionPool:
    """Autocommit connections to one database alias, lent to one caller at a time."""

    def __init__(self, alias: str, max_idle: int, *, prepared: bool = True) -> None:
        self.alias = alias
        self.max_idle = max_idle
        self.prepared = prepared
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def _new(self) -> Any:
        template = connections[self.alias]
        settings_dict = template.settings_dict
        if template.vendor == "postgresql" and self.prepared and keeps_sessions(self.alias):
            # These connections run only the lease statements: bind server-side and
            # let psycopg 3 prepare them, so the server plans each statement once.
            options = dict(settings_dict.get("OPTIONS") or {})
            options.setdefault("server_side_binding", True)
            options.setdefault("prepare_threshold", 2)
            settings_dict = {**settings_dict, "OPTIONS": options}
        conn = type(template)(settings_dict, self.alias)
        conn.inc_thread_sharing()  # lent to whichever thread asks, one at a time
        return conn

    def _take_idle(self) -> Any:
        """An idle connection the server has not closed meanwhile, or None.

        One that a server restart, ``pg_terminate_backend``, ``KILL`` or an idle
        timeout ended is dropped here, before any statement fails on it.
        """
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None or not closed_by_server(conn.connection):
                return conn
            logger.info("A pooled lease connection to %r was closed by the server", self.alias)
            self._discard(conn)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        conn = self._take_idle()
        if conn is None:
            conn = self._new()
        healthy = False
        try:
            with conn.wrap_database_errors:
                conn.ensure_connection()
                yield conn
            healthy = True
        finally:
            if healthy:
                with self._lock:
                    if len(self._idle) < self.max_idle:
                        self._idle.append(conn)
                        conn = None
            if conn is not None:
                self._discard(conn)

    @staticmethod
    def _discard(conn: Any) -> None:
        try:
            conn.close()
        except Exception:  # a broken connection may fail to close; it is dropped either way
            logger.debug("closing a lease connection failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            self._discard(conn)


class DatabaseLeaseService(LeaseService):
    """Leases in the ``pikku_lease`` table of a Django database.

    ``using`` is the DATABASES alias. On PostgreSQL and MariaDB/MySQL leases are
    judged on the database's clock; on SQLite on this process's clock. On
    PostgreSQL the statements are prepared, unless ``prepared=False`` or
    ``PIKKU["DATABASE_POOLING"]`` puts a pooler in transaction mode in front of
    ``using`` (PgBouncer before 1.21 cannot keep prepared statements there).
    """

    shared_between_processes = True

    def __init__(
        self,
        using: str = "default",
        *,
        max_idle: int = 8,
        prepared: bool = True,
        **options: Any,
    ) -> None:
        if using not in connections:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                f"PIKKU['LEASE_DATABASE'] is {using!r}, which is not in DATABASES"
            )
        self.using = using
        self._pool = _ConnectionPool(using, max_idle, prepared=prepared)
        self._dialect: LeaseSQL | None = None
        self._mysql_returning = options.pop("mysql_returning", True)
        if options:
            raise TypeError(f"Unknown DatabaseLeaseService options: {sorted(options)}")
        _services.add(self)

    @property
    def dialect(self) -> LeaseSQL:
        """The vendor's lease statements, chosen on first use."""
        if self._dialect is None:
            with self._pool.connection() as conn:
                self._dialect = dialect_for(conn, mysql_returning=self._mysql_returning)
        return self._dialect

    @property
    def judged_on_store_clock(self) -> bool:  # type: ignore[override]
        return self.dialect.judged_on_store_clock

    def _check_not_inside_sqlite_write_lock(self) -> None:
        caller = connections[self.using]
        if caller.vendor != "sqlite" or not caller.in_atomic_block:
            return
        mode = str((caller.settings_dict.get("OPTIONS") or {}).get("transaction_mode", ""))
        if mode.upper() in ("IMMEDIATE", "EXCLUSIVE"):
            raise TransactionManagementError(
                f"A lease on SQLite cannot be taken inside a transaction.atomic() block on "
                f"{self.using!r}: SQLite has one writer and the block holds it, so the lease "
                f"would wait for the block to end. Take the lease before the block, or keep "
                f"leases in another database or in Redis (PIKKU['LEASE_DATABASE'] / "
                f"PIKKU['LEASE_BACKEND'])."
            )

    @contextmanager
    def _cursor(self) -> Iterator[tuple[LeaseSQL, Any]]:
        dialect = self.dialect
        self._check_not_inside_sqlite_write_lock()
        with self._pool.connection() as conn:
            cursor = conn.connection.cursor()
            try:
                yield dialect, cursor
            finally:
                cursor.close()

    def acquire(self, key: str, holder: str, ttl_ms: int) -> Lease | None:
        check_key(key)
        check_holder(holder)
        check_ttl(ttl_ms)
        with self._cursor() as (dialect, cursor):
            row = dialect.acquire(cursor, key, holder, ttl_ms)
        return None if row is None else Lease(key, holder, int(row[0]), int(row[1]))

    def refresh(self, lease: Lease, ttl_ms: int) -> Lease | None:
        check_lease(lease)
        check_ttl(ttl_ms)
        with self._cursor() as (dialect, cursor):
            expires_at = dialect.refresh(cursor, lease.key, lease.holder, lease.token, ttl_ms)
        if expires_at is None:
            return None
        return Lease(lease.key, lease.holder, lease.token, int(expires_at))

    def release(self, lease: Lease) -> bool:
        check_lease(lease)
        with self._cursor() as (dialect, cursor):
            return dialect.release(cursor, lease.key, lease.holder, lease.token)

    def get(self, key: str) -> Lease | None:
        check_key(key)
        with self._cursor() as (dialect, cursor):
            row = dialect.get(cursor, key)
        return None if row is None else Lease(key, row[0], int(row[1]), int(row[2]))

    def forget(self, keys: Sequence[str]) -> int:
        from pikku_django.models import Lease as LeaseRow

        if not keys:
            return 0
        # Through the alias's Django connection, so it joins the caller's transaction.
        deleted, _ = LeaseRow.objects.using(self.using).filter(key__in=list(keys)).delete()
        return deleted

    def close(self) -> None:
        self._pool.close()


def close_database_lease_connections() -> None:
    """Close the idle connections of every database lease service in this process."""
    for service in list(_services):
        service.close()
