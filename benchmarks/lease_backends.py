"""The stores of ``benchmarks/leases.py``: how each is set up, the lease service measured
on it, its baselines (``lease_baselines.py``), and how both sides are cleaned up."""

from __future__ import annotations

import abc
import importlib.util
import logging
import os
import platform
import socket
import sqlite3
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
import django
from django.conf import settings
from lease_baselines import (
    RAW_TABLE,
    REDIS_LOCK2_PREFIX,
    REDIS_LOCK_PREFIX,
    TTL_MS,
    AdvisoryLockClient,
    Client,
    MySQLdbClient,
    PsycopgClient,
    PythonRedisLockClient,
    RedisLockClient,
    SQLiteClient,
)

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

DATABASE_TARGET = 0.8
REDIS_TARGET = 1.0
REDIS_PREFIX = "pikku:bench:"


class Unavailable(Exception):
    """A backend that cannot run in this benchmark; the message says why."""


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


# --- backends ------------------------------------------------------------------------------


class Backend(abc.ABC):
    """One store: how to set it up, build ours and the baseline, and clean up."""

    name = ""
    title = ""
    #: The baselines' names, the first the one the target is judged against.
    baseline_names: tuple[str, ...] = ()
    target: float | None = None

    def __init__(self) -> None:
        self.service: Any = None
        self.server_version = ""

    @abc.abstractmethod
    def prepare(self) -> None:
        """Connect, create the scratch tables, and build ``self.service``."""

    def ours(self, key: str, holder: str) -> Client:
        return ServiceClient(self.service, key, holder)

    def baseline(self, name: str) -> Callable[[str, str], Client]:
        """A factory of clients doing the same pairs by the baseline ``name`` (one of
        ``baseline_names``; a backend without any is measured on its own)."""
        raise TypeError(f"{self.title} has no baseline to measure against")

    def unavailable_baseline(self, name: str) -> str | None:
        """Why the baseline ``name`` cannot run here, or None."""
        return None

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
    baseline_names = ("raw sqlite3 upsert",)

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

    def baseline(self, name: str) -> Callable[[str, str], Client]:
        return lambda key, holder: SQLiteClient(self.connect, key, holder)


class PostgresBackend(DatabaseBackend):
    name = "postgres"
    title = "PostgreSQL"
    baseline_names = ("raw psycopg upsert", "pg_try_advisory_lock")

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

    def baseline(self, name: str) -> Callable[[str, str], Client]:
        if name == "pg_try_advisory_lock":
            return lambda key, holder: AdvisoryLockClient(self.connect, key, holder)
        return lambda key, holder: PsycopgClient(self.connect, key, holder)


class MariaDBBackend(DatabaseBackend):
    name = "mariadb"
    title = "MariaDB"
    baseline_names = ("raw MySQLdb upsert",)

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

    def baseline(self, name: str) -> Callable[[str, str], Client]:
        return lambda key, holder: MySQLdbClient(self.connect, key, holder)


class RedisBackend(Backend):
    name = "redis"
    title = "Redis"
    baseline_names = ("redis-py Lock", "python-redis-lock")
    target = REDIS_TARGET

    def prepare(self) -> None:
        from django_redis import get_redis_connection

        from pikku_django.leases.redis import RedisLeaseService

        reachable(self.name, URLS[self.name])
        self.client = get_redis_connection(ALIASES[self.name])
        self.server_version = self.client.info("server")["redis_version"]
        self.reset()
        self.service = RedisLeaseService(ALIASES[self.name], prefix=REDIS_PREFIX)

    def baseline(self, name: str) -> Callable[[str, str], Client]:
        if name == "python-redis-lock":
            return lambda key, holder: PythonRedisLockClient(self.client, key, holder)
        return lambda key, holder: RedisLockClient(self.client, key, holder)

    def unavailable_baseline(self, name: str) -> str | None:
        if name == "python-redis-lock" and importlib.util.find_spec("redis_lock") is None:
            return 'python-redis-lock is not installed (pip install -e ".[bench]")'
        return None

    def _keys(self) -> list[bytes]:
        return [
            *self.client.scan_iter(match=REDIS_PREFIX + "*", count=1000),
            *self.client.scan_iter(match=REDIS_LOCK_PREFIX + "*", count=1000),
            *self.client.scan_iter(match=REDIS_LOCK2_PREFIX + "*", count=1000),
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

    def prepare(self) -> None:
        from pikku_django.leases.memory import InMemoryLeaseService

        self.server_version = "n/a (this process)"
        self.service = InMemoryLeaseService()


BACKEND_CLASSES: dict[str, type[Backend]] = {
    cls.name: cls
    for cls in (SQLiteBackend, PostgresBackend, MariaDBBackend, RedisBackend, MemoryBackend)
}


# --- setup ----------------------------------------------------------------------------------


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


def server_settings(name: str, backend: Backend) -> dict[str, str]:
    """What the server does on a commit, recorded beside its figures."""
    from benchlib import mysql_server_settings, pg_server_settings, sqlite_settings

    if name == "postgres":
        return pg_server_settings(URLS["postgres"])
    if name == "mariadb":
        return mysql_server_settings(URLS["mariadb"])
    if name == "sqlite":
        return sqlite_settings(settings.DATABASES["default"]["NAME"])
    if name == "redis":
        info = backend.client.config_get("appendonly") | backend.client.config_get("save")
        return {k: str(v) for k, v in info.items()}
    return {}
