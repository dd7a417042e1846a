"""A new run's row, as every start builds it: its columns from the resolved options,
and the opening step or first step it is stored with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pikku_django.models import WorkflowRun
from pikku_django.workflows._values import NewStep
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.registry import WorkflowDefinition
from pikku_django.workflows.runs._opening_step import opening_step
from pikku_django.workflows.runs._options import RunOptions
from pikku_django.workflows.tracing import current_trace_context

#: Finds a new run's first step: its columns, or None (see ``_first_step``).
FindFirstStep = Callable[[WorkflowDefinition, WorkflowRun], "dict[str, Any] | None"]


@dataclass(frozen=True)
class RunRow:
    """A run to insert: the row, its opening step (or None) and when it falls due."""

    run: WorkflowRun
    opening: NewStep | None
    due: datetime


def check_idempotency_key(key: object) -> None:
    """ValueError unless ``key`` is None or a str of 1 to 255 characters."""
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 255):
        raise ValueError("idempotency_key must be a str of 1 to 255 characters")


def run_row(
    definition: WorkflowDefinition,
    payload: Any,
    idempotency_key: str | None,
    options: RunOptions,
    now: datetime,
    *,
    inline: bool,
    config: EngineConfig,
    find_first_step: FindFirstStep | None,
) -> RunRow:
    """The new run's row, with its opening step when its workflow declares one (see
    ``_opening``), else its first step found ahead by ``find_first_step`` (see
    ``_first_step``; None: not looked for)."""
    keyed = options.concurrency_key is not None
    due = options.due_at(now)
    run = WorkflowRun(
        workflow=definition.name,
        input=payload,
        inline=inline,
        idempotency_key=idempotency_key,
        trace_context=current_trace_context(),
        version=definition.version,
        **options.run_columns(now, inline=inline),
    )
    opening = None if inline or keyed else opening_step(definition, run, config)
    if opening is not None:
        run.wake_at = None  # its step is claimed from the queue; its settle wakes it
    elif not (inline or keyed) and find_first_step is not None:
        run.first_step = find_first_step(definition, run)
    return RunRow(run, opening, due)
