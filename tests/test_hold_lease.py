"""hold_lease when renewals fail, stall or crash, on a service we can make misbehave."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time

import pytest

from pikku_django.leases import (
    InMemoryLeaseService,
    Lease,
    LeaseLostError,
    LeaseTakenError,
    LeaseTokens,
    hold_lease,
)
from pikku_django.leases.hold import renewal_interval_s

TTL = 600
#: How long a test waits for what it expects before it fails: only a hang takes this long.
GUARD = 60.0


class FlakyLeaseService(InMemoryLeaseService):
    """An in-memory service whose refresh can be made to raise."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_refresh: BaseException | None = None
        self.refreshes = 0
        self.refresh_times: list[float] = []

    def refresh(self, lease: Lease, ttl_ms: int) -> Lease | None:
        self.refreshes += 1
        self.refresh_times.append(time.monotonic())
        if self.fail_refresh is not None:
            raise self.fail_refresh
        return super().refresh(lease, ttl_ms)


def test_renewal_runs_every_third_of_the_ttl() -> None:
    service = FlakyLeaseService()
    with hold_lease("job", service=service, ttl_ms=TTL) as held:
        give_up = time.monotonic() + GUARD
        while service.refreshes < 5:  # renewal after renewal, the lease kept
            assert time.monotonic() < give_up, f"{service.refreshes} renewals, then none"
            time.sleep(0.05)
        assert not held.lost.is_set()
    gaps = [b - a for a, b in itertools.pairwise(service.refresh_times)]
    # Each a third of the TTL after the one before, never sooner (a loaded machine
    # may make one later).
    assert min(gaps) >= renewal_interval_s(TTL) * 0.9, gaps
    assert renewal_interval_s(TTL) == pytest.approx(0.2)


def test_a_failing_renewal_is_not_a_lost_lease() -> None:
    service = FlakyLeaseService()
    with hold_lease("job", service=service, ttl_ms=TTL) as held:
        service.fail_refresh = ConnectionError("store unreachable")
        time.sleep(TTL * 0.5 / 1000)  # one renewal fails, well inside the lease
        assert not held.lost.is_set()
        service.fail_refresh = None
        time.sleep(TTL * 0.5 / 1000)
        assert not held.lost.is_set()
    assert service.get("job") is None


def test_renewals_failing_past_expiry_lose_the_lease(caplog: pytest.LogCaptureFixture) -> None:
    service = FlakyLeaseService()
    with pytest.raises(LeaseLostError), hold_lease("job", service=service, ttl_ms=TTL) as held:
        service.fail_refresh = ConnectionError("store unreachable")
        assert held.lost.wait(3 * TTL / 1000), "renewals failed past expiry but nobody was told"
        service.fail_refresh = None
    assert "lost" in caplog.text


def test_lost_is_not_set_before_the_last_good_expiry() -> None:
    service = FlakyLeaseService()
    with pytest.raises(LeaseLostError), hold_lease("job", service=service, ttl_ms=TTL) as held:
        started = time.monotonic()
        service.fail_refresh = ConnectionError("store unreachable")
        assert held.lost.wait(3 * TTL / 1000)
        assert time.monotonic() - started >= TTL / 1000 * 0.6


def test_a_crashed_renewal_thread_is_reported_and_counts_as_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = FlakyLeaseService()
    caplog.set_level(logging.ERROR, logger="pikku_django")
    with pytest.raises(LeaseLostError), hold_lease("job", service=service, ttl_ms=TTL) as held:
        service.fail_refresh = SystemExit("renewal thread killed")
        assert held.lost.wait(2 * TTL / 1000)
        service.fail_refresh = None
    assert "renewal thread" in caplog.text
    assert service.get("job") is None, "the lease was not released"


def test_release_failure_does_not_hide_the_body_result(caplog: pytest.LogCaptureFixture) -> None:
    class NoRelease(InMemoryLeaseService):
        def release(self, lease: Lease) -> bool:
            raise ConnectionError("store unreachable")

    with hold_lease("job", service=NoRelease(tokens=LeaseTokens()), ttl_ms=TTL) as held:
        token = held.token
    assert token == 1
    assert "lapses by itself" in caplog.text


def test_body_error_wins_over_lost_lease() -> None:
    service = InMemoryLeaseService()
    with pytest.raises(KeyError), hold_lease("job", service=service, ttl_ms=TTL) as held:
        service.release(held.lease)
        raise KeyError("body failed")
    assert service.get("job") is None


def test_default_ttl_and_service_come_from_settings(settings: object) -> None:
    settings.PIKKU = {"LEASE_BACKEND": "memory", "LEASE_TTL_MS": 1234}  # type: ignore[attr-defined]
    from pikku_django.leases import get_lease_service

    with hold_lease("job") as held:
        assert held.ttl_ms == 1234
        assert held.service is get_lease_service()
        assert get_lease_service().get("job") == held.lease
    with pytest.raises(LeaseTakenError):
        get_lease_service().acquire("other", "x", 10_000)
        with hold_lease("other"):
            pytest.fail("hold_lease entered a block on a taken key")


