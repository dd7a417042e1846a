"""A parallel group's new child branches, written together: their runs, steps and
first attempts in a few statements and one transaction, not a transaction each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows._values import Pause
from pikku_django.workflows.passes._recorder import StepRecorder
from pikku_django.workflows.runs._state import LEASE_TAKEN_RETRY
from pikku_django.workflows.store.run_writes import ChildBranch

#: The most branches one transaction writes.
BATCH = 100


@dataclass(frozen=True)
class NewChild:
    """A child branch reached in this pass and not stored yet."""

    name: str
    workflow: str
    input: Any


def store_children(recorder: StepRecorder, group: WorkflowStep, new: list[NewChild]) -> None:
    """Store ``new`` branches of ``group`` with their child runs, and remember them.

    Pause (the run is passed again a second later) if another pass of the run stored
    any of them meanwhile: this pass's view of the run is stale.
    """
    if not new:
        return
    try:
        steps = _write(recorder, group, new)
    except _StoredElsewhere:
        raise Pause(recorder.clock.now() + LEASE_TAKEN_RETRY) from None
    for step in steps:
        recorder.remember(step)


def _write(recorder: StepRecorder, group: WorkflowStep, new: list[NewChild]) -> list[WorkflowStep]:
    run, store, clock = recorder.run, recorder.store, recorder.clock
    wake_at = None if run.inline else clock.now()
    branches = [
        ChildBranch(
            child.name,
            WorkflowRun(
                workflow=child.workflow,
                input=child.input,
                inline=run.inline,
                priority=run.priority,
                wake_at=wake_at,
                trace_context=run.trace_context,
            ),
        )
        for child in new
    ]
    with store.atomic():
        steps = store.add_branches(run.id, group.id, branches, run.priority)
        if steps is None:
            raise _StoredElsewhere
        for branch in branches:
            recorder.states.events.run_started(branch.run, parent_run_id=run.id)
        store.notify()
    return steps


class _StoredElsewhere(Exception):
    """Another pass of this run stored some of the branches: roll this batch back."""
