"""The claim whose step function this context is calling, for code the step calls."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from pikku_django.workflows._values import ClaimedStep

_current: ContextVar[ClaimedStep | None] = ContextVar("pikku_current_claim", default=None)


@contextlib.contextmanager
def calling(claimed: ClaimedStep) -> Iterator[None]:
    """Make ``claimed`` the current claim while its step function is called."""
    token = _current.set(claimed)
    try:
        yield
    finally:
        _current.reset(token)


def current_claim() -> ClaimedStep | None:
    """The claim of the queued step whose function is running here, or None."""
    return _current.get()


def fencing_token() -> int | None:
    """The claim token of the queued step whose function is running here (None
    outside one): a number every later claim of the step exceeds, on PostgreSQL
    across a failover too. A step that writes to a store outside the database can
    send it along, for that store to refuse a writer whose token is lower than one it
    has seen (see docs/guarantees.md, "Across a database failover")."""
    claimed = _current.get()
    return None if claimed is None else claimed.claim_token
