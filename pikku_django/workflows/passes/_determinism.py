"""What a pass may record as a new step: only once it has reached every step the run
recorded earlier (a replay that passes recorded steps by is not deterministic, e.g. a
step name built from a random number, the time or an id), and no more steps than
the run's limit (``PIKKU["MAX_STEPS_PER_RUN"]`` or ``@workflow(max_steps=...)``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pikku_django.models import WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows._values import Pause
from pikku_django.workflows.errors import (
    NonDeterministicWorkflowError,
    WorkflowError,
    WorkflowStepLimitError,
)
from pikku_django.workflows.logcontext import workflow_logger

if TYPE_CHECKING:
    from pikku_django.workflows.passes._context_api import StepCalls
    from pikku_django.workflows.passes._recorder import StepRecorder

logger = workflow_logger(__name__)

#: How many of the steps a replay did not reach its error names.
NAMED = 5


def visited_names(seen: Mapping[str, int]) -> set[str]:
    """The full step names a pass has reached, from its count of each name."""
    return {base if i == 0 else f"{base}#{i}" for base, count in seen.items() for i in range(count)}


def unvisited(steps: Mapping[str, WorkflowStep], seen: Mapping[str, int]) -> list[WorkflowStep]:
    """The recorded steps this pass has not reached (yet)."""
    reached = visited_names(seen)
    return [step for name, step in steps.items() if name not in reached]


def check_new_step(ctx: StepCalls, name: str) -> None:
    """Raise before the pass records ``name`` as a new step: NonDeterministicWorkflowError
    when steps recorded earlier were not reached by this replay, WorkflowStepLimitError
    when the run holds its limit of steps. The error is kept on the recorder, so the
    pass fails the run with it even when the body catches it."""
    recorder = ctx._recorder
    if recorder.refusal is not None:
        raise recorder.refusal
    if ctx._reached < ctx._recorded_at_start:
        skipped = [step.name for step in unvisited(recorder.steps, ctx._seen)]
        if skipped:
            _refuse(recorder, NonDeterministicWorkflowError(_skipped_message(name, skipped)))
    limit = max_steps(recorder.run.workflow, recorder.config.max_steps_per_run)
    if len(recorder.steps) + recorder.deferred >= limit:
        _refuse(recorder, WorkflowStepLimitError(recorder.run.id, name, limit))


def max_steps(workflow: str, default: int) -> int:
    """The most steps a run of ``workflow`` may record: its own limit, or ``default``."""
    definition = registry.get_workflow(workflow)
    if definition is not None and definition.max_steps is not None:
        return definition.max_steps
    return default


def replay_body(fn: Callable[..., Any], ctx: StepCalls, data: Any) -> Any:
    """``fn(ctx, data)``, the workflow body; a refusal of :func:`check_new_step` is
    raised however the body ends (returned, paused, or raised something else)."""
    recorder = ctx._recorder
    try:
        output = fn(ctx, data)
    except (Exception, Pause):
        if recorder.refusal is not None:
            raise recorder.refusal from None
        raise
    if recorder.refusal is not None:
        raise recorder.refusal
    return output


def _skipped_message(name: str, skipped: list[str]) -> str:
    shown = ", ".join(repr(s) for s in skipped[:NAMED])
    if len(skipped) > NAMED:
        shown += f" and {len(skipped) - NAMED} more"
    return (
        f"The replay reached new step {name!r} without reaching step(s) the run recorded "
        f"earlier: {shown}. A workflow must call the same steps, in the same order, on "
        "every replay: build step names from the input or from step results, never from "
        "random numbers, the time or new ids. To change a workflow that has runs in "
        "flight, branch on ctx.patched('change-id')"
    )


def _refuse(recorder: StepRecorder, error: WorkflowError) -> None:
    """Keep ``error`` as the pass's refusal, log it, and raise it."""
    recorder.refusal = error
    logger.error("Run %s fails: %s", recorder.run.id, error)
    raise error
