"""Workflow versions: what each run records, which runs a worker passes, and
``ctx.patched`` markers that let old and new code replay the same runs."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from pikku_django.models import StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows.errors import UnknownPatchError, WorkflowDefinitionError

if TYPE_CHECKING:
    from pikku_django.workflows._runs import RunStates
    from pikku_django.workflows.context import WorkflowContext
    from pikku_django.workflows.registry import WorkflowDefinition

#: The longest version a run records.
VERSION_MAX = 64

#: The prefix of a step that records a ``ctx.patched`` change id.
PATCH_PREFIX = "patch:"


def check_version(value: object, what: str) -> str:
    """``value`` as a version: a str of 1 to 64 characters."""
    if not isinstance(value, str) or not value.strip() or len(value) > VERSION_MAX:
        raise ImproperlyConfigured(
            f"workflow {what}= takes str versions of 1 to {VERSION_MAX} characters, not {value!r}"
        )
    return value


def code_version(fn: Callable[..., Any]) -> str:
    """A version made from the function's code: its source (or its bytecode)."""
    try:
        text = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = code.co_code + repr(code.co_consts).encode() if code is not None else b""
        text = text or repr(fn).encode()
    return "code-" + hashlib.sha256(text).hexdigest()[:16]


def version_admitted(
    states: RunStates, definition: WorkflowDefinition, run: WorkflowRun, carried_only: bool
) -> bool:
    """Whether this code may pass ``run``; a run that records no version yet (made by
    an intake) records this code's now. With ``carried_only``, a run of a version
    this code does not carry is left to the workers that carry it."""
    if not run.version:
        states.store.runs().filter(id=run.id, version="").update(version=definition.version)
        run.version = definition.version
        return True
    return not carried_only or run.version in definition.carried_versions


def visited_names(seen: Mapping[str, int]) -> set[str]:
    """The full step names a pass has reached, from its count of each name."""
    return {base if i == 0 else f"{base}#{i}" for base, count in seen.items() for i in range(count)}


def unvisited(steps: Mapping[str, WorkflowStep], seen: Mapping[str, int]) -> list[WorkflowStep]:
    """The recorded steps this pass has not reached (yet)."""
    reached = visited_names(seen)
    return [step for name, step in steps.items() if name not in reached]


def check_no_unknown_patch(
    steps: Mapping[str, WorkflowStep], seen: Mapping[str, int], new_step: str | None
) -> None:
    """Raise :class:`UnknownPatchError` when the pass is about to store ``new_step``
    (None: end the run) although the run recorded a ``ctx.patched`` branch this code
    never reached: the run was taken further by code this worker does not carry."""
    if not any(step.kind == StepKind.PATCH for step in steps.values()):
        return
    markers = [s.name for s in unvisited(steps, seen) if s.kind == StepKind.PATCH]
    if markers:
        what = "The run would end here" if new_step is None else f"Step {new_step!r} is new"
        raise UnknownPatchError(
            f"{what}, but the run went past {markers[0]!r} under newer "
            f"code: this code does not call ctx.patched({markers[0][len(PATCH_PREFIX) :]!r}) "
            "there. Run the newer code (or limit workers to the versions they carry)"
        )


def patched(ctx: WorkflowContext, change_id: str) -> bool:
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
    step = ctx._existing(name, StepKind.PATCH, "")
    if step is not None:
        return True
    if unvisited(recorder.steps, ctx._seen):
        return False  # recorded under code without the patch: keep to the old path
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
