"""The lease value and the interface every lease backend implements."""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from dataclasses import dataclass

#: Longest key any backend accepts (the ``Lease.key`` column's length).
MAX_KEY_LENGTH = 255
#: Longest holder id any backend accepts.
MAX_HOLDER_LENGTH = 255


@dataclass(frozen=True, slots=True)
class Lease:
    """A held lease: its key, holder, fencing token and expiry (epoch ms, store clock)."""

    key: str
    holder: str
    token: int
    expires_at: int


def now_ms() -> int:
    """This process's wall clock in epoch milliseconds."""
    return int(time.time() * 1000)


def check_key(key: object) -> str:
    """Return ``key`` if it is a usable lease key, else raise ValueError."""
    if not isinstance(key, str):
        raise ValueError(f"A lease key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("A lease key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"A lease key is at most {MAX_KEY_LENGTH} characters, got {len(key)}")
    if "\x00" in key:
        raise ValueError("A lease key must not contain NUL characters")
    return key


def check_holder(holder: object) -> str:
    """Return ``holder`` if it is a usable holder id, else raise ValueError."""
    if not isinstance(holder, str):
        raise ValueError(f"A lease holder must be a str, not {type(holder).__name__}")
    if not holder:
        raise ValueError("A lease holder must not be empty")
    if len(holder) > MAX_HOLDER_LENGTH:
        raise ValueError(
            f"A lease holder is at most {MAX_HOLDER_LENGTH} characters, got {len(holder)}"
        )
    if "\x00" in holder:
        raise ValueError("A lease holder must not contain NUL characters")
    return holder


def check_ttl(ttl_ms: object) -> int:
    """Return ``ttl_ms`` if it is a positive whole number of milliseconds, else raise."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        raise ValueError(
            f"A lease ttl_ms must be an int of milliseconds, not {type(ttl_ms).__name__}"
        )
    if ttl_ms <= 0:
        raise ValueError(f"A lease ttl_ms must be greater than 0, got {ttl_ms}")
    if ttl_ms > 2**53:
        raise ValueError(f"A lease ttl_ms of {ttl_ms} is too large")
    return ttl_ms


def check_lease(lease: object) -> Lease:
    """Return ``lease`` if it is a :class:`Lease`, else raise ValueError."""
    if not isinstance(lease, Lease):
        raise ValueError(f"Expected a Lease, not {type(lease).__name__}")
    return lease


class LeaseService(abc.ABC):
    """Named, time-bounded grants with a fencing token.

    A lease is not a mutex: a holder that stalls past its expiry loses the key
    without knowing, so whatever the lease protects must check its ``token``.
    Every method is safe to call from any thread.
    """

    #: Whether leases are judged on the store's clock rather than this process's.
    judged_on_store_clock: bool = True
    #: Whether separate processes see the same leases.
    shared_between_processes: bool = True

    @abc.abstractmethod
    def acquire(self, key: str, holder: str, ttl_ms: int) -> Lease | None:
        """Take ``key`` for ``ttl_ms``, or extend it under the same token if
        ``holder`` already has it; None while someone else holds it. Never waits."""

    @abc.abstractmethod
    def refresh(self, lease: Lease, ttl_ms: int) -> Lease | None:
        """Extend a live lease by ``ttl_ms`` from now; None if it is no longer this lease."""

    @abc.abstractmethod
    def release(self, lease: Lease) -> bool:
        """Give the lease up if it is still this live lease (True), else change
        nothing (False). The token counter is kept."""

    @abc.abstractmethod
    def get(self, key: str) -> Lease | None:
        """The live lease on ``key``, or None."""

    def forget(self, keys: Sequence[str]) -> int:
        """Delete what is kept of ``keys`` (their token counters included); the number of
        keys deleted. Only for keys nothing will take again, such as the run lease of a
        run that was deleted: a key taken after this starts its tokens afresh. Backends
        whose keys expire by themselves keep the default, which deletes nothing."""
        return 0

    def close(self) -> None:  # noqa: B027  (optional hook)
        """Free connections the service holds; it stays usable and reconnects."""
