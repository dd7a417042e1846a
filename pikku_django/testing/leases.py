"""A conformance suite for lease services, reusable by any backend.

Subclass the contracts in a test module, under a name pytest collects, and give
them a ``lease_service`` fixture that yields a fresh, empty service::

    class TestMyLeases(SharedLeaseServiceContract, StoreClockLeaseContract):
        @pytest.fixture
        def lease_service(self):
            yield MyLeaseService(...)

        @pytest.fixture
        def lease_service_factory(self):
            return MyFactory(...)  # picklable; builds the same store in a new process

:class:`LeaseServiceContract` covers every behaviour of a lease service;
:class:`SharedLeaseServiceContract` adds separate processes racing for a key,
and :class:`StoreClockLeaseContract` a holder whose clock runs an hour fast.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pikku_django.leases import Lease, LeaseService
from pikku_django.testing._lease_factories import (
    DatabaseServiceFactory,
    RedisServiceFactory,
    unique_prefix,
)
from pikku_django.testing._lease_hold import HoldLeaseContract
from pikku_django.testing._lease_support import (
    BOUNDARY_TRIALS,
    BOUNDARY_TTL,
    HOUR,
    LOOKALIKE_IDS,
    LOOKALIKES,
    RACERS,
    RENEWED,
    SHORT,
    clock_ahead,
    wait_ms,
)

__all__ = [
    "HOUR",
    "RENEWED",
    "SHORT",
    "DatabaseServiceFactory",
    "HoldLeaseContract",
    "LeaseServiceContract",
    "RedisServiceFactory",
    "SharedLeaseServiceContract",
    "StoreClockLeaseContract",
    "clock_ahead",
    "unique_prefix",
    "wait_ms",
]


class LeaseServiceContract(HoldLeaseContract):
    """Every behaviour a lease service must show."""

    @pytest.fixture
    def lease_service(self) -> Iterator[LeaseService]:
        raise NotImplementedError("provide a lease_service fixture yielding a fresh service")

    # -- one holder at a time ------------------------------------------------

    def test_one_holder_at_a_time(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", HOUR)
        assert a is not None
        assert a.holder == "a"
        assert a.token == 1
        assert a.key == "stage"
        assert lease_service.acquire("stage", "b", HOUR) is None
        got = lease_service.get("stage")
        assert got is not None
        assert got.holder == "a"

    def test_keys_are_independent(self, lease_service: LeaseService) -> None:
        assert lease_service.acquire("one", "a", HOUR) is not None
        b = lease_service.acquire("two", "b", HOUR)
        assert b is not None
        assert b.holder == "b"

    def test_holder_reacquires_under_same_token(self, lease_service: LeaseService) -> None:
        first = lease_service.acquire("stage", "a", SHORT)
        again = lease_service.acquire("stage", "a", HOUR)
        assert first is not None
        assert again is not None
        assert again.token == first.token
        assert again.expires_at > first.expires_at

    def test_lapsed_lease_passes_on_with_higher_token(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", SHORT)
        assert a is not None
        wait_ms(2 * SHORT)
        assert lease_service.get("stage") is None
        b = lease_service.acquire("stage", "b", HOUR)
        assert b is not None
        assert b.holder == "b"
        assert b.token == a.token + 1
        assert lease_service.refresh(a, HOUR) is None

    def test_holder_reacquiring_a_lapsed_lease_gets_new_token(
        self, lease_service: LeaseService
    ) -> None:
        a = lease_service.acquire("stage", "a", SHORT)
        assert a is not None
        wait_ms(2 * SHORT)
        again = lease_service.acquire("stage", "a", HOUR)
        assert again is not None
        assert again.token == a.token + 1

    def test_release_frees_key_and_token_keeps_rising(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", HOUR)
        assert a is not None
        assert lease_service.release(a) is True
        assert lease_service.get("stage") is None
        b = lease_service.acquire("stage", "b", HOUR)
        assert b is not None
        assert b.token == a.token + 1

    def test_stale_lease_cannot_release_new_holder(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", SHORT)
        assert a is not None
        wait_ms(2 * SHORT)
        assert lease_service.acquire("stage", "b", HOUR) is not None
        assert lease_service.release(a) is False
        got = lease_service.get("stage")
        assert got is not None
        assert got.holder == "b"

    def test_refresh_extends_live_lease(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", SHORT)
        assert a is not None
        refreshed = lease_service.refresh(a, HOUR)
        assert refreshed is not None
        assert refreshed.token == a.token
        assert refreshed.expires_at > a.expires_at
        wait_ms(2 * SHORT)
        assert lease_service.acquire("stage", "b", HOUR) is None

    def test_stale_token_is_refused(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", HOUR)
        assert a is not None
        assert lease_service.release(a)
        again = lease_service.acquire("stage", "a", HOUR)
        assert again is not None
        assert again.token == a.token + 1
        # Same key and holder, older token: neither refresh nor release may touch it.
        assert lease_service.refresh(a, HOUR) is None
        assert lease_service.release(a) is False
        forged = Lease("stage", "a", again.token + 1, again.expires_at)
        assert lease_service.refresh(forged, HOUR) is None
        assert lease_service.release(forged) is False
        assert lease_service.get("stage") == again

    def test_other_holder_with_right_token_is_refused(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", HOUR)
        assert a is not None
        impostor = Lease("stage", "b", a.token, a.expires_at)
        assert lease_service.refresh(impostor, HOUR) is None
        assert lease_service.release(impostor) is False
        got = lease_service.get("stage")
        assert got is not None
        assert got.holder == "a"

    def test_refresh_of_released_lease_is_refused(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", HOUR)
        assert a is not None
        assert lease_service.release(a)
        assert lease_service.refresh(a, HOUR) is None
        assert lease_service.get("stage") is None

    def test_release_is_refused_once_released_or_lapsed(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", HOUR)
        assert a is not None
        assert lease_service.release(a) is True
        assert lease_service.release(a) is False, "a released lease was released again"
        b = lease_service.acquire("other", "b", SHORT)
        assert b is not None
        wait_ms(2 * SHORT)
        assert lease_service.release(b) is False, "a lapsed lease was released"
        c = lease_service.acquire("other", "c", HOUR)
        assert c is not None
        assert c.token == b.token + 1

    def test_get_of_unknown_key_is_none(self, lease_service: LeaseService) -> None:
        assert lease_service.get("never-taken") is None

    def test_lease_value_is_immutable(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", HOUR)
        assert a is not None
        with pytest.raises(AttributeError):
            a.token = 99  # type: ignore[misc]

    # -- names compared byte for byte -----------------------------------------

    @pytest.mark.parametrize(("one", "other"), LOOKALIKES, ids=LOOKALIKE_IDS)
    def test_lookalike_holders_are_two_holders(
        self, lease_service: LeaseService, one: str, other: str
    ) -> None:
        a = lease_service.acquire("stage", one, HOUR)
        assert a is not None
        assert lease_service.acquire("stage", other, HOUR) is None, f"{other!r} took {one!r}'s"
        impostor = Lease("stage", other, a.token, a.expires_at)
        assert lease_service.refresh(impostor, HOUR) is None
        assert lease_service.release(impostor) is False
        got = lease_service.get("stage")
        assert got is not None
        assert (got.holder, got.token) == (one, a.token)
        assert lease_service.refresh(a, HOUR) is not None

    @pytest.mark.parametrize(("one", "other"), LOOKALIKES, ids=LOOKALIKE_IDS)
    def test_lookalike_keys_are_two_keys(
        self, lease_service: LeaseService, one: str, other: str
    ) -> None:
        a = lease_service.acquire(one, "a", HOUR)
        b = lease_service.acquire(other, "b", HOUR)
        assert a is not None
        assert b is not None, f"key {other!r} was held as {one!r}"
        assert lease_service.release(a) is True
        got = lease_service.get(other)
        assert got is not None
        assert (got.key, got.holder, got.token) == (other, "b", b.token)
        assert lease_service.get(one) is None

    # -- the expiry boundary -------------------------------------------------

    @pytest.mark.parametrize("operation", ["release", "refresh", "acquire"])
    def test_expiry_boundary_is_the_same_for_every_operation(
        self, lease_service: LeaseService, operation: str
    ) -> None:
        # The first moment get() no longer sees a lease, no operation may treat it
        # as live: each trial catches the expiry as closely as round trips allow.
        for trial in range(BOUNDARY_TRIALS):
            key = f"boundary-{trial}"
            a = lease_service.acquire(key, "a", BOUNDARY_TTL)
            assert a is not None
            deadline = time.monotonic() + 10
            while lease_service.get(key) is not None:
                assert time.monotonic() < deadline, "the lease never lapsed"
            if operation == "release":
                assert lease_service.release(a) is False, f"trial {trial}: released a lapsed lease"
            elif operation == "refresh":
                assert lease_service.refresh(a, HOUR) is None, f"trial {trial}: renewed it"
            else:
                b = lease_service.acquire(key, "b", HOUR)
                assert b is not None, f"trial {trial}: the lapsed lease kept its key"
                assert b.token == a.token + 1

    # -- bad input -----------------------------------------------------------

    @pytest.mark.parametrize("ttl", [0, -1, -HOUR])
    def test_non_positive_ttl_is_refused(self, lease_service: LeaseService, ttl: int) -> None:
        with pytest.raises(ValueError, match="ttl_ms"):
            lease_service.acquire("stage", "a", ttl)
        a = lease_service.acquire("stage", "a", HOUR)
        assert a is not None
        with pytest.raises(ValueError, match="ttl_ms"):
            lease_service.refresh(a, ttl)
        assert lease_service.get("stage") == a

    @pytest.mark.parametrize("ttl", [1.5, "1000", None, True])
    def test_ttl_must_be_int(self, lease_service: LeaseService, ttl: Any) -> None:
        with pytest.raises(ValueError, match="ttl_ms"):
            lease_service.acquire("stage", "a", ttl)
        assert lease_service.get("stage") is None

    @pytest.mark.parametrize("key", ["", None, 7, "x" * 256, "nul\x00"])
    def test_bad_key_is_refused(self, lease_service: LeaseService, key: Any) -> None:
        with pytest.raises(ValueError, match="key"):
            lease_service.acquire(key, "a", HOUR)
        with pytest.raises(ValueError, match="key"):
            lease_service.get(key)

    @pytest.mark.parametrize("holder", ["", None, "h" * 256])
    def test_bad_holder_is_refused(self, lease_service: LeaseService, holder: Any) -> None:
        with pytest.raises(ValueError, match="holder"):
            lease_service.acquire("stage", holder, HOUR)
        assert lease_service.get("stage") is None

    def test_refresh_and_release_need_a_lease(self, lease_service: LeaseService) -> None:
        with pytest.raises(ValueError, match="Lease"):
            lease_service.refresh("stage", HOUR)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="Lease"):
            lease_service.release(("stage", "a", 1, 0))  # type: ignore[arg-type]

    # -- concurrency ---------------------------------------------------------

    def test_concurrent_acquires_admit_one_holder(self, lease_service: LeaseService) -> None:
        self._race_threads(lease_service, 5)

    def test_twenty_threads_admit_one_holder(self, lease_service: LeaseService) -> None:
        self._race_threads(lease_service, RACERS)

    @staticmethod
    def _race_threads(lease_service: LeaseService, n: int) -> None:
        barrier = threading.Barrier(n)
        results: list[Lease | None] = [None] * n
        errors: list[BaseException] = []

        def race(i: int) -> None:
            try:
                barrier.wait(timeout=30)
                results[i] = lease_service.acquire("stage", f"holder-{i}", HOUR)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, winners
        got = lease_service.get("stage")
        assert got is not None
        assert got.holder == winners[0].holder


def _acquire_in_child(
    factory: Callable[[], LeaseService],
    key: str,
    holder: str,
    barrier: Any,
    results: Any,
) -> None:
    try:
        service = factory()
        service.get(key)  # connect before the race starts
        barrier.wait(timeout=120)
        lease = service.acquire(key, holder, HOUR)
        results.put((holder, None if lease is None else lease.token, None))
        service.close()
    except BaseException as exc:
        results.put((holder, None, repr(exc)))


class SharedLeaseServiceContract(LeaseServiceContract):
    """A lease service whose leases every process on the store shares.

    Needs a ``lease_service_factory`` fixture: a picklable callable that builds,
    in a freshly spawned process, a service on the same store as ``lease_service``.
    """

    @pytest.fixture
    def lease_service_factory(self) -> Callable[[], LeaseService]:
        raise NotImplementedError("provide a lease_service_factory fixture")

    def test_twenty_processes_admit_one_holder(
        self,
        lease_service: LeaseService,
        lease_service_factory: Callable[[], LeaseService],
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(RACERS)
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=_acquire_in_child,
                args=(lease_service_factory, "stage", f"process-{i}", barrier, results),
            )
            for i in range(RACERS)
        ]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=180) for _ in procs]
        for p in procs:
            p.join(60)
        errors = [o for o in outcomes if o[2] is not None]
        assert not errors, errors
        winners = [o for o in outcomes if o[1] is not None]
        assert len(winners) == 1, winners
        got = lease_service.get("stage")
        assert got is not None
        assert got.holder == winners[0][0]
        assert got.token == winners[0][1]


class StoreClockLeaseContract:
    """A lease service that judges time on the store's clock, not the caller's."""

    def test_fast_clock_cannot_take_live_lease(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", 5_000)
        assert a is not None
        with clock_ahead(HOUR):
            assert lease_service.acquire("stage", "b", 5_000) is None
            got = lease_service.get("stage")
        assert got is not None
        assert got.holder == "a"

    def test_fast_clock_cannot_stretch_own_lease(self, lease_service: LeaseService) -> None:
        real_now = int(time.time() * 1000)
        with clock_ahead(HOUR):
            a = lease_service.acquire("stage", "a", SHORT)
            assert a is not None
            assert a.expires_at < real_now + HOUR / 2, "acquire was judged on the process clock"
            refreshed = lease_service.refresh(a, SHORT)
            assert refreshed is not None
            assert refreshed.expires_at < real_now + HOUR / 2, (
                "refresh was judged on the process clock"
            )
        wait_ms(2 * SHORT)
        with clock_ahead(HOUR):
            assert lease_service.refresh(a, SHORT) is None
        assert lease_service.get("stage") is None
        b = lease_service.acquire("stage", "b", HOUR)
        assert b is not None

    def test_slow_clock_cannot_keep_lapsed_lease(self, lease_service: LeaseService) -> None:
        a = lease_service.acquire("stage", "a", SHORT)
        assert a is not None
        wait_ms(2 * SHORT)
        with clock_ahead(-HOUR):
            assert lease_service.refresh(a, SHORT) is None
            assert lease_service.get("stage") is None
            b = lease_service.acquire("stage", "b", HOUR)
        assert b is not None
        assert b.token == a.token + 1
