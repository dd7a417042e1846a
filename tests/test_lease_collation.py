"""Migration 0010: lease keys and holders compared byte for byte on MariaDB, also on a
table whose collation folds case and pads (the server's default)."""

from __future__ import annotations

from django.core.management import call_command
from django.db import connections

from tests.conftest import database_alias, fresh_database_lease_service, on_databases

HOUR = 60 * 60 * 1000


def column_collations(alias: str) -> dict[str, str]:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = 'pikku_lease' "
            "AND column_name IN ('key', 'holder')"
        )
        return {name.lower(): collation for name, collation in cursor.fetchall()}


def fold_case_and_pad(alias: str) -> None:
    """Give the lease table the server's default collation, as a database made without
    one would have."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "ALTER TABLE pikku_lease CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
        )


@on_databases("mariadb", transaction=True)
def test_lease_columns_are_binary_without_padding(vendor: str) -> None:
    alias = database_alias(vendor)
    assert column_collations(alias) == {"key": "utf8mb4_nopad_bin", "holder": "utf8mb4_nopad_bin"}


@on_databases("mariadb", transaction=True)
def test_migration_makes_a_folding_table_exact_and_reverses(vendor: str) -> None:
    alias = database_alias(vendor)
    call_command("migrate", "pikku_django", "0009", database=alias, verbosity=0)
    try:
        fold_case_and_pad(alias)
        assert column_collations(alias) == {
            "key": "utf8mb4_general_ci",
            "holder": "utf8mb4_general_ci",
        }
        service = fresh_database_lease_service(alias)
        try:
            a = service.acquire("k", "worker-a", HOUR)
            # What the migration is for: here two holders share one lease.
            assert a is not None
            assert service.acquire("k", "WORKER-A", HOUR) is not None
        finally:
            service.close()
    finally:
        call_command("migrate", "pikku_django", database=alias, verbosity=0)
    assert column_collations(alias) == {"key": "utf8mb4_nopad_bin", "holder": "utf8mb4_nopad_bin"}
    service = fresh_database_lease_service(alias)
    try:
        a = service.acquire("k", "worker-a", HOUR)
        assert a is not None
        assert service.acquire("k", "WORKER-A", HOUR) is None
        assert service.acquire("k ", "worker-a", HOUR) is not None
        assert service.get("k") == a
    finally:
        service.close()
