"""The count of a parallel group's open child branches, so that a run waiting on a
fan-out is woken once, by its last child (or a failure), not by each child."""

from __future__ import annotations

import uuid

from django.db.models import F

from pikku_django.models import StepKind, StepStatus
from pikku_django.workflows.store import WorkflowStore


def branch_settled(store: WorkflowStore, group_id: int, *, failed: bool) -> bool:
    """Count a child branch of ``group_id`` settled: whether its run needs a pass now.

    The row's update serialises the group's children, and each reads the count its
    own update left, so exactly the one that brings it to zero sees zero. A failure
    wakes the run at once (a fail-fast join cancels the rest); a group already
    joined needs nothing.
    """
    counted = (
        store.steps()
        .filter(id=group_id, status=StepStatus.RUNNING)
        .update(open_branches=F("open_branches") - 1)
    )
    if not counted:
        return False
    if failed:
        return True
    left = store.steps().order_by().filter(id=group_id).values_list("open_branches", flat=True)
    return any(n <= 0 for n in left)


def failed_group(store: WorkflowStore, run_id: uuid.UUID) -> str | None:
    """The name of a parallel group of the run whose fail-fast join failed, if any."""
    found = (
        store.steps()
        .order_by()
        .filter(run_id=run_id, kind=StepKind.PARALLEL, status=StepStatus.FAILED)
        .values_list("name", flat=True)
    )
    return next(iter(found), None)
