"""The part of the lease contract that covers :func:`~pikku_django.leases.hold_lease`."""

from __future__ import annotations

import time

import pytest

from pikku_django.leases import LeaseLostError, LeaseService, LeaseTakenError, hold_lease
from pikku_django.testing._lease_support import HOUR, RENEWED, wait_ms


class HoldLeaseContract:
    """What ``hold_lease`` must do over any lease service."""

    def test_hold_lease_hands_body_its_lease_and_frees_key(
        self, lease_service: LeaseService
    ) -> None:
        with hold_lease("stage", service=lease_service) as held:
            seen = held.lease
            assert lease_service.get("stage") == seen
        assert seen.key == "stage"
        assert lease_service.get("stage") is None

    def test_hold_lease_refuses_taken_key(self, lease_service: LeaseService) -> None:
        assert lease_service.acquire("stage", "a", HOUR) is not None
        started = time.monotonic()
        ran = False
        with pytest.raises(LeaseTakenError), hold_lease("stage", service=lease_service):
            ran = True
        assert not ran
        assert time.monotonic() - started < 5, "hold_lease waited for a taken key"
        got = lease_service.get("stage")
        assert got is not None
        assert got.holder == "a"

    def test_hold_lease_frees_key_when_body_raises(self, lease_service: LeaseService) -> None:
        with pytest.raises(RuntimeError, match="boom"), hold_lease("stage", service=lease_service):
            raise RuntimeError("boom")
        assert lease_service.get("stage") is None

    def test_hold_lease_refuses_to_vouch_for_body_that_outlived_lease(
        self, lease_service: LeaseService
    ) -> None:
        with (
            pytest.raises(LeaseLostError),
            hold_lease("stage", service=lease_service, ttl_ms=RENEWED) as held,
        ):
            lease_service.release(held.lease)
            assert lease_service.acquire("stage", "other", HOUR) is not None
            wait_ms(RENEWED)
        got = lease_service.get("stage")
        assert got is not None
        assert got.holder == "other"

    def test_hold_lease_notices_loss_after_last_renewal(self, lease_service: LeaseService) -> None:
        with pytest.raises(LeaseLostError), hold_lease("stage", service=lease_service) as held:
            lease_service.release(held.lease)
            assert lease_service.acquire("stage", "other", HOUR) is not None
            # finished before any renewal ran
        got = lease_service.get("stage")
        assert got is not None
        assert got.holder == "other"

    def test_hold_lease_tells_body_once_lease_is_lost(self, lease_service: LeaseService) -> None:
        told = False
        with (
            pytest.raises(LeaseLostError),
            hold_lease("stage", service=lease_service, ttl_ms=RENEWED) as held,
        ):
            lease_service.release(held.lease)
            assert lease_service.acquire("stage", "other", HOUR) is not None
            told = held.lost.wait(5 * RENEWED / 1000)
        assert told, "the body was never told its lease was gone"

    def test_hold_lease_keeps_lease_alive_past_ttl(self, lease_service: LeaseService) -> None:
        with hold_lease("stage", service=lease_service, ttl_ms=RENEWED) as held:
            first = held.lease
            wait_ms(2 * RENEWED)
            got = lease_service.get("stage")
            assert got is not None, "the lease lapsed mid-body"
            assert got.token == first.token
            assert not held.lost.is_set()
        assert lease_service.get("stage") is None

    def test_hold_lease_rejects_bad_ttl(self, lease_service: LeaseService) -> None:
        with pytest.raises(ValueError, match="ttl_ms"):
            hold_lease("stage", service=lease_service, ttl_ms=0)
        with pytest.raises(ValueError, match="key"):
            hold_lease("", service=lease_service)
        assert lease_service.get("stage") is None
