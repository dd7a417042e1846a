"""Step timeouts: an attempt's own deadline, enforced where a lapsed claim is.

An attempt with a ``timeout`` is claimed under a lease that never reaches past its
deadline. Once it is past, the attempt is closed as failed with
:class:`~pikku_django.workflows.errors.StepTimeoutError` (by the worker that runs
it, when its function returns late, or by the claim that finds its lease lapsed),
and the step's retry policy decides what follows. Both writes are fenced by the
attempt, so exactly one of them lands and a late result never does.

Running Python is not interrupted: the function goes on until it returns.
"""

from __future__ import annotations

import time
from datetime import datetime

from pikku_django.models import StepStatus, WorkflowStep
from pikku_django.workflows._values import ClaimedStep, Wake
from pikku_django.workflows.errors import StepTimeoutError, serialize_error
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.passes._step_options import retry_delay_for
from pikku_django.workflows.store import WorkflowStore

logger = workflow_logger(__name__)


def capped_lease_ms(lease_ms: int, timeout: float | None) -> int:
    """The lease a claim takes: never past the attempt's timeout."""
    if timeout is None:
        return lease_ms
    return max(1, min(lease_ms, int(timeout * 1000)))


def remaining_ms(claimed: ClaimedStep) -> int | None:
    """Milliseconds left before ``claimed`` times out (None: no timeout)."""
    if claimed.timeout is None:
        return None
    return int((claimed.claimed_at + claimed.timeout - time.monotonic()) * 1000)


def renewal_ms(claimed: ClaimedStep) -> int | None:
    """The lease a renewal of ``claimed`` takes, or None once its time is up (the
    lease is then left to lapse at the deadline)."""
    left = remaining_ms(claimed)
    if left is None:
        return claimed.lease_ms
    return min(claimed.lease_ms, left) if left > 0 else None


def check_in_time(claimed: ClaimedStep) -> None:
    """StepTimeoutError if ``claimed`` ran past its timeout (its outcome is then refused)."""
    check_elapsed(claimed.name, claimed.attempt, claimed.timeout, claimed.claimed_at)


def check_elapsed(step: str, attempt: int, timeout: float | None, began: float) -> None:
    """StepTimeoutError if an attempt that ``began`` (monotonic) ran past ``timeout``."""
    if timeout is not None and time.monotonic() - began >= timeout:
        raise StepTimeoutError(step, attempt, timeout)


def time_out(store: WorkflowStore, step: WorkflowStep, now: datetime) -> None:
    """Close the lapsed attempt of ``step``, which its store's claim decision found
    past its timeout, as timed out. Its retry policy decides what comes next: a retry
    after its delay, or (no attempt left) a failed step and its run woken."""
    assert step.timeout is not None
    exc = StepTimeoutError(step.name, step.attempt, step.timeout)
    exhausted = step.attempt >= step.attempts_allowed
    settled = store.settle(
        step.id,
        step.attempt,
        StepStatus.FAILED,
        error=serialize_error(exc),
        available_at=None if exhausted else now + retry_delay_for(step, step.attempt),
        wake=Wake.NOW if exhausted else Wake.NONE,
        token=step.claim_token,  # the lapsed claim, as the decision read it
    )
    if settled is None:
        return  # settled meanwhile by its worker: the attempt is over either way
    logger.warning("%s (%s)", exc, "no attempts left" if exhausted else "will retry")
    if not exhausted:
        store.notify()
