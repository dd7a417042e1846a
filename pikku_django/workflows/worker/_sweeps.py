"""What a worker looks at besides its claims: runs nothing will wake, and what is left."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pikku_django.models import RunStatus
from pikku_django.workflows.engine import WorkflowEngine
from pikku_django.workflows.logcontext import workflow_logger

logger = workflow_logger(__name__)


def wake_stalled_runs(engine: WorkflowEngine, stalled_after: float, limit: int = 500) -> int:
    """Wake running runs that nothing will wake: no step in flight, idle for a while.

    A step in flight is scheduled, pending, suspended, waiting for a retry, or
    running under a live (or parked, null) lease. Such a run can only be left
    behind when a worker died between settling a step and waking its run.
    """
    cutoff = engine.clock.now() - timedelta(seconds=stalled_after)
    stalled = engine.store.stalled_runs(cutoff, limit)
    for run_id in stalled:
        logger.warning("Run %s had nothing in flight for %gs: waking it", run_id, stalled_after)
        engine.wake_run(run_id)
    return len(stalled)


def pending_summary(engine: WorkflowEngine) -> dict[str, Any]:
    """What is left for later: runs waiting on timers and the next due time."""
    waiting = engine.runs().filter(status=RunStatus.RUNNING, wake_at__isnull=False)
    return {
        "running_runs": engine.runs().filter(status=RunStatus.RUNNING).count(),
        "suspended_runs": engine.runs().filter(status=RunStatus.SUSPENDED).count(),
        "next_wake_at": waiting.order_by("wake_at").values_list("wake_at", flat=True).first(),
    }
