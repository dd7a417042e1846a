"""The models and their migrations agree, and the latest migration reverses."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connections

from tests.conftest import database_alias, on_databases


@pytest.mark.django_db
def test_no_missing_migrations() -> None:
    call_command("makemigrations", "pikku_django", "--check", "--dry-run", verbosity=0)


def _settled_indexes(alias: str) -> set[str]:
    connection = connections[alias]
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, "pikku_workflow_run")
    return {name for name in found if name.startswith("pikku_run_settled")}


@on_databases("sqlite", "postgres", "mariadb")
def test_the_settled_run_indexes_migrate_and_reverse(vendor: str) -> None:
    alias = database_alias(vendor)
    # MariaDB has no partial indexes: the composite one serves pruning there.
    expected = {"pikku_run_settled_status"}
    if vendor != "mariadb":
        expected.add("pikku_run_settled")
    assert _settled_indexes(alias) == expected
    call_command("migrate", "pikku_django", "0022", database=alias, verbosity=0)
    try:
        assert _settled_indexes(alias) == set()
    finally:
        call_command("migrate", "pikku_django", database=alias, verbosity=0)
    assert _settled_indexes(alias) == expected
