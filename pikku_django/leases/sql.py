"""The lease SQL of each database vendor, and nothing else.

Each dialect runs one statement per operation on a raw DB-API cursor of a
connection in autocommit mode. PostgreSQL and MariaDB/MySQL judge time on the
database's clock; SQLite is single-host, so it is handed this process's clock.
"""

from __future__ import annotations

import abc
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from pikku_django.dbclock import MYSQL_NOW_MS, POSTGRESQL_NOW_MS
from pikku_django.leases.base import now_ms

Row = tuple[int, int]  # (token, expires_at)

#: PostgreSQL's timeline (the epoch a promotion raises), from the name of the WAL file
#: being written: its first 8 hex digits.
POSTGRESQL_TIMELINE = (
    "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint"
)
#: The first token of the current timeline: (timeline - 1) * 2**32 + 1.
POSTGRESQL_FIRST_TOKEN = f"((({POSTGRESQL_TIMELINE}) - 1) << 32) + 1"


def postgresql_next_token(token: str) -> str:
    """The token that follows ``token`` (an SQL expression) on PostgreSQL: the next
    one, and never less than the current timeline's first, so that every token handed
    out after a promotion exceeds every one handed out before it (lease tokens, and
    the workflow store's claim tokens of steps)."""
    return f"greatest({token} + 1, {POSTGRESQL_FIRST_TOKEN})"


def _row(row: Any) -> Row | None:
    """A (token, expires_at) row as ints (a driver's cursor rows are untyped)."""
    return None if row is None else (int(row[0]), int(row[1]))


def _held(row: Any) -> tuple[str, int, int] | None:
    """A (holder, token, expires_at) row, typed."""
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]))


class LeaseSQL(abc.ABC):
    """One vendor's lease statements."""

    vendor = ""
    judged_on_store_clock = True

    @abc.abstractmethod
    def acquire(self, cursor: Any, key: str, holder: str, ttl_ms: int) -> Row | None:
        """Take or extend the lease: (token, expires_at), or None while another holds it."""

    @abc.abstractmethod
    def refresh(self, cursor: Any, key: str, holder: str, token: int, ttl_ms: int) -> int | None:
        """The new expiry, or None when the lease is not live under this holder and token."""

    @abc.abstractmethod
    def release(self, cursor: Any, key: str, holder: str, token: int) -> bool:
        """Lapse the lease if it is still live under this holder and token."""

    @abc.abstractmethod
    def get(self, cursor: Any, key: str) -> tuple[str, int, int] | None:
        """(holder, token, expires_at) of the live lease, or None."""


