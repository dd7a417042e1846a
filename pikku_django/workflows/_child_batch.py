"""A parallel group's new child branches, written together: their runs, steps and
first attempts in a few statements and one transaction, not a transaction each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import F

from pikku_django.models import StepAttempt, StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows._recorder import StepRecorder
from pikku_django.workflows._runs import LEASE_TAKEN_RETRY
from pikku_django.workflows._values import Pause

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
    names = [child.name for child in new]
    with store.atomic():
        # The group's row first: it is the one row every child's end updates.
        store.steps().filter(id=group.id).update(open_branches=F("open_branches") + len(new))
        if store.steps().filter(run_id=run.id, name__in=names).exists():
            raise _StoredElsewhere
        wake_at = None if run.inline else clock.now()
        runs = [
            WorkflowRun(
                workflow=child.workflow,
                input=child.input,
                inline=run.inline,
                priority=run.priority,
                wake_at=wake_at,
                trace_context=run.trace_context,
            )
            for child in new
        ]
        store.runs().bulk_create(runs)
        store.steps().bulk_create(
            WorkflowStep(
                run_id=run.id,
                name=child.name,
                kind=StepKind.CHILD,
                function=child.workflow,
                input=child.input,
                status=StepStatus.RUNNING,
                attempt=1,
                retries=0,
                priority=run.priority,
                child_run_id=child_run.id,
                group_id=group.id,
            )
            for child, child_run in zip(new, runs, strict=True)
        )
        steps = list(store.steps().filter(run_id=run.id, name__in=names))
        store.attempts().bulk_create(StepAttempt(step_id=step.id, attempt=1) for step in steps)
        for child_run in runs:
            recorder.states.events.run_started(child_run, parent_run_id=run.id)
        store.notify()
    return steps


class _StoredElsewhere(Exception):
    """Another pass of this run stored some of the branches: roll this batch back."""
