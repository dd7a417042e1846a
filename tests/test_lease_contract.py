"""The lease conformance suite on every backend: in-memory, SQLite, PostgreSQL,
MariaDB (with and without RETURNING) and Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django_redis import get_redis_connection

from pikku_django.leases import InMemoryLeaseService, LeaseService, LeaseTokens
from pikku_django.leases.redis import RedisLeaseService
from pikku_django.testing.leases import (
    DatabaseServiceFactory,
    LeaseServiceContract,
    RedisServiceFactory,
    SharedLeaseServiceContract,
    StoreClockLeaseContract,
    unique_prefix,
)
from tests.conftest import (
    database_alias,
    db_mark,
    fresh_database_lease_service,
    require_service,
    spawn_settings_dict,
)


class TestInMemoryLeases(LeaseServiceContract):
    @pytest.fixture
    def lease_service(self) -> Iterator[LeaseService]:
        return InMemoryLeaseService(tokens=LeaseTokens())


class DatabaseLeases(SharedLeaseServiceContract):
    vendor = ""
    options: dict[str, object] = {}  # noqa: RUF012

    @pytest.fixture
    def lease_service(self) -> Iterator[LeaseService]:
        alias = database_alias(self.vendor)
        service = fresh_database_lease_service(alias, **self.options)
        yield service
        service.close()

    @pytest.fixture
    def lease_service_factory(self, lease_service: LeaseService) -> DatabaseServiceFactory:
        assert isinstance(lease_service, DatabaseLeaseService)
        return DatabaseServiceFactory(spawn_settings_dict(lease_service.using))


from pikku_django.leases.database import DatabaseLeaseService  # noqa: E402


# SQLite has one writer: a test wrapped in a transaction would hold it, so SQLite
# tests commit as they go. The servers' tests run inside a rolled-back transaction.
@db_mark("sqlite")
class TestSQLiteLeases(DatabaseLeases):
    vendor = "sqlite"


@db_mark("postgres", transaction=False)
class TestPostgreSQLLeases(DatabaseLeases, StoreClockLeaseContract):
    vendor = "postgres"


@db_mark("mariadb", transaction=False)
class TestMariaDBLeases(DatabaseLeases, StoreClockLeaseContract):
    vendor = "mariadb"


@db_mark("mariadb", transaction=False)
class TestMySQLDialectOnMariaDB(DatabaseLeases, StoreClockLeaseContract):
    """The MySQL statements (no RETURNING), run on MariaDB."""

    vendor = "mariadb"
    options = {"mysql_returning": False}  # noqa: RUF012


class TestRedisLeases(SharedLeaseServiceContract, StoreClockLeaseContract):
    @pytest.fixture
    def redis_prefix(self) -> Iterator[str]:
        require_service("redis")
        prefix = unique_prefix()
        yield prefix
        client = get_redis_connection("redis")
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)

    @pytest.fixture
    def lease_service(self, redis_prefix: str) -> Iterator[LeaseService]:
        return RedisLeaseService("redis", prefix=redis_prefix)

    @pytest.fixture
    def lease_service_factory(self, redis_prefix: str) -> RedisServiceFactory:
        return RedisServiceFactory(settings.SERVICE_URLS["redis"], redis_prefix)
