"""The baselines of ``benchmarks/leases.py``: what a careful user could write instead of
pikku_django's lease service, each as a client whose ``pair()`` tries to take its key
and releases it when it won.

* raw upserts (sqlite3, psycopg, MySQLdb with their default settings, autocommit, one
  connection per thread): one conditional upsert that takes the key only when its row
  has lapsed or is the caller's own, judged on the same clock as the service (the
  server's; this process's on SQLite), then one ``UPDATE`` that releases it by key,
  holder and token. Two statements a pair, as the service. They work on
  ``pikku_bench_raw``, a copy of the ``pikku_lease`` table's definition.
* PostgreSQL's ``pg_try_advisory_lock`` / ``pg_advisory_unlock`` on a session of its
  own: no lease (the lock lives as long as the session), no token to fence with.
* Redis: redis-py's own ``Lock`` (``SET NX PX``, its Lua script to release), and
  python-redis-lock's ``Lock`` (``SET NX EX`` with a random id, a Lua release that
  also signals waiters), on the same redis-py client and pool as the service.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

#: Long enough that no lease lapses during a run: every key is freed by release.
TTL_MS = 60_000
#: The baselines' table, a copy of pikku_lease's definition.
RAW_TABLE = "pikku_bench_raw"
REDIS_LOCK_PREFIX = "pikku:bench-lock:"
REDIS_LOCK2_PREFIX = "pikku:bench-lock2:"


class Client(Protocol):
    """One thread's worker: ``pair()`` tries to acquire its key and releases it if won."""

    def pair(self) -> bool: ...

    def close(self) -> None: ...


# --- "ours": the lease service -------------------------------------------------------------


class ServiceClient:
    """acquire, then release if acquired, through a (shared, thread-safe) lease service."""

    def __init__(self, service: Any, key: str, holder: str) -> None:
        self.service = service
        self.key = key
        self.holder = holder

    def pair(self) -> bool:
        lease = self.service.acquire(self.key, self.holder, TTL_MS)
        if lease is None:
            return False
        if not self.service.release(lease):
            raise RuntimeError(f"releasing {lease} failed")
        return True

    def close(self) -> None:
        pass  # the service is shared by every thread and closed with the backend


# --- baselines: raw drivers ----------------------------------------------------------------

# PostgreSQL: psycopg with its defaults (server-side binding; a statement is
# prepared once it has run 5 times). Judged on the server's clock, like ours.
PG_NOW = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
PG_ACQUIRE = f"""
    INSERT INTO {RAW_TABLE} AS r (key, holder, token, expires_at)
    VALUES (%s, %s, 1, {PG_NOW} + %s)
    ON CONFLICT (key) DO UPDATE SET
        holder = EXCLUDED.holder, token = r.token + 1, expires_at = EXCLUDED.expires_at
    WHERE r.expires_at <= {PG_NOW} OR r.holder = EXCLUDED.holder
    RETURNING token
"""
PG_RELEASE = f"UPDATE {RAW_TABLE} SET expires_at = 0 WHERE key = %s AND holder = %s AND token = %s"

# MariaDB: MySQLdb with its defaults. The assignments run left to right, each on
# the row as the previous ones left it: token and holder decide on the old row;
# once holder is ours, expires_at is taken. RETURNING says who holds the key now.
MY_NOW = "FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000)"
MY_TAKE = f"(expires_at <= {MY_NOW} OR holder = VALUES(holder))"
MY_ACQUIRE = f"""
    INSERT INTO {RAW_TABLE} (`key`, holder, token, expires_at)
    VALUES (%s, %s, 1, {MY_NOW} + %s)
    ON DUPLICATE KEY UPDATE
        token = IF({MY_TAKE}, token + 1, token),
        holder = IF({MY_TAKE}, VALUES(holder), holder),
        expires_at = IF({MY_TAKE}, VALUES(expires_at), expires_at)
    RETURNING holder, token
"""
MY_RELEASE = (
    f"UPDATE {RAW_TABLE} SET expires_at = 0 WHERE `key` = %s AND holder = %s AND token = %s"
)

