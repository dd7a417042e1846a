"""The count of a parallel group's open child branches, so that a run waiting on a
fan-out is woken once, by its last child (or a failure), not by each child."""

from __future__ import annotations

import uuid

from pikku_django.models import StepKind, StepStatus
from pikku_django.workflows.store import WorkflowStore


def branch_settled(store: WorkflowStore, group_id: int, *, failed: bool) -> bool:
    """Count a child branch of ``group_id`` settled: whether its run needs a pass now
    (its last open branch, or a failure: a fail-fast join cancels the rest)."""
    return store.settle_branch(group_id, failed=failed).wakes_run


def failed_group(store: WorkflowStore, run_id: uuid.UUID) -> str | None:
    """The name of a parallel group of the run whose fail-fast join failed, if any."""
    found = (
        store.steps()
        .order_by()
        .filter(run_id=run_id, kind=StepKind.PARALLEL, status=StepStatus.FAILED)
        .values_list("name", flat=True)
    )
    return next(iter(found), None)
