"""Published values: named values a run sets as it goes (``ctx.set_event``), that
callers read and the status stream carries.

Each set is a step of the replay log, so a replayed pass does not write it again
and readers never see an older value come back.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError

from pikku_django.models import StepKind, StepStatus
from pikku_django.workflows._values import to_json
from pikku_django.workflows.errors import WorkflowDefinitionError, WorkflowRunNotFoundError
from pikku_django.workflows.passes._inline_steps import fresh

if TYPE_CHECKING:
    from pikku_django.workflows.passes._context_api import StepCalls
    from pikku_django.workflows.store import WorkflowStore

#: The prefix of a published value's step: ``publish:<name>``.
PUBLISH_PREFIX = "publish:"

#: The name ``ctx.set_progress`` publishes under.
PROGRESS = "progress"


def set_event(ctx: StepCalls, name: str, value: Any) -> None:
    """``ctx.set_event``: publish ``value`` under ``name`` (once per call site)."""
    if not isinstance(name, str) or not name or len(name) > 200 or "#" in name or "\x00" in name:
        raise WorkflowDefinitionError(
            f"A published value's name is a non-empty str of at most 200 characters "
            f"without '#' or NUL, not {name!r}"
        )
    step_name = ctx._step_name(PUBLISH_PREFIX + name, internal=True)
    if ctx._existing(step_name, StepKind.PUBLISH, name) is not None:
        return
    payload = to_json(value, f"The published value {name!r}")
    recorder = ctx._recorder
    store = recorder.store
    run = recorder.run
    with store.atomic():
        # The run's row lock: two passes of one run never lose each other's values.
        store.lock_run(run.id)
        step = recorder.inline.create(
            run,
            name=step_name,
            kind=StepKind.PUBLISH,
            function=name,
            input=None,
            result=payload,
            status=StepStatus.SUCCEEDED,
            attempt=1,
            retries=0,
        )
        values = store.publish(run.id, name, step.result)
    run.published = values
    recorder.remember(step)


def published_values(store: WorkflowStore, run_id: uuid.UUID | str) -> dict[str, Any]:
    """The values the run has published, by name (empty when none)."""
    try:
        found = store.runs().filter(id=run_id).values_list("published", flat=True)
        rows = list(found[:1])
    except (ValidationError, ValueError, TypeError) as exc:
        raise WorkflowRunNotFoundError(f"No workflow run has id {run_id!r}") from exc
    if not rows:
        raise WorkflowRunNotFoundError(f"No workflow run has id {run_id!r}")
    value = rows[0]
    return fresh(value) if isinstance(value, dict) else {}
