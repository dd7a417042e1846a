"""Lease throughput: pikku_django's lease backends against a raw baseline on the same server.

For each backend (SQLite, PostgreSQL, MariaDB, Redis, and the in-memory one for
information) it measures acquire+release *pairs per second* in three cases:

* ``1 client``          one thread, one key: the latency of a pair, inverted.
* ``8 clients, 1 key``  eight threads fighting over one key. Most acquires fail
                        because someone else holds the key, so a "pair" here is
                        one acquire *attempt*, plus its release when it won.
* ``8 clients, 8 keys`` eight threads, a key each: every acquire wins.

Each figure stands next to a baseline measured in the same run, on the same
server, doing the same job with nothing of ours in the way:

* SQLite, PostgreSQL, MariaDB: a raw driver connection (sqlite3, psycopg,
  MySQLdb with their default settings, autocommit, one connection and cursor
  per thread) running one conditional upsert that takes the key only when its
  row has lapsed or is the caller's own, judged on the same clock as ours
  (the server's; this process's on SQLite), then one ``UPDATE`` that releases
  it by key, holder and token. Two statements a pair, as ours. It works on
  ``pikku_bench_raw``, a copy of the ``pikku_lease`` table's definition.
* Redis: redis-py's own ``Lock`` (``SET NX PX`` to acquire, its Lua script to
  release) on the same redis-py client and connection pool as ours.

The ratio is ours / baseline. Targets: a database backend makes at least 0.8
of its raw upsert's pairs per second, Redis at least 1.0 of redis-py's Lock.

Each figure is ``--seconds`` of timed work, cut into slices run in the order
baseline, ours, ours, baseline, repeated ``--rounds`` times; every slice starts
its threads afresh and runs a short untimed warm-up first. Interleaving keeps a
server that speeds up or slows down during the run (or SQLite's lock waits,
which swing a lot from one second to the next) from favouring either side.

Run it with ``make bench`` (``.venv/bin/python benchmarks/leases.py``). Options:
``--seconds 2`` timed per figure and side, ``--backends sqlite,postgres,mariadb,redis,memory``
(any subset), ``--rounds 4``, ``--warmup 0.1``. The default run takes about 80 s.
It needs no settings module: it configures Django itself, creates the scratch
databases ``pikku_bench`` on PostgreSQL and MariaDB when missing, migrates
pikku_django into them, and uses a temporary SQLite file in WAL mode. The
services default to the local ones; point it elsewhere with

    PIKKU_BENCH_POSTGRES_URL  default postgres://postgres@127.0.0.1:5432/pikku_bench
    PIKKU_BENCH_MARIADB_URL   default mysql://root@127.0.0.1:3306/pikku_bench
    PIKKU_BENCH_REDIS_URL     default redis://127.0.0.1:6379/15

A service that cannot be reached is reported as skipped. Progress goes to
stderr; stdout gets the table and, as its last line, one JSON object with every
figure and the machine, Python, Django and server versions.
"""

from __future__ import annotations

import abc
import argparse
import json
import logging
import os
import platform
import shutil
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import dj_database_url
import django
from django.conf import settings

log = logging.getLogger("pikku.bench")

BACKENDS = ("sqlite", "postgres", "mariadb", "redis", "memory")
DEFAULT_URLS = {
    "postgres": "postgres://postgres@127.0.0.1:5432/pikku_bench",
    "mariadb": "mysql://root@127.0.0.1:3306/pikku_bench",
    "redis": "redis://127.0.0.1:6379/15",
}
ENV_VARS = {
    "postgres": "PIKKU_BENCH_POSTGRES_URL",
    "mariadb": "PIKKU_BENCH_MARIADB_URL",
    "redis": "PIKKU_BENCH_REDIS_URL",
}
DEFAULT_PORTS = {"postgres": 5432, "mariadb": 3306, "redis": 6379}
URLS = {name: os.environ.get(ENV_VARS[name], url) for name, url in DEFAULT_URLS.items()}
#: DATABASES / CACHES alias of each backend.
ALIASES = {"sqlite": "default", "postgres": "postgres", "mariadb": "mariadb", "redis": "redis"}