class PostgreSQLLeaseSQL(LeaseSQL):
    """PostgreSQL: one statement per operation, judged on ``clock_timestamp()``."""

    vendor = "postgresql"
    NOW = POSTGRESQL_NOW_MS
    #: The lowest token this server hands out: 1 on timeline 1, and 2**32 higher on each
    #: later timeline. Promoting a standby starts a new timeline, so every token handed
    #: out after a failover is higher than any handed out before it, commits the
    #: standby never received included (they stay on the old timeline). The timeline is
    #: that of the WAL being written (any role may read it, and it costs no round trip).
    FIRST_TOKEN = POSTGRESQL_FIRST_TOKEN

    #: Take or extend a lease, for an INSERT of (key, holder, FIRST_TOKEN, expires_at)
    #: rows into ``pikku_lease AS l``; parameters: ttl ms, ttl ms. A taken lease gets
    #: the next token, and never less than FIRST_TOKEN. Statements that take leases
    #: with other work (the workflow store's due-run claim) end their INSERT with it.
    TAKE_ON_CONFLICT = f"""
        ON CONFLICT (key) DO UPDATE SET
            token = CASE WHEN l.expires_at > EXCLUDED.expires_at - %s
                         THEN l.token ELSE {postgresql_next_token("l.token")} END,
            holder = EXCLUDED.holder,
            expires_at = EXCLUDED.expires_at
        WHERE l.expires_at <= EXCLUDED.expires_at - %s OR l.holder = EXCLUDED.holder
    """
    ACQUIRE = f"""
        INSERT INTO pikku_lease AS l (key, holder, token, expires_at)
        VALUES (%s, %s, {FIRST_TOKEN}, {NOW} + %s)
        {TAKE_ON_CONFLICT}
        RETURNING token, expires_at
    """
    REFRESH = f"""
        UPDATE pikku_lease AS l SET expires_at = now.ms + %s
        FROM (SELECT {NOW} AS ms) AS now
        WHERE l.key = %s AND l.holder = %s AND l.token = %s AND l.expires_at > now.ms
        RETURNING l.expires_at
    """
    #: Lapse a live lease; parameters: key, holder, token. Statements that release a
    #: lease with other work (the workflow store's end of a run) use it too.
    RELEASE = f"""
        UPDATE pikku_lease SET expires_at = 0
        WHERE key = %s AND holder = %s AND token = %s AND expires_at > {NOW}
    """
    GET = f"SELECT holder, token, expires_at FROM pikku_lease WHERE key = %s AND expires_at > {NOW}"

    def acquire(self, cursor: Any, key: str, holder: str, ttl_ms: int) -> Row | None:
        cursor.execute(self.ACQUIRE, (key, holder, ttl_ms, ttl_ms, ttl_ms))
        return _row(cursor.fetchone())

    def refresh(self, cursor: Any, key: str, holder: str, token: int, ttl_ms: int) -> int | None:
        cursor.execute(self.REFRESH, (ttl_ms, key, holder, token))
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def release(self, cursor: Any, key: str, holder: str, token: int) -> bool:
        cursor.execute(self.RELEASE, (key, holder, token))
        return bool(cursor.rowcount > 0)

    def get(self, cursor: Any, key: str) -> tuple[str, int, int] | None:
        cursor.execute(self.GET, (key,))
        return _held(cursor.fetchone())


class MySQLLeaseSQL(LeaseSQL):
    """MySQL: judged on ``UTC_TIMESTAMP(6)``; acquire is an upsert and a read.

    Every assignment of the upsert decides on the row's old values: ``token`` is
    set before ``holder`` and ``expires_at``, which MySQL assigns left to right.
    """

    vendor = "mysql"
    NOW = MYSQL_NOW_MS
    TAKE = f"(expires_at <= {NOW} OR holder = VALUES(holder))"

    UPSERT = f"""
        INSERT INTO pikku_lease (`key`, holder, token, expires_at)
        VALUES (%s, %s, 1, {NOW} + %s)
        ON DUPLICATE KEY UPDATE
            token = IF(expires_at <= {NOW}, token + 1, token),
            holder = IF({TAKE}, VALUES(holder), holder),
            expires_at = IF({TAKE}, VALUES(expires_at), expires_at)
    """
    READ = "SELECT holder, token, expires_at FROM pikku_lease WHERE `key` = %s"
    # LAST_INSERT_ID(expr) hands the new expiry back in the OK packet: one round trip.
    REFRESH = f"""
        UPDATE pikku_lease SET expires_at = LAST_INSERT_ID({NOW} + %s)
        WHERE `key` = %s AND holder = %s AND token = %s AND expires_at > {NOW}
    """
    RELEASE = f"""
        UPDATE pikku_lease SET expires_at = 0
        WHERE `key` = %s AND holder = %s AND token = %s AND expires_at > {NOW}
    """
    GET = (
        f"SELECT holder, token, expires_at FROM pikku_lease WHERE `key` = %s AND expires_at > {NOW}"
    )

    def acquire(self, cursor: Any, key: str, holder: str, ttl_ms: int) -> Row | None:
        cursor.execute(self.UPSERT, (key, holder, ttl_ms))
        cursor.execute(self.READ, (key,))
        return self._mine(cursor.fetchone(), holder)

    @staticmethod
    def _mine(row: tuple[str, int, int] | None, holder: str) -> Row | None:
        if row is None or row[0] != holder:
            return None
        return int(row[1]), int(row[2])

    def refresh(self, cursor: Any, key: str, holder: str, token: int, ttl_ms: int) -> int | None:
        cursor.execute(self.REFRESH, (ttl_ms, key, holder, token))
        return int(cursor.lastrowid) if cursor.rowcount > 0 else None

    def release(self, cursor: Any, key: str, holder: str, token: int) -> bool:
        cursor.execute(self.RELEASE, (key, holder, token))
        return bool(cursor.rowcount > 0)

    def get(self, cursor: Any, key: str) -> tuple[str, int, int] | None:
        cursor.execute(self.GET, (key,))
        return _held(cursor.fetchone())


