"""Keeping a claimed step's lease while its function runs: a renewal every half lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from django.db import connections

from pikku_django.timers import call_later
from pikku_django.workflows._values import ClaimedStep
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.steps._timeouts import renewal_ms

logger = workflow_logger(__name__)


class LeaseRefresher(Protocol):
    """What renews a step's claim (a WorkflowEngine)."""

    def refresh_step_lease(
        self, step_id: int, lease_ms: int | None, attempt: int, token: int | None = None
    ) -> bool: ...


#: Leases shorter than this still renew every half lease, with one warning.
SHORT_LEASE_MS = 1_000
_warned_short_lease = False


def renewal_interval_s(lease_ms: int) -> float:
    """Seconds between renewals of a step lease: at most half the lease."""
    return max(0.001, lease_ms / 2 / 1000)


def warn_if_short(claimed: ClaimedStep) -> None:
    """Warn once per process that a step lease is under a second."""
    global _warned_short_lease
    if claimed.lease_ms < SHORT_LEASE_MS and not _warned_short_lease:
        _warned_short_lease = True
        logger.warning(
            "Step lease of %d ms on queue %r is under a second; renewing every %d ms",
            claimed.lease_ms,
            claimed.queue,
            claimed.lease_ms // 2,
        )


def first_renewal_in(claimed: ClaimedStep) -> float:
    """Seconds until the first renewal of ``claimed`` is due: half a lease after the claim."""
    return max(0.0, renewal_interval_s(claimed.lease_ms) - (time.monotonic() - claimed.claimed_at))


@contextmanager
def keep_step_lease(engine: LeaseRefresher, claimed: ClaimedStep) -> Iterator[threading.Event]:
    """Renew a claimed step's lease every half lease while the block runs.

    Yields an Event set once a renewal reports that a newer attempt replaced
    this one; renewal then stops (the attempt's writes will be refused).
    """
    warn_if_short(claimed)
    superseded = threading.Event()
    stop = threading.Event()
    lock = threading.Lock()
    renewing: list[threading.Thread] = []
    interval = renewal_interval_s(claimed.lease_ms)

    def renew() -> None:
        with lock:
            if stop.is_set():
                return
            renewing.append(threading.current_thread())
        try:
            while True:
                lease_ms = renewal_ms(claimed)
                if lease_ms is None:
                    return  # past its timeout: the lease lapses at the deadline
                try:
                    held = engine.refresh_step_lease(
                        claimed.step_id, lease_ms, claimed.attempt, claimed.claim_token
                    )
                except Exception:
                    logger.warning(
                        "Renewing the lease of step %s failed; will retry",
                        claimed.name,
                        exc_info=True,
                    )
                else:
                    if not held:
                        logger.warning(
                            "Step %s attempt %d was claimed by a newer attempt; "
                            "its outcome will not be recorded",
                            claimed.name,
                            claimed.attempt,
                        )
                        superseded.set()
                        return
                if stop.wait(interval):
                    return
        except BaseException:
            logger.exception("The lease renewal of step %s died", claimed.name)
        finally:
            connections.close_all()

    # No thread until the first renewal is due (half a lease after the claim, not
    # after this block began): most steps finish before it.
    timer = call_later(first_renewal_in(claimed), renew, name=f"pikku-step-lease:{claimed.step_id}")
    try:
        yield superseded
    finally:
        stop.set()
        timer.cancel()
        with lock:
            threads = list(renewing)
        for thread in threads:
            thread.join()