THREADS = 8
#: Long enough that no lease lapses during a run: every key is freed by release.
TTL_MS = 60_000
DATABASE_TARGET = 0.8
REDIS_TARGET = 1.0
#: The baseline's table, a copy of pikku_lease's definition.
RAW_TABLE = "pikku_bench_raw"
REDIS_PREFIX = "pikku:bench:"
REDIS_LOCK_PREFIX = "pikku:bench-lock:"


class Unavailable(Exception):
    """A backend that cannot run in this benchmark; the message says why."""


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


# --- backends ------------------------------------------------------------------------------


class Backend(abc.ABC):
    """One store: how to set it up, build ours and the baseline, and clean up."""

    name = ""
    title = ""
    baseline_name = ""
    target: float | None = None

    def __init__(self) -> None:
        self.service: Any = None
        self.server_version = ""

    @abc.abstractmethod
    def prepare(self) -> None:
        """Connect, create the scratch tables, and build ``self.service``."""

    def ours(self, key: str, holder: str) -> Client:
        return ServiceClient(self.service, key, holder)

    def baseline(self, key: str, holder: str) -> Client:
        """A client doing the same pairs with the backend's own raw means (backends
        with a ``baseline_name`` have one; the others are measured on their own)."""
        raise TypeError(f"{self.title} has no baseline to measure against")

    def reset(self) -> None:  # noqa: B027  (optional: most backends start each case fresh)
        """Forget every lease of both sides."""

    def still_held(self) -> int:
        """How many leases of either side are still held (0 after a clean case)."""
        return 0

    def close(self) -> None:
        if self.service is not None:
            self.service.close()


def reachable(name: str, url: str) -> None:
    """Raise Unavailable unless something listens at ``url``'s host and port."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORTS[name]
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        raise Unavailable(
            f"not reachable at {host}:{port} ({exc}); start it or set {ENV_VARS[name]}"
        ) from exc


class DatabaseBackend(Backend):
    target = DATABASE_TARGET

    def __init__(self) -> None:
        super().__init__()
        self.alias = ALIASES[self.name]

    def migrate(self) -> None:
        from django.core.management import call_command

        call_command("migrate", "pikku_django", database=self.alias, verbosity=0)

    def start_service(self) -> None:
        from pikku_django.leases.database import DatabaseLeaseService

        self.service = DatabaseLeaseService(self.alias)

    def execute(self, sql: str) -> list[Any]:
        """Run one statement on Django's own connection to the alias (setup only)."""
        from django.db import connections

        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql)
            return list(cursor.fetchall()) if cursor.description else []

    def reset(self) -> None:
        self.execute("DELETE FROM pikku_lease")
        self.execute(f"DELETE FROM {RAW_TABLE}")

    def still_held(self) -> int:
        return sum(
            self.execute(f"SELECT COUNT(*) FROM {table} WHERE expires_at > 0")[0][0]
            for table in ("pikku_lease", RAW_TABLE)
        )

    def close(self) -> None:
        from django.db import connections

        super().close()
        connections[self.alias].close()


