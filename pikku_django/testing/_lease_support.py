"""Constants and clock helpers shared by the lease conformance contracts."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

HOUR = 60 * 60 * 1000
#: A lease a test lets lapse; it must outlive a real database's round trips.
SHORT = 500
#: The lease hold_lease renews in tests.
RENEWED = 1_000
#: How many callers race for one key.
RACERS = 20
#: Names that differ only in case, a trailing space or an accent: never the same name.
LOOKALIKES = [("worker-a", "WORKER-A"), ("h1", "h1 "), ("e", "\u00e9"), ("straße", "strasse")]
LOOKALIKE_IDS = ["case", "trailing-space", "accent", "expansion"]
#: A lease caught at its expiry, this many times per operation.
BOUNDARY_TRIALS = 20
BOUNDARY_TTL = 5


def wait_ms(ms: float) -> None:
    time.sleep(ms / 1000)


@contextmanager
def clock_ahead(ms: int) -> Iterator[None]:
    """This process's wall clock, as every module reads it, runs ``ms`` fast."""
    real = time.time

    def skewed() -> float:
        return real() + ms / 1000

    with mock.patch("time.time", skewed):
        yield
