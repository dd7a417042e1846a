"""Lease operations take effect at once, whatever transaction the caller is in."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction
from django.db.transaction import TransactionManagementError

from pikku_django.leases.database import DatabaseLeaseService
from tests.conftest import database_alias, fresh_database_lease_service

HOUR = 3_600_000


class Boom(Exception):
    """Raised to roll a test's atomic block back."""


@pytest.fixture(params=["postgres", "mariadb"])
def service(request: pytest.FixtureRequest) -> DatabaseLeaseService:
    alias = database_alias(request.param)
    svc = fresh_database_lease_service(alias)
    yield svc
    svc.close()


@pytest.mark.django_db(databases="__all__", transaction=True)
def test_lease_taken_in_rolled_back_atomic_block_stays(service: DatabaseLeaseService) -> None:
    with pytest.raises(Boom), transaction.atomic(using=service.using):
        lease = service.acquire("stage", "a", HOUR)
        assert lease is not None
        raise Boom
    assert service.get("stage") == lease


@pytest.mark.django_db(databases="__all__", transaction=True)
@pytest.mark.parametrize("vendor", ["postgres", "mariadb"])
def test_lease_is_visible_to_others_before_the_callers_block_commits(vendor: str) -> None:
    # SQLite has one writer at a time, so there a lease taken after the caller's
    # block has written waits for that block; the servers have no such limit.
    service = fresh_database_lease_service(database_alias(vendor))
    other = DatabaseLeaseService(service.using)
    seen: dict[str, object] = {}

    def contender() -> None:
        seen["acquire"] = other.acquire("stage", "b", HOUR)
        seen["get"] = other.get("stage")

    try:
        with transaction.atomic(using=service.using):
            # The caller's transaction has written something of its own.
            from django.contrib.auth.models import Group

            Group.objects.using(service.using).create(name="in-flight")
            lease = service.acquire("stage", "a", HOUR)
            assert lease is not None
            t = threading.Thread(target=contender)
            t.start()
            # Done while the caller's transaction is still open: nothing waited for it
            # (a row lock would hold the contender until the commit, past this guard).
            t.join(60)
            assert not t.is_alive(), "a lease operation waited for the caller's transaction"
            assert seen["acquire"] is None
            assert seen["get"] == lease
            released = service.release(lease)
            assert released
        assert other.get("stage") is None
    finally:
        other.close()
        service.close()


@pytest.mark.django_db(databases=["default"], transaction=True)
def test_sqlite_refuses_a_lease_inside_an_atomic_block_with_a_clear_error() -> None:
    service = fresh_database_lease_service("default")
    try:
        assert service.acquire("before", "a", HOUR) is not None
        with transaction.atomic(), pytest.raises(TransactionManagementError, match="SQLite"):
            service.acquire("stage", "a", HOUR)
        assert service.get("stage") is None
    finally:
        service.close()
