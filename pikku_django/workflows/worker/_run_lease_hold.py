"""A worker thread's hold on a run it carries from pass to pass: its lease, and the
pass it owes the run when a step settled for it."""

from __future__ import annotations

from typing import Any

from pikku_django.leases import HeldLease, LeaseLostError, LeaseTakenError
from pikku_django.workflows._values import DueRun
from pikku_django.workflows.engine import WorkflowEngine
from pikku_django.workflows.logcontext import workflow_logger

logger = workflow_logger(__name__)


def take_run_lease(
    engine: WorkflowEngine, run_id: Any, due: DueRun | None = None
) -> HeldLease | None:
    """The run's lease, held until :func:`give_back`; None (the run woken again
    shortly) while another worker passes the run. ``due``: the run's claim, which
    may have taken its lease already."""
    if due is not None and due.lease is not None:
        return HeldLease.taken(
            due.lease,
            ttl_ms=engine.config.run_lease_ms,
            service=engine.leases,
            asked_at=due.asked_at,
        )
    if due is not None and due.lease_refused:
        logger.info("Run %s is orchestrated elsewhere; waking it again shortly", run_id)
        engine.retry_pass_soon(run_id)
        return None
    held = engine.run_lease(run_id)
    try:
        return held.__enter__()
    except LeaseTakenError:
        logger.info("Run %s is orchestrated elsewhere; waking it again shortly", run_id)
        engine.retry_pass_soon(run_id)
        return None
    except Exception:
        # The lease store failed (e.g. its server restarted): the run was claimed
        # for a pass that will not happen now, so it must fall due again soon.
        logger.warning("Could not take the lease of run %s; waking it again shortly", run_id)
        engine.retry_pass_soon(run_id)
        raise


def give_back(held: HeldLease) -> None:
    """Release a run lease held across passes; each pass vouched for itself."""
    try:
        held.__exit__(None, None, None)
    except LeaseLostError:
        logger.info("Run lease %s had lapsed when it was given back", held.key)


def wake_owed(engine: WorkflowEngine, run_id: Any) -> None:
    """Wake a run whose owed pass did not happen, for any worker."""
    try:
        engine.wake_run(run_id)
    except Exception:
        logger.warning("Could not wake run %s; the recovery sweep will", run_id, exc_info=True)