class SQLiteBackend(DatabaseBackend):
    name = "sqlite"
    title = "SQLite"
    baseline_name = "raw sqlite3 upsert"

    def prepare(self) -> None:
        self.path = settings.DATABASES[self.alias]["NAME"]
        self.migrate()
        [(create,)] = self.execute("SELECT sql FROM sqlite_master WHERE name = 'pikku_lease'")
        self.execute(f'DROP TABLE IF EXISTS "{RAW_TABLE}"')
        self.execute(create.replace('"pikku_lease"', f'"{RAW_TABLE}"', 1))
        [(mode,)] = self.execute("PRAGMA journal_mode")
        if mode.lower() != "wal":
            raise Unavailable(f"the SQLite file is in {mode} mode, not WAL")
        self.server_version = sqlite3.sqlite_version
        self.start_service()

    def connect(self) -> Any:
        conn = sqlite3.connect(self.path, timeout=20, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def baseline(self, key: str, holder: str) -> Client:
        return SQLiteClient(self.connect, key, holder)


class PostgresBackend(DatabaseBackend):
    name = "postgres"
    title = "PostgreSQL"
    baseline_name = "raw psycopg upsert"

    def prepare(self) -> None:
        import psycopg
        from psycopg import sql

        reachable(self.name, URLS[self.name])
        db = settings.DATABASES[self.alias]
        self.params = {
            key: db[field]
            for key, field in (("host", "HOST"), ("port", "PORT"), ("user", "USER"))
            if db[field]
        }
        if db["PASSWORD"]:
            self.params["password"] = db["PASSWORD"]
        self.params["connect_timeout"] = 5
        self.dbname = db["NAME"]
        with psycopg.connect(dbname="postgres", autocommit=True, **self.params) as admin:
            found = admin.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.dbname,)
            ).fetchone()
            if found is None:
                log.info("postgres: creating database %s", self.dbname)
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.dbname)))
        self.migrate()
        self.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        self.execute(f"CREATE TABLE {RAW_TABLE} (LIKE pikku_lease INCLUDING ALL)")
        self.server_version = self.execute("SHOW server_version")[0][0]
        self.start_service()

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(dbname=self.dbname, autocommit=True, **self.params)

    def baseline(self, key: str, holder: str) -> Client:
        return PsycopgClient(self.connect, key, holder)


