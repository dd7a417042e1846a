"""The step-fencing conformance suite on SQLite, PostgreSQL and MariaDB, through each
database's own store and through the generic ORM store."""

from __future__ import annotations

import pytest

from pikku_django.leases import InMemoryLeaseService
from pikku_django.testing.workflows import WorkflowFencingContract
from pikku_django.workflows import FakeClock, WorkflowEngine
from pikku_django.workflows import engine as engine_module
from pikku_django.workflows.store import OrmStore
from tests.conftest import database_alias, db_mark


class FencingOn(WorkflowFencingContract):
    vendor = ""
    #: Whether the engine runs on the generic ORM store rather than the vendor's own.
    generic = False

    @pytest.fixture
    def fencing_engine(self, monkeypatch: pytest.MonkeyPatch) -> WorkflowEngine:
        if self.generic:
            monkeypatch.setattr(engine_module, "store_for", OrmStore)
        engine = WorkflowEngine(
            database_alias(self.vendor), leases=InMemoryLeaseService(), clock=FakeClock()
        )
        assert (type(engine.store) is OrmStore) is self.generic
        return engine


@db_mark("sqlite")
class TestFencingSQLite(FencingOn):
    vendor = "sqlite"


@db_mark("postgres")
class TestFencingPostgreSQL(FencingOn):
    vendor = "postgres"


@db_mark("mariadb")
class TestFencingMariaDB(FencingOn):
    vendor = "mariadb"


@db_mark("sqlite")
class TestFencingOrmSQLite(FencingOn):
    vendor = "sqlite"
    generic = True


@db_mark("postgres")
class TestFencingOrmPostgreSQL(FencingOn):
    vendor = "postgres"
    generic = True


@db_mark("mariadb")
class TestFencingOrmMariaDB(FencingOn):
    vendor = "mariadb"
    generic = True
