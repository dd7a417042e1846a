"""A run's opening step: the queued step its first pass would reach, stored with the
run so that a worker claims it straight from the queue, with no pass before it."""

from __future__ import annotations

from pikku_django.models import StepKind, WorkflowRun
from pikku_django.workflows import registry
from pikku_django.workflows._values import NewStep, to_json
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.passes._step_options import resolve_step_options


def opening_step(
    definition: registry.WorkflowDefinition, run: WorkflowRun, config: EngineConfig
) -> NewStep | None:
    """The step of ``definition.opening`` for the new ``run``, its options resolved as
    the first pass's ``ctx.do`` resolves them; None when the workflow declares none, or
    the step would not go to the queue (the first pass then stores it, as usual)."""
    if definition.opening is None:
        return None
    opening = definition.opening(run.id, run.input)
    options = resolve_step_options(config, opening.function, run_queue=run.queue, **opening.options)
    if options.kind != StepKind.QUEUED or registry.get_step(options.function) is None:
        return None
    payload = to_json(opening.data, f"The input of step {opening.name!r}")
    return NewStep.of(run, opening.name, StepKind.QUEUED, options, payload)