class MariaDBBackend(DatabaseBackend):
    name = "mariadb"
    title = "MariaDB"
    baseline_name = "raw MySQLdb upsert"

    def prepare(self) -> None:
        import MySQLdb

        reachable(self.name, URLS[self.name])
        db = settings.DATABASES[self.alias]
        self.params = {
            key: db[field]
            for key, field in (("host", "HOST"), ("port", "PORT"), ("user", "USER"))
            if db[field]
        }
        if db["PASSWORD"]:
            self.params["password"] = db["PASSWORD"]
        self.params.update(charset="utf8mb4", connect_timeout=5, autocommit=True)
        self.dbname = db["NAME"]
        admin = MySQLdb.connect(**self.params)
        try:
            cursor = admin.cursor()
            cursor.execute(
                f"CREATE DATABASE IF NOT EXISTS `{self.dbname}` "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
            cursor.execute("SELECT VERSION()")
            self.server_version = cursor.fetchone()[0]
        finally:
            admin.close()
        if "mariadb" not in self.server_version.lower():
            raise Unavailable(f"{self.server_version} is MySQL, not MariaDB (no RETURNING)")
        self.migrate()
        self.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        self.execute(f"CREATE TABLE {RAW_TABLE} LIKE pikku_lease")
        self.start_service()

    def connect(self) -> Any:
        import MySQLdb

        return MySQLdb.connect(database=self.dbname, **self.params)

    def baseline(self, key: str, holder: str) -> Client:
        return MySQLdbClient(self.connect, key, holder)


class RedisBackend(Backend):
    name = "redis"
    title = "Redis"
    baseline_name = "redis-py Lock"
    target = REDIS_TARGET

    def prepare(self) -> None:
        from django_redis import get_redis_connection

        from pikku_django.leases.redis import RedisLeaseService

        reachable(self.name, URLS[self.name])
        self.client = get_redis_connection(ALIASES[self.name])
        self.server_version = self.client.info("server")["redis_version"]
        self.reset()
        self.service = RedisLeaseService(ALIASES[self.name], prefix=REDIS_PREFIX)

    def baseline(self, key: str, holder: str) -> Client:
        return RedisLockClient(self.client, key, holder)

    def _keys(self) -> list[bytes]:
        return [
            *self.client.scan_iter(match=REDIS_PREFIX + "*", count=1000),
            *self.client.scan_iter(match=REDIS_LOCK_PREFIX + "*", count=1000),
        ]

    def reset(self) -> None:
        keys = self._keys()
        if keys:
            self.client.delete(*keys)

    def still_held(self) -> int:
        # Token counters (":token") outlive their leases by design.
        return sum(1 for key in self._keys() if not key.endswith(b":token"))


class MemoryBackend(Backend):
    name = "memory"
    title = "in-memory"
    baseline_name = ""

    def prepare(self) -> None:
        from pikku_django.leases.memory import InMemoryLeaseService

        self.server_version = "n/a (this process)"
        self.service = InMemoryLeaseService()


BACKEND_CLASSES: dict[str, type[Backend]] = {
    cls.name: cls
    for cls in (SQLiteBackend, PostgresBackend, MariaDBBackend, RedisBackend, MemoryBackend)
}


# --- measurement ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """``threads`` clients; ``shared_key`` puts them all on one key, else one key each."""

    label: str
    threads: int
    shared_key: bool

    def key(self, i: int) -> str:
        if self.threads == 1:
            return "bench-single"
        return "bench-shared" if self.shared_key else f"bench-{i}"


# What each figure measures, for ours and the baseline alike ("pairs/s" = calls of
# a client's pair() completed per second, summed over its threads):
# * 1 client: one thread, one key; every acquire wins, so each pair is an acquire
#   and a release, i.e. two statements (two Redis calls) back to back: latency.
# * 8 clients, 1 key: all threads on one key. A pair is an acquire *attempt*
#   plus, only when it won, the release; most attempts lose (one statement or
#   call, and on a database a wait for the row lock of the winner's upsert), so
#   this is the rate a crowd can poll a busy key. The JSON's acquired_per_s says
#   how many attempts won.
# * 8 clients, 8 keys: a key per thread; every acquire wins. This is throughput
#   with no lease contention, bound by the server, the client's CPU and the GIL.
CASES = (
    Case("1 client", 1, shared_key=False),
    Case(f"{THREADS} clients, 1 key", THREADS, shared_key=True),
    Case(f"{THREADS} clients, {THREADS} keys", THREADS, shared_key=False),
)


@dataclass
class Tally:
    """Pairs attempted, and won, over the timed seconds of one or more segments."""

    pairs: int = 0
    won: int = 0
    seconds: float = 0.0

    def add(self, other: Tally) -> None:
        self.pairs += other.pairs
        self.won += other.won
        self.seconds += other.seconds

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.seconds if self.seconds else 0.0

    @property
    def won_per_s(self) -> float:
        return self.won / self.seconds if self.seconds else 0.0


def run_segment(
    make_client: Callable[[str, str], Client], case: Case, seconds: float, warmup: float
) -> Tally:
    """Run ``case.threads`` clients flat out; count the pairs of the timed ``seconds``.

    Every thread builds its client (and, for a baseline, opens its connection)
    before the start line, then loops ``pair()`` until told to stop. The clock
    starts after ``warmup`` and reads the threads' counters at both ends, so
    thread start-up, connecting and the first (cold) calls are never timed.
    """
    n = case.threads
    pairs = [0] * n
    won = [0] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n + 1)
    stop = threading.Event()

    def work(i: int) -> None:
        client = None
        try:
            client = make_client(case.key(i), f"holder-{i}")
            start.wait()
            pair = client.pair
            while not stop.is_set():
                if pair():
                    won[i] += 1
                pairs[i] += 1
        except threading.BrokenBarrierError:
            return  # another client failed and aborted the start; its error is recorded
        except BaseException as exc:
            errors.append(exc)
            start.abort()
        finally:
            if client is not None:
                client.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    try:
        start.wait()
        time.sleep(warmup)
        pairs0, won0, t0 = sum(pairs), sum(won), time.perf_counter()
        time.sleep(seconds)
        pairs1, won1, t1 = sum(pairs), sum(won), time.perf_counter()
    except threading.BrokenBarrierError:
        pairs0 = won0 = pairs1 = won1 = 0
        t0 = t1 = 0.0
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    return Tally(pairs1 - pairs0, won1 - won0, t1 - t0)


