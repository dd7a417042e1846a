"""Errors raised by the lease services and by :func:`hold_lease`."""

from __future__ import annotations


class LeaseError(Exception):
    """Base class for lease errors."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class LeaseTakenError(LeaseError):
    """The lease is held by another holder; raised at once, never after waiting."""

    def __init__(self, key: str) -> None:
        super().__init__(key, f"Lease {key!r} is held by another holder")


class LeaseLostError(LeaseError):
    """The lease lapsed or passed to another holder before the body finished."""

    def __init__(self, key: str) -> None:
        super().__init__(key, f"Lease {key!r} was lost before the body finished")