class MariaDBLeaseSQL(MySQLLeaseSQL):
    """MariaDB: as MySQL, but acquire returns its row with ``RETURNING``: one round trip."""

    ACQUIRE = MySQLLeaseSQL.UPSERT + " RETURNING holder, token, expires_at"

    def acquire(self, cursor: Any, key: str, holder: str, ttl_ms: int) -> Row | None:
        cursor.execute(self.ACQUIRE, (key, holder, ttl_ms))
        return self._mine(cursor.fetchone(), holder)


class SQLiteLeaseSQL(LeaseSQL):
    """SQLite: one statement per operation, judged on this process's clock."""

    vendor = "sqlite"
    judged_on_store_clock = False

    ACQUIRE = """
        INSERT INTO pikku_lease (key, holder, token, expires_at) VALUES (?, ?, 1, ?)
        ON CONFLICT (key) DO UPDATE SET
            token = CASE WHEN expires_at > ? THEN token ELSE token + 1 END,
            holder = excluded.holder,
            expires_at = excluded.expires_at
        WHERE expires_at <= ? OR holder = excluded.holder
        RETURNING token, expires_at
    """
    REFRESH = """
        UPDATE pikku_lease SET expires_at = ?
        WHERE key = ? AND holder = ? AND token = ? AND expires_at > ?
        RETURNING expires_at
    """
    RELEASE = """
        UPDATE pikku_lease SET expires_at = 0
        WHERE key = ? AND holder = ? AND token = ? AND expires_at > ?
    """
    GET = "SELECT holder, token, expires_at FROM pikku_lease WHERE key = ? AND expires_at > ?"

    def acquire(self, cursor: Any, key: str, holder: str, ttl_ms: int) -> Row | None:
        now = now_ms()
        cursor.execute(self.ACQUIRE, (key, holder, now + ttl_ms, now, now))
        rows = cursor.fetchall()
        return _row(rows[0]) if rows else None

    def refresh(self, cursor: Any, key: str, holder: str, token: int, ttl_ms: int) -> int | None:
        now = now_ms()
        cursor.execute(self.REFRESH, (now + ttl_ms, key, holder, token, now))
        rows = cursor.fetchall()
        return int(rows[0][0]) if rows else None

    def release(self, cursor: Any, key: str, holder: str, token: int) -> bool:
        cursor.execute(self.RELEASE, (key, holder, token, now_ms()))
        return bool(cursor.rowcount > 0)

    def get(self, cursor: Any, key: str) -> tuple[str, int, int] | None:
        cursor.execute(self.GET, (key, now_ms()))
        return _held(cursor.fetchone())


def dialect_for(connection: Any, *, mysql_returning: bool = True) -> LeaseSQL:
    """The lease statements for a Django connection's vendor."""
    vendor = connection.vendor
    if vendor == "postgresql":
        return PostgreSQLLeaseSQL()
    if vendor == "sqlite":
        return SQLiteLeaseSQL()
    if vendor == "mysql":
        if mysql_returning and connection.mysql_is_mariadb:
            return MariaDBLeaseSQL()
        return MySQLLeaseSQL()
    raise ImproperlyConfigured(
        f"The database lease backend supports PostgreSQL, MariaDB/MySQL and SQLite, "
        f"not {vendor!r}. Set PIKKU['LEASE_DATABASE'] to another alias or "
        f"PIKKU['LEASE_BACKEND'] to 'redis' or 'memory'."
    )