@dataclass
class Result:
    backend: Backend
    case: Case
    ours: Tally
    baseline: Tally | None

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or not self.baseline.pairs_per_s:
            return None
        return self.ours.pairs_per_s / self.baseline.pairs_per_s

    @property
    def met(self) -> bool | None:
        if self.ratio is None or self.backend.target is None:
            return None
        return self.ratio >= self.backend.target

    def as_json(self) -> dict[str, Any]:
        def figures(tally: Tally | None) -> dict[str, Any] | None:
            if tally is None:
                return None
            return {
                "pairs_per_s": round(tally.pairs_per_s, 1),
                "acquired_per_s": round(tally.won_per_s, 1),
                "pairs": tally.pairs,
                "acquired": tally.won,
                "seconds": round(tally.seconds, 3),
            }

        return {
            "backend": self.backend.name,
            "case": self.case.label,
            "threads": self.case.threads,
            "distinct_keys": 1 if self.case.shared_key else self.case.threads,
            "ours": figures(self.ours),
            "baseline_kind": self.backend.baseline_name or None,
            "baseline": figures(self.baseline),
            "ratio": None if self.ratio is None else round(self.ratio, 3),
            "target": self.backend.target,
            "met": self.met,
        }


def run_case(backend: Backend, case: Case, seconds: float, warmup: float, rounds: int) -> Result:
    """Ours and the baseline on one case, ``seconds`` each, in interleaved slices.

    The slices run baseline, ours, ours, baseline, ``rounds`` times over, so
    each side gets ``seconds`` in all and any drift in the server's speed lands
    on both sides alike.
    """
    backend.reset()
    ours = Tally()
    if not backend.baseline_name:
        ours.add(run_segment(backend.ours, case, seconds, warmup))
        return Result(backend, case, ours, None)
    baseline = Tally()
    piece = seconds / (2 * rounds)
    for side in ("baseline", "ours", "ours", "baseline") * rounds:
        if side == "ours":
            ours.add(run_segment(backend.ours, case, piece, warmup))
        else:
            baseline.add(run_segment(backend.baseline, case, piece, warmup))
    held = backend.still_held()
    if held:
        log.warning("%s / %s: %d leases still held afterwards", backend.name, case.label, held)
    backend.reset()
    return Result(backend, case, ours, baseline)


# --- setup and report ----------------------------------------------------------------------


