"""An in-process lease backend, for tests and single-process use."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pikku_django.leases.base import (
    Lease,
    LeaseService,
    check_holder,
    check_key,
    check_lease,
    check_ttl,
    now_ms,
)


class LeaseTokens:
    """The fencing-token counter of each key: it only ever rises."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, int] = {}

    def forget(self, keys: Sequence[str]) -> None:
        """Drop the counters of ``keys``."""
        with self._lock:
            for key in keys:
                self._last.pop(key, None)

    def next(self, key: str) -> int:
        """The token after the last one handed out for ``key`` (1 the first time)."""
        with self._lock:
            token = self._last[key] = self._last.get(key, 0) + 1
            return token


#: Shared by every in-memory service of the process, so a service rebuilt (as
#: ``override_settings`` on PIKKU, DATABASES or CACHES rebuilds it) never hands
#: out a token it handed out before.
PROCESS_TOKENS = LeaseTokens()


class InMemoryLeaseService(LeaseService):
    """Leases in a dict guarded by a lock; visible to this process only.

    Tokens come from ``tokens``, by default the process-wide :data:`PROCESS_TOKENS`:
    they keep rising across services. Pass a new :class:`LeaseTokens` for a store
    whose first token is 1 again (an isolated test).
    """

    judged_on_store_clock = False
    shared_between_processes = False

    def __init__(self, *, tokens: LeaseTokens | None = None) -> None:
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        self._tokens = PROCESS_TOKENS if tokens is None else tokens

    def acquire(self, key: str, holder: str, ttl_ms: int) -> Lease | None:
        check_key(key)
        check_holder(holder)
        check_ttl(ttl_ms)
        with self._lock:
            now = now_ms()
            current = self._leases.get(key)
            if current is not None and current.expires_at > now:
                if current.holder != holder:
                    return None
                lease = Lease(key, holder, current.token, now + ttl_ms)
            else:
                lease = Lease(key, holder, self._tokens.next(key), now + ttl_ms)
            self._leases[key] = lease
            return lease

    def refresh(self, lease: Lease, ttl_ms: int) -> Lease | None:
        check_lease(lease)
        check_ttl(ttl_ms)
        with self._lock:
            now = now_ms()
            current = self._leases.get(lease.key)
            if (
                current is None
                or current.expires_at <= now
                or current.holder != lease.holder
                or current.token != lease.token
            ):
                return None
            renewed = Lease(lease.key, lease.holder, lease.token, now + ttl_ms)
            self._leases[lease.key] = renewed
            return renewed

    def release(self, lease: Lease) -> bool:
        check_lease(lease)
        with self._lock:
            current = self._leases.get(lease.key)
            if (
                current is None
                or current.holder != lease.holder
                or current.token != lease.token
                or current.expires_at <= now_ms()
            ):
                return False
            del self._leases[lease.key]
            return True

    def forget(self, keys: Sequence[str]) -> int:
        with self._lock:
            gone = [key for key in keys if self._leases.pop(key, None) is not None]
        self._tokens.forget(keys)
        return len(gone)

    def get(self, key: str) -> Lease | None:
        check_key(key)
        with self._lock:
            current = self._leases.get(key)
            if current is None or current.expires_at <= now_ms():
                return None
            return current