# SQLite: the stdlib sqlite3 module in autocommit, on the same file. Judged on
# this process's clock, like ours. fetchall() steps the statement to its end,
# which is what commits it.
SQLITE_ACQUIRE = f"""
    INSERT INTO {RAW_TABLE} (key, holder, token, expires_at) VALUES (?, ?, 1, ?)
    ON CONFLICT (key) DO UPDATE SET
        holder = excluded.holder, token = token + 1, expires_at = excluded.expires_at
    WHERE expires_at <= ? OR holder = excluded.holder
    RETURNING token
"""
SQLITE_RELEASE = f"UPDATE {RAW_TABLE} SET expires_at = 0 WHERE key = ? AND holder = ? AND token = ?"


class PsycopgClient:
    def __init__(self, connect: Callable[[], Any], key: str, holder: str) -> None:
        self.conn = connect()
        self.cursor = self.conn.cursor()
        self.key = key
        self.holder = holder

    def pair(self) -> bool:
        cursor = self.cursor
        cursor.execute(PG_ACQUIRE, (self.key, self.holder, TTL_MS))
        row = cursor.fetchone()
        if row is None:
            return False
        cursor.execute(PG_RELEASE, (self.key, self.holder, row[0]))
        if cursor.rowcount != 1:
            raise RuntimeError("the raw release found no row")
        return True

    def close(self) -> None:
        self.conn.close()


class MySQLdbClient:
    def __init__(self, connect: Callable[[], Any], key: str, holder: str) -> None:
        self.conn = connect()
        self.cursor = self.conn.cursor()
        self.key = key
        self.holder = holder

    def pair(self) -> bool:
        cursor = self.cursor
        cursor.execute(MY_ACQUIRE, (self.key, self.holder, TTL_MS))
        row = cursor.fetchone()
        if row is None or row[0] != self.holder:
            return False
        cursor.execute(MY_RELEASE, (self.key, self.holder, row[1]))
        if cursor.rowcount != 1:
            raise RuntimeError("the raw release found no row")
        return True

    def close(self) -> None:
        self.conn.close()


class SQLiteClient:
    def __init__(self, connect: Callable[[], Any], key: str, holder: str) -> None:
        self.conn = connect()
        self.cursor = self.conn.cursor()
        self.key = key
        self.holder = holder

    def pair(self) -> bool:
        cursor = self.cursor
        now = int(time.time() * 1000)
        cursor.execute(SQLITE_ACQUIRE, (self.key, self.holder, now + TTL_MS, now))
        rows = cursor.fetchall()
        if not rows:
            return False
        cursor.execute(SQLITE_RELEASE, (self.key, self.holder, rows[0][0]))
        if cursor.rowcount != 1:
            raise RuntimeError("the raw release found no row")
        return True

    def close(self) -> None:
        self.conn.close()


class RedisLockClient:
    """redis-py's Lock: acquire (SET NX PX, never waiting), release (its Lua script)."""

    def __init__(self, client: Any, key: str, holder: str) -> None:
        self.lock = client.lock(REDIS_LOCK_PREFIX + key, timeout=TTL_MS / 1000, blocking=False)

    def pair(self) -> bool:
        lock = self.lock
        if not lock.acquire():
            return False
        lock.release()  # raises LockNotOwnedError if it was not ours any more
        return True

    def close(self) -> None:
        pass  # the client's pool is django-redis's


class AdvisoryLockClient:
    """``pg_try_advisory_lock`` on a 64-bit key from the name, then ``pg_advisory_unlock``."""

    def __init__(self, connect: Callable[[], Any], key: str, holder: str) -> None:
        self.conn = connect()
        self.cursor = self.conn.cursor()
        self.lock_id = zlib.crc32(key.encode())

    def pair(self) -> bool:
        cursor = self.cursor
        cursor.execute("SELECT pg_try_advisory_lock(%s)", (self.lock_id,))
        if not cursor.fetchone()[0]:
            return False
        cursor.execute("SELECT pg_advisory_unlock(%s)", (self.lock_id,))
        if not cursor.fetchone()[0]:
            raise RuntimeError("pg_advisory_unlock found no lock held")
        return True

    def close(self) -> None:
        self.conn.close()


class PythonRedisLockClient:
    """python-redis-lock's Lock: acquire without waiting, then release."""

    def __init__(self, client: Any, key: str, holder: str) -> None:
        import redis_lock

        self.lock = redis_lock.Lock(client, REDIS_LOCK2_PREFIX + key, expire=TTL_MS // 1000)

    def pair(self) -> bool:
        lock = self.lock
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    def close(self) -> None:
        pass  # the client's pool is django-redis's
