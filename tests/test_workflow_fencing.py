"""The step-fencing conformance suite on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import pytest

from pikku_django.leases import InMemoryLeaseService
from pikku_django.testing.workflows import WorkflowFencingContract
from pikku_django.workflows import FakeClock, WorkflowEngine
from tests.conftest import database_alias, db_mark


class FencingOn(WorkflowFencingContract):
    vendor = ""

    @pytest.fixture
    def fencing_engine(self) -> WorkflowEngine:
        return WorkflowEngine(
            database_alias(self.vendor), leases=InMemoryLeaseService(), clock=FakeClock()
        )


@db_mark("sqlite")
class TestFencingSQLite(FencingOn):
    vendor = "sqlite"


@db_mark("postgres")
class TestFencingPostgreSQL(FencingOn):
    vendor = "postgres"


@db_mark("mariadb")
class TestFencingMariaDB(FencingOn):
    vendor = "mariadb"
