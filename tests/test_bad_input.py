"""Any key or holder a caller passes either round-trips exactly or is refused clearly."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pikku_django.leases import InMemoryLeaseService, LeaseService
from pikku_django.leases.base import MAX_KEY_LENGTH
from tests.conftest import database_alias, fresh_database_lease_service, require_service

pytestmark = pytest.mark.django_db(databases="__all__", transaction=True)

HOUR = 3_600_000
# Any text without NUL (which no backend can store) up to the column length.
names = st.text(
    alphabet=st.characters(exclude_characters="\x00", exclude_categories=["Cs"]),
    min_size=1,
    max_size=MAX_KEY_LENGTH - 40,
)


@pytest.fixture(params=["memory", "sqlite", "postgres", "mariadb", "redis"])
def service(request: pytest.FixtureRequest) -> LeaseService:
    if request.param == "memory":
        yield InMemoryLeaseService()
        return
    if request.param == "redis":
        require_service("redis")
        from pikku_django.leases.redis import RedisLeaseService

        yield RedisLeaseService("redis", prefix=f"pikku-fuzz:{uuid.uuid4().hex}:")
        return
    svc = fresh_database_lease_service(database_alias(request.param))
    yield svc
    svc.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=names, holder=names)
def test_any_key_and_holder_round_trip(service: LeaseService, key: str, holder: str) -> None:
    key = f"{uuid.uuid4().hex}{key}"  # examples must not see each other's leases
    lease = service.acquire(key, holder, HOUR)
    assert lease is not None
    assert (lease.key, lease.holder) == (key, holder)
    assert service.get(key) == lease
    assert service.acquire(key, holder + "-other", HOUR) is None
    assert service.release(lease)
    assert service.get(key) is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ttl=st.one_of(st.integers(max_value=0), st.floats(), st.text(), st.none(), st.booleans()))
def test_bad_ttl_is_refused_and_changes_nothing(service: LeaseService, ttl: object) -> None:
    key = uuid.uuid4().hex
    with pytest.raises(ValueError, match="ttl_ms"):
        service.acquire(key, "a", ttl)  # type: ignore[arg-type]
    assert service.get(key) is None
