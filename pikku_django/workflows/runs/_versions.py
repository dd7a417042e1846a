"""Workflow versions: what each run records, which runs a worker passes, and
``ctx.patched`` markers that let old and new code replay the same runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pikku_django.models import StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows.errors import UnknownPatchError, WorkflowDefinitionError
from pikku_django.workflows.passes._determinism import check_new_step, unvisited

#: The prefix of a step that records a ``ctx.patched`` change id.
PATCH_PREFIX = "patch:"

if TYPE_CHECKING:
    from pikku_django.workflows.passes._context_api import StepCalls
    from pikku_django.workflows.registry import WorkflowDefinition
    from pikku_django.workflows.runs._state import RunStates


def version_admitted(
    states: RunStates, definition: WorkflowDefinition, run: WorkflowRun, carried_only: bool
) -> bool:
    """Whether this code may pass ``run``; a run that records no version yet (made by
    an intake) records this code's now. With ``carried_only``, a run of a version
    this code does not carry is left to the workers that carry it."""
    if not run.version:
        if definition.version:  # (a workflow without versions, e.g. a task's, has none)
            states.store.record_version(run.id, definition.version)
            run.version = definition.version
        return True
    return not carried_only or run.version in definition.carried_versions


def _any_unvisited(steps: Mapping[str, WorkflowStep], seen: Mapping[str, int]) -> bool:
    """Whether the pass has recorded steps left to reach: at once while more steps are
    recorded than it has reached (as in most of a replay), else by their names."""
    return len(steps) > sum(seen.values()) or bool(unvisited(steps, seen))


def check_no_unknown_patch(ctx: StepCalls, new_step: str | None) -> None:
    """Raise :class:`UnknownPatchError` when the pass is about to store ``new_step``
    (None: end the run) although the run recorded a ``ctx.patched`` branch this code
    never reached: the run was taken further by code this worker does not carry."""
    steps = ctx._recorder.steps
    if not steps.patch_markers:  # most runs have none
        return
    markers = [s.name for s in unvisited(steps, ctx._seen) if s.kind == StepKind.PATCH]
    if markers:
        what = "The run would end here" if new_step is None else f"Step {new_step!r} is new"
        raise UnknownPatchError(
            f"{what}, but the run went past {markers[0]!r} under newer "
            f"code: this code does not call ctx.patched({markers[0][len(PATCH_PREFIX) :]!r}) "
            "there. Run the newer code (or limit workers to the versions they carry)"
        )


def patched(ctx: StepCalls, change_id: str) -> bool:
    """``ctx.patched(change_id)``: True when the run reaches this point under code
    that has it (a marker step records that), False when the run was already past
    it (recorded steps beyond it that this pass has not reached), the same on every
    replay."""
    if not isinstance(change_id, str) or not change_id or "#" in change_id:
        raise WorkflowDefinitionError(
            f"ctx.patched() takes a non-empty str change id without '#', not {change_id!r}"
        )
    name = ctx._step_name(PATCH_PREFIX + change_id, internal=True)
    recorder = ctx._recorder
    step = ctx._existing(name, StepKind.PATCH, "", new=False)
    if step is not None:
        return True
    if _any_unvisited(recorder.steps, ctx._seen):
        return False  # recorded under code without the patch: keep to the old path
    check_new_step(ctx, name)
    marker = recorder.inline.create(
        recorder.run,
        name=name,
        kind=StepKind.PATCH,
        input={"change": change_id},
        status=StepStatus.SUCCEEDED,
        attempt=1,
        retries=0,
    )
    recorder.remember(marker)
    return True
