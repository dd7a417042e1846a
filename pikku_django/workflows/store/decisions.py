"""What a store's claim decision for one step came to."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class Verdict(enum.StrEnum):
    """The claim decision for a step."""

    #: Claimable: taken as its next attempt (``Decision.won``) unless another
    #: caller, its run's end or its queue's pause came first.
    CLAIM = "claim"
    #: Not claimable: live, parked, settled, not due yet, or failed for good.
    NONE = "none"
    #: Its claim lapsed past its timeout: the caller closes it by its retry policy.
    TIMED_OUT = "timed_out"
    #: Its claim lapsed with no attempt left: failed by the decision (``won``).
    EXPIRED = "expired"


@dataclass(frozen=True)
class Decision:
    """A claim decision and what it wrote: ``won`` (the claim made, or the expired
    step failed, by this caller), the attempt judged, whether the step was running
    (a lapsed claim taken over) and, when claimed, when its new attempt started and
    its claim token."""

    verdict: Verdict
    won: bool = False
    attempt: int = 0
    reclaimed: bool = False
    started_at: datetime | None = None
    claim_token: int = 0


@dataclass(frozen=True)
class Started:
    """A claim of a step's next attempt made: when the attempt started as recorded,
    and the claim's token."""

    at: datetime | None
    claim_token: int
