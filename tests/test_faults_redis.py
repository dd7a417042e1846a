"""hold_lease on Redis through the fault proxy: Redis away (connections reset and
refused) or stalled (accepted, never answered) past the lease."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings

from pikku_django.leases import LeaseLostError, hold_lease
from pikku_django.leases.redis import RedisLeaseService
from pikku_django.testing.leases import unique_prefix
from tests.conftest import require_service
from tests.faultproxy import FaultProxy

TTL = 1_000
#: How long a test waits for what it expects before it fails: only a hang takes this long.
GUARD = 60.0


@pytest.fixture
def prefix() -> Iterator[str]:
    require_service("redis")
    prefix = unique_prefix()
    yield prefix
    client = redis.Redis.from_url(settings.SERVICE_URLS["redis"])
    keys = list(client.scan_iter(match=f"{prefix}*"))
    if keys:
        client.delete(*keys)


@pytest.fixture
def proxy(prefix: str) -> Iterator[FaultProxy]:
    url = urlsplit(settings.SERVICE_URLS["redis"])
    with FaultProxy(url.hostname or "127.0.0.1", url.port or 6379) as proxy:
        yield proxy


def through(proxy: FaultProxy, prefix: str) -> RedisLeaseService:
    """A lease service whose Redis client goes through the proxy (no socket timeout:
    a stalled call waits as long as the stall)."""
    url = urlsplit(settings.SERVICE_URLS["redis"])
    client = redis.Redis(host="127.0.0.1", port=proxy.port, db=int(url.path.strip("/") or 0))
    return RedisLeaseService(client=client, prefix=prefix)


def direct(prefix: str) -> RedisLeaseService:
    return RedisLeaseService(
        client=redis.Redis.from_url(settings.SERVICE_URLS["redis"]), prefix=prefix
    )


def take_when_free(service: RedisLeaseService, key: str, holder: str) -> None:
    deadline = time.monotonic() + GUARD
    while service.acquire(key, holder, 60_000) is None:
        assert time.monotonic() < deadline, "Redis never let the lease go"
        time.sleep(0.01)


@pytest.mark.parametrize("fault", ["outage", "stall"])
def test_hold_lease_reports_the_loss_when_redis_is_away_past_the_lease(
    proxy: FaultProxy, prefix: str, fault: str
) -> None:
    other = direct(prefix)
    with (
        pytest.raises(LeaseLostError),
        hold_lease("job", service=through(proxy, prefix), ttl_ms=TTL) as held,
    ):
        getattr(proxy, fault)()
        # Told while Redis is still away (a stalled renewal never answers): by the
        # lease's expiry, not by an answer.
        assert held.lost.wait(GUARD), "the body was never told"
        take_when_free(other, "job", "other")  # Redis let it go: someone else has it now
        proxy.restore()  # the release can be answered again: it must find the lease gone
    got = other.get("job")
    assert got is not None
    assert got.holder == "other", "the lost holder's release freed its successor's lease"


def test_hold_lease_does_not_vouch_for_a_body_it_cannot_confirm(
    proxy: FaultProxy, prefix: str
) -> None:
    # Redis goes away and stays away: the body ends past the lease, the release
    # cannot be answered, and the result is not vouched for.
    with (
        pytest.raises(LeaseLostError),
        hold_lease("job", service=through(proxy, prefix), ttl_ms=TTL),
    ):
        proxy.outage()
        time.sleep(1.5 * TTL / 1000)


def test_hold_lease_rides_out_a_blip_inside_the_lease(proxy: FaultProxy, prefix: str) -> None:
    # Connections reset once, well inside the lease: renewals carry on, nothing is lost.
    with hold_lease("job", service=through(proxy, prefix), ttl_ms=TTL) as held:
        for _ in range(3):
            proxy.cut()
            time.sleep(TTL / 1000 / 2)
        assert not held.lost.is_set()
        got = direct(prefix).get("job")
        assert got is not None
        assert got.token == held.token