def configure_django(sqlite_path: Path) -> None:
    """Settings for this script alone: every service under its alias, pikku_django installed."""
    databases: dict[str, Any] = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(sqlite_path),
            "OPTIONS": {"timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"},
        }
    }
    postgres = dj_database_url.parse(URLS["postgres"])
    postgres["OPTIONS"] = {"connect_timeout": 5}
    mariadb = dj_database_url.parse(URLS["mariadb"])
    mariadb["OPTIONS"] = {"charset": "utf8mb4", "connect_timeout": 5}
    databases |= {ALIASES["postgres"]: postgres, ALIASES["mariadb"]: mariadb}
    settings.configure(
        DEBUG=False,
        USE_TZ=True,
        TIME_ZONE="UTC",
        SECRET_KEY="pikku-bench-not-secret",  # noqa: S106
        INSTALLED_APPS=["pikku_django"],
        DATABASES=databases,
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            ALIASES["redis"]: {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": URLS["redis"],
                "OPTIONS": {
                    "CLIENT_CLASS": "django_redis.client.DefaultClient",
                    "SOCKET_CONNECT_TIMEOUT": 5,
                    "SOCKET_TIMEOUT": 30,
                },
            },
        },
        PIKKU={"LEASE_BACKEND": "memory"},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def versions() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "django": django.get_version(),
    }
    for dist in ("pikku-django", "psycopg", "mysqlclient", "redis", "django-redis"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    info["sqlite3_library"] = sqlite3.sqlite_version
    return info


def format_table(results: list[Result], skipped: dict[str, str]) -> str:
    header = ("backend", "case", "ours pairs/s", "baseline pairs/s", "ratio", "target", "met")
    rows = [header]
    for r in results:
        rows.append(
            (
                r.backend.title,
                r.case.label,
                f"{r.ours.pairs_per_s:,.0f}",
                "-" if r.baseline is None else f"{r.baseline.pairs_per_s:,.0f}",
                "-" if r.ratio is None else f"{r.ratio:.2f}",
                "info" if r.backend.target is None else f">= {r.backend.target:.1f}",
                {None: "-", True: "yes", False: "NO"}[r.met],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    right = {2, 3, 4}

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in rows[1:]]
    for name, reason in skipped.items():
        out.append(f"{BACKEND_CLASSES[name].title}: skipped, {reason}")
    baselines = {r.backend.title: r.backend.baseline_name for r in results if r.baseline}
    if baselines:
        out.append("")
        out.append("baselines: " + "; ".join(f"{k}: {v}" for k, v in baselines.items()))
    out.append(
        f"a pair is one acquire attempt plus its release when it won; in the "
        f"{THREADS}-clients-1-key case most attempts lose and are one statement / call"
    )
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=2.0,
        help="timed seconds per figure, for ours and for the baseline each (default 2)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.1,
        help="untimed seconds at the start of every slice (default 0.1)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="times the baseline, ours, ours, baseline slices repeat (default 4)",
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help=f"comma-separated, from {','.join(BACKENDS)} (default: all)",
    )
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backends {unknown}; choose from {', '.join(BACKENDS)}")
    if args.seconds <= 0 or args.warmup < 0 or args.rounds < 1:
        parser.error("--seconds must be > 0, --warmup >= 0 and --rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[bench] %(message)s")
    tmp = Path(tempfile.mkdtemp(prefix="pikku-bench-"))
    configure_django(tmp / "leases.sqlite3")

    results: list[Result] = []
    skipped: dict[str, str] = {}
    servers: dict[str, str] = {}
    began = time.perf_counter()
    try:
        for name in args.backends:
            backend = BACKEND_CLASSES[name]()
            try:
                log.info("%s: setting up", name)
                backend.prepare()
                servers[name] = backend.server_version
                for case in CASES:
                    log.info("%s: %s", name, case.label)
                    result = run_case(backend, case, args.seconds, args.warmup, args.rounds)
                    log.info(
                        "%s: %s: ours %.0f pairs/s, baseline %s, ratio %s",
                        name,
                        case.label,
                        result.ours.pairs_per_s,
                        "-" if result.baseline is None else f"{result.baseline.pairs_per_s:.0f}",
                        "-" if result.ratio is None else f"{result.ratio:.2f}",
                    )
                    results.append(result)
            except Exception as exc:
                # Unreachable, or failed part-way: report it and go on with the next.
                why = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
                skipped[name] = why.strip()
                log.warning("%s: skipped: %s", name, skipped[name])
                results = [r for r in results if r.backend is not backend]
            finally:
                try:
                    backend.close()
                except Exception:
                    log.debug("closing %s failed", name, exc_info=True)
    finally:
        from django.db import connections

        connections.close_all()
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("done in %.0f s", time.perf_counter() - began)

    judged = [r for r in results if r.met is not None]
    all_met = all(r.met for r in judged) if judged else None
    print(format_table(results, skipped))
    missed = [f"{r.backend.title} / {r.case.label}" for r in judged if not r.met]
    if all_met is None:
        print("targets: none measured")
    else:
        print("targets: " + ("all met" if all_met else "MISSED: " + ", ".join(missed)))
    report = {
        "benchmark": "pikku_django leases: acquire+release pairs per second",
        "settings": {
            "seconds": args.seconds,
            "warmup_seconds": args.warmup,
            "rounds": args.rounds,
            "threads": THREADS,
            "ttl_ms": TTL_MS,
            "targets": {"database": DATABASE_TARGET, "redis": REDIS_TARGET},
        },
        "machine": versions(),
        "servers": servers,
        "skipped": skipped,
        "results": [r.as_json() for r in results],
        "all_targets_met": all_met,
    }
    print(json.dumps(report, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
