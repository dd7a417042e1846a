"""``hold_lease``: run a block of code while holding a lease renewed in the background."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, overload

from pikku_django.leases.base import Lease, LeaseService, check_key, check_ttl
from pikku_django.leases.errors import LeaseLostError, LeaseTakenError
from pikku_django.timers import Timer, call_later

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Renewals per lease length: a failed renewal still leaves others before expiry.
RENEWALS_PER_LEASE = 3
#: How often leaving the block looks again whether a stuck renewal has lost the lease.
RENEWAL_JOIN_S = 0.05


def renewal_interval_s(ttl_ms: int) -> float:
    """Seconds between renewals of a ``ttl_ms`` lease."""
    return max(0.001, ttl_ms / RENEWALS_PER_LEASE / 1000)


class HeldLease:
    """A lease held for the length of a ``with`` block, renewed every ttl/3.

    ``lost`` is a :class:`threading.Event` set the moment the lease is seen to be
    lost; ``lease`` is the latest renewed value. Leaving the block stops renewing
    and releases the lease; a release that finds it no longer this live lease (or
    a loss seen earlier) raises :class:`LeaseLostError`.
    """

    def __init__(
        self,
        key: str,
        *,
        ttl_ms: int | None = None,
        service: LeaseService | None = None,
        holder: str | None = None,
    ) -> None:
        from pikku_django.conf import pikku_settings
        from pikku_django.leases.registry import get_lease_service

        self.key = check_key(key)
        self.ttl_ms = check_ttl(pikku_settings.LEASE_TTL_MS if ttl_ms is None else ttl_ms)
        self.service = service if service is not None else get_lease_service()
        self.holder = holder or f"{uuid.uuid4()}"
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._held_until = 0.0
        self._thread_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._timer: Timer | None = None
        self._released: bool | None = None

    @property
    def lease(self) -> Lease:
        """The lease as last acquired or renewed."""
        if self._lease is None:
            raise RuntimeError("hold_lease has not acquired its lease yet; use it in a with block")
        return self._lease

    @property
    def token(self) -> int:
        """The fencing token to pass to whatever the lease protects."""
        return self.lease.token

    @classmethod
    def taken(
        cls, lease: Lease, *, ttl_ms: int, service: LeaseService, asked_at: float
    ) -> HeldLease:
        """Hold ``lease``, acquired from ``service`` for ``ttl_ms`` by a statement that
        took it with other work, asked for at ``asked_at`` (this process's monotonic
        clock): held from now on as if a ``with`` block had just acquired it."""
        held = cls(lease.key, ttl_ms=ttl_ms, service=service, holder=lease.holder)
        held._hold(lease, asked_at)
        return held

    def __enter__(self) -> HeldLease:
        if self._lease is not None:  # taken already (see :meth:`taken`)
            return self
        asked_at = time.monotonic()
        lease = self.service.acquire(self.key, self.holder, self.ttl_ms)
        if lease is None:
            raise LeaseTakenError(self.key)
        self._hold(lease, asked_at)
        return self

    def _hold(self, lease: Lease, asked_at: float) -> None:
        self._lease = lease
        self._held_until = asked_at + self.ttl_ms / 1000
        # No thread until the first renewal is due: most blocks end before it.
        self._timer = call_later(
            renewal_interval_s(self.ttl_ms), self._keep_alive, name=f"pikku-lease:{self.key}"
        )

    def released_with(self, released: bool) -> None:
        """The lease was released by a statement that did so with other work;
        ``released``: it was still this live lease then. Leaving the block judges by
        that instead of releasing again."""
        self._stop_renewing()
        self._released = released

    def _renew(self) -> bool:
        """True while the lease is ours; False once another holder has it. May raise."""
        with self._lock:
            asked_at = time.monotonic()
            renewed = self.service.refresh(self.lease, self.ttl_ms)
            if renewed is not None:
                self._lease = renewed
                self._held_until = asked_at + self.ttl_ms / 1000
            return renewed is not None

    def vouch(self) -> None:
        """Raise :class:`LeaseLostError` unless the lease is held now.

        Within two thirds of a lease of its last acquire or renewal (as timed on
        this process's monotonic clock, from before the request) it is held without
        asking the store; later, the store is asked with a renewal.
        """
        if self.lost.is_set():
            raise LeaseLostError(self.key)
        if time.monotonic() < self._held_until - self.ttl_ms / 1000 / 3:
            return
        try:
            held = self._renew()
        except Exception:
            logger.warning("Checking lease %r failed", self.key, exc_info=True)
            held = time.monotonic() < self._held_until
        if not held:
            self._mark_lost("a check found it was no longer ours")
            raise LeaseLostError(self.key)

    def _mark_lost(self, why: str) -> None:
        if not self.lost.is_set():
            logger.warning("Lease %r lost: %s", self.key, why)
            self.lost.set()

    def _keep_alive(self) -> None:
        """Renew every ttl/3 until stopped, on the thread the first due renewal started."""
        with self._thread_lock:
            if self._stop.is_set():
                return
            self._thread = threading.current_thread()
        try:
            interval = renewal_interval_s(self.ttl_ms)
            while not self.lost.is_set():
                # A store that stops answering (a stalled connection) holds the
                # renewal up; the lease still counts as lost once its expiry passes.
                watchdog = call_later(
                    max(0.0, self._held_until - time.monotonic()),
                    self._expired_while_renewing,
                    name=f"pikku-lease-expiry:{self.key}",
                )
                try:
                    held = self._renew()
                except Exception:
                    logger.warning("Renewing lease %r failed; will retry", self.key, exc_info=True)
                    if time.monotonic() >= self._held_until:
                        self._mark_lost("renewals kept failing past its expiry")
                else:
                    if not held:
                        self._mark_lost("another holder has it")
                finally:
                    watchdog.cancel()
                if self._stop.wait(interval):
                    return
        except BaseException:
            logger.exception(
                "The renewal thread of lease %r died; counting the lease lost", self.key
            )
            self._mark_lost("its renewal thread died")

    def _expired_while_renewing(self) -> None:
        # Due only while a renewal is unanswered (answered ones cancel it), also when
        # the block has ended meanwhile and is waiting for that renewal.
        if time.monotonic() >= self._held_until:
            self._mark_lost("a renewal was still unanswered when it expired")

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        with self._thread_lock:
            thread = self._thread
        # A renewal stuck on a store that stopped answering is not waited for once the
        # lease counts as lost: it ends by itself, and can no longer change the outcome.
        while thread is not None and thread is not threading.current_thread():
            thread.join(RENEWAL_JOIN_S)
            if not thread.is_alive() or self.lost.is_set():
                return

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_renewing()
        try:
            released = (
                self.service.release(self.lease) if self._released is None else self._released
            )
        except Exception:
            logger.warning(
                "Releasing lease %r failed; it lapses by itself", self.key, exc_info=True
            )
            # The store could not say: judge by the last acquire or renewal instead.
            released = time.monotonic() < self._held_until
        if exc_type is None and (self.lost.is_set() or not released):
            # Released means it was still this live lease: the block ran under it.
            self._mark_lost("it was not ours when the block finished")
            raise LeaseLostError(self.key)


@overload
def hold_lease(
    key: str,
    body: None = None,
    *,
    ttl_ms: int | None = None,
    service: LeaseService | None = None,
    holder: str | None = None,
) -> HeldLease: ...


@overload
def hold_lease(
    key: str,
    body: Callable[[HeldLease], T],
    *,
    ttl_ms: int | None = None,
    service: LeaseService | None = None,
    holder: str | None = None,
) -> T: ...


def hold_lease(
    key: str,
    body: Callable[[HeldLease], Any] | None = None,
    *,
    ttl_ms: int | None = None,
    service: LeaseService | None = None,
    holder: str | None = None,
) -> Any:
    """Hold ``key`` for a ``with`` block (or while ``body(held)`` runs), renewing
    it every ttl/3 in the background.

    Raises :class:`LeaseTakenError` at once if someone else holds the key, and
    :class:`LeaseLostError` on exit if the lease was lost while the block ran.
    ``ttl_ms`` defaults to ``PIKKU['LEASE_TTL_MS']``; ``service`` to the app's.

        with hold_lease("nightly-report") as held:
            build_report(fencing_token=held.token, stop=held.lost)

        total = hold_lease("nightly-report", lambda held: build_report(held.token))
    """
    held = HeldLease(key, ttl_ms=ttl_ms, service=service, holder=holder)
    if body is None:
        return held
    with held:
        return body(held)
