"""The in-memory lease backend's tokens keep rising when its service is rebuilt."""

from __future__ import annotations

import uuid

from django.test import override_settings

from pikku_django.leases import InMemoryLeaseService, LeaseTokens, get_lease_service

HOUR = 60 * 60 * 1000


def test_a_new_service_carries_on_from_the_tokens_of_the_last() -> None:
    key = f"job-{uuid.uuid4().hex}"
    first = InMemoryLeaseService()
    a = first.acquire(key, "a", HOUR)
    assert a is not None
    assert a.token == 1
    # The new service does not know a's lease, but never hands out its token again.
    b = InMemoryLeaseService().acquire(key, "b", HOUR)
    assert b is not None
    assert b.token == a.token + 1
    assert first.refresh(a, HOUR) is not None, "the first service's own lease is untouched"


def test_tokens_keep_rising_when_settings_rebuild_the_service() -> None:
    key = f"job-{uuid.uuid4().hex}"
    tokens = []
    for prefix in ("one:", "two:", "three:"):
        with override_settings(PIKKU={"LEASE_BACKEND": "memory", "LEASE_KEY_PREFIX": prefix}):
            service = get_lease_service()
            assert isinstance(service, InMemoryLeaseService)
            lease = service.acquire(key, "a", HOUR)
            assert lease is not None
            assert service.release(lease)
            tokens.append(lease.token)
    assert tokens == [1, 2, 3]


def test_own_counters_start_again_at_one() -> None:
    key = f"job-{uuid.uuid4().hex}"
    shared = InMemoryLeaseService().acquire(key, "a", HOUR)
    isolated = InMemoryLeaseService(tokens=LeaseTokens()).acquire(key, "a", HOUR)
    assert shared is not None
    assert isolated is not None
    assert (shared.token, isolated.token) == (1, 1)
    assert LeaseTokens().next(key) == 1
