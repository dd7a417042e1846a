"""Starting runs: the options a start takes (written once, for every entry point),
the workflow it names, and the runs intakes create in the caller's transaction."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypedDict

from django.utils import timezone

from pikku_django import signals
from pikku_django.models import WorkflowRun
from pikku_django.workflows import registry
from pikku_django.workflows.control._debounce import check_debounce
from pikku_django.workflows.durations import Duration
from pikku_django.workflows.errors import WorkflowNotFoundError
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.runs._lifecycle import RunLifecycle
from pikku_django.workflows.runs._options import resolve_run_options
from pikku_django.workflows.store import NewRun

logger = workflow_logger(__name__)


class StartOptions(TypedDict, total=False):
    """What a start takes besides the workflow and its input, each as
    :func:`~pikku_django.workflows.start_workflow` describes it (every key optional)."""

    idempotency_key: str | None
    inline: bool
    priority: int | None
    queue: str | None
    start_at: datetime | None
    delay: Duration | None
    concurrency_key: str | None
    concurrency_limit: int | None
    deadline: datetime | None
    timeout: Duration | None
    debounce: Duration | None


def check_start_options(options: dict[str, Any]) -> None:
    """TypeError naming an argument that no start takes."""
    unknown = sorted(set(options) - StartOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"A start takes no argument {unknown[0]!r}")


def workflow_definition(workflow: str | Callable[..., Any]) -> registry.WorkflowDefinition:
    """The registered workflow ``workflow`` names; WorkflowNotFoundError if none."""
    definition = registry.get_workflow(workflow)
    if definition is None:
        raise WorkflowNotFoundError(
            f"No workflow is registered as {workflow!r}. Registered: "
            f"{', '.join(registry.workflow_names()) or 'none'}"
        )
    return definition


class RunStarts:
    """Creates runs: one start with its options, or intakes' batches."""

    def __init__(self, lifecycle: RunLifecycle) -> None:
        self.lifecycle = lifecycle
        self.states = lifecycle.states
        self.store = lifecycle.store

    def start(
        self, workflow: str | Callable[..., Any], input: Any, options: StartOptions
    ) -> tuple[WorkflowRun, bool]:
        """Create a run (or find the one with its idempotency key): the run, and
        whether this call created it."""
        check_start_options(dict(options))
        definition = workflow_definition(workflow)
        key = options.get("idempotency_key")
        inline = options.get("inline", False)
        window = check_debounce(options.get("debounce"), key, inline)
        resolved = resolve_run_options(
            definition,
            self.states.clock.now(),
            priority=options.get("priority"),
            queue=options.get("queue"),
            start_at=options.get("start_at"),
            delay=options.get("delay"),
            inline=inline,
            concurrency_key=options.get("concurrency_key"),
            concurrency_limit=options.get("concurrency_limit"),
            input=input,
            deadline=options.get("deadline"),
            timeout=options.get("timeout"),
            debounce=window,
        )
        return self.lifecycle.start(
            definition,
            input,
            idempotency_key=key,
            inline=inline,
            options=resolved,
            debounced=window is not None,
        )

    def create_runs(self, runs: Sequence[NewRun]) -> list[uuid.UUID]:
        """Create runs of registered workflows in the caller's transaction (see
        :meth:`~pikku_django.workflows.WorkflowEngine.create_runs`)."""
        before = timezone.now()
        now = self.states.clock.now()
        ids = self.store.create_runs([_with_defaults(new, now) for new in runs], now)
        if self.states.events.listened(signals.run_started) or logger.isEnabledFor(logging.INFO):
            # The runs made now, not the existing ones whose key was taken.
            for run in self.store.runs().filter(id__in=ids, created_at__gte=before):
                with log_context(workflow=run.workflow, run_id=str(run.id)):
                    logger.info("Run started")
                self.states.events.run_started(run)
        return ids


def _with_defaults(new: NewRun, now: datetime) -> NewRun:
    definition = registry.get_workflow(new.workflow)
    if definition is None or new.options is not None:
        return new
    return replace(new, options=resolve_run_options(definition, now, input=new.input))