def test_lease_outside_with_block_is_an_error() -> None:
    held = hold_lease("job", service=InMemoryLeaseService())
    with pytest.raises(RuntimeError, match="with block"):
        _ = held.lease


def test_many_holders_only_one_enters() -> None:
    service = InMemoryLeaseService()
    entered: list[int] = []
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        # The others are refused at once.
        with contextlib.suppress(LeaseTakenError), hold_lease("job", service=service, ttl_ms=TTL):
            entered.append(i)
            time.sleep(0.2)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(entered) == 1


def test_function_form_returns_the_body_result() -> None:
    service = InMemoryLeaseService(tokens=LeaseTokens())
    assert hold_lease("job", lambda held: held.token * 10, service=service, ttl_ms=TTL) == 10
    assert service.get("job") is None


def test_function_form_refuses_a_result_made_without_the_lease() -> None:
    service = InMemoryLeaseService()

    def body(held: object) -> str:
        service.release(held.lease)  # type: ignore[attr-defined]
        service.acquire("job", "other", 60_000)
        return "unprotected"

    with pytest.raises(LeaseLostError):
        hold_lease("job", body, service=service, ttl_ms=TTL)


def test_a_short_block_starts_no_renewal_thread() -> None:
    service = FlakyLeaseService()
    with hold_lease("job", service=service, ttl_ms=60_000):
        time.sleep(0.05)
        # This lease's thread only: another test's may still be winding down.
        assert not [t for t in threading.enumerate() if t.name == "pikku-lease:job"]
    assert service.refreshes == 0
    assert service.get("job") is None


def test_vouch_trusts_a_recent_acquire_or_renewal() -> None:
    service = FlakyLeaseService()
    held = hold_lease("job", service=service, ttl_ms=60_000).__enter__()
    held.vouch()
    assert service.refreshes == 0
    service.release(held.lease)
    service.acquire("job", "other", 60_000)
    # Taken behind its back: the next renewal notices, or leaving does.
    held.vouch()
    with pytest.raises(LeaseLostError):
        held.__exit__(None, None, None)
    assert service.get("job").holder == "other"


def test_vouch_asks_the_store_once_the_last_renewal_is_old() -> None:
    service = FlakyLeaseService()
    with pytest.raises(LeaseLostError), hold_lease("job", service=service, ttl_ms=TTL) as held:
        service.fail_refresh = ConnectionError("store unreachable")
        time.sleep(TTL * 0.75 / 1000)
        asked = service.refreshes
        held.vouch()  # the store cannot say; the lease still has a quarter to run
        assert service.refreshes == asked + 1
        service.release(held.lease)
        service.acquire("job", "other", 60_000)
        service.fail_refresh = None
        with pytest.raises(LeaseLostError):
            held.vouch()


class StuckLeaseService(InMemoryLeaseService):
    """An in-memory service whose refresh can be made to hang (a store that stopped
    answering on a connection without a timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.answering = threading.Event()
        self.answering.set()
        #: Set once a refresh is stuck (it returns only when ``answering`` is set again).
        self.stuck = threading.Event()

    def refresh(self, lease: Lease, ttl_ms: int) -> Lease | None:
        if not self.answering.is_set():
            self.stuck.set()
        self.answering.wait()
        return super().refresh(lease, ttl_ms)

    def still_stuck(self) -> bool:
        """Whether a refresh got stuck and has not been let go."""
        return self.stuck.is_set() and not self.answering.is_set()


def test_a_renewal_stuck_past_expiry_loses_the_lease_and_is_not_waited_for() -> None:
    service = StuckLeaseService()
    try:
        with pytest.raises(LeaseLostError), hold_lease("job", service=service, ttl_ms=TTL) as held:
            service.answering.clear()
            # The stuck renewal never returns (until the end of the test): the body is
            # told by the lease's expiry, not by the renewal.
            assert held.lost.wait(GUARD), "a renewal hung and nobody was told"
            assert service.still_stuck()
        # Left with the renewal still stuck: leaving did not wait for it.
        assert service.still_stuck(), "leaving waited for the stuck renewal"
    finally:
        service.answering.set()


def test_a_renewal_slow_inside_the_lease_loses_nothing() -> None:
    service = StuckLeaseService()
    with hold_lease("job", service=service, ttl_ms=TTL) as held:
        time.sleep(renewal_interval_s(TTL) * 1.1)
        service.answering.clear()
        time.sleep(TTL / 1000 / 3)  # well inside the lease the first renewal asked for
        service.answering.set()
        time.sleep(TTL / 1000 / 3)
        assert not held.lost.is_set()
    assert service.get("job") is None


def test_leaving_while_a_renewal_is_stuck_waits_no_longer_than_the_lease() -> None:
    service = StuckLeaseService()
    try:
        with pytest.raises(LeaseLostError), hold_lease("job", service=service, ttl_ms=TTL):
            time.sleep(renewal_interval_s(TTL) * 0.5)
            service.answering.clear()
            assert service.stuck.wait(GUARD)  # the first renewal is under way, stuck
        # Left (at the lease's expiry) while that renewal is still stuck: leaving did
        # not wait for it.
        assert service.still_stuck(), "leaving waited for the stuck renewal"
    finally:
        service.answering.set()
