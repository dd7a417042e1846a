"""Starting, resuming, cancelling and reading runs from async code (async views).

Each is its sync twin run by ``sync_to_async`` (on the request's thread for sync
code, as Django's own async ORM methods run), so it behaves the same, writes in
the same database, and raises the same errors.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Unpack

from asgiref.sync import sync_to_async

from pikku_django.models import WorkflowRun
from pikku_django.workflows.api import (
    cancel_workflow,
    get_engine,
    resume_workflow,
    retry_workflow,
    start_workflow,
    start_workflows,
)
from pikku_django.workflows.errors import WorkflowRunNotFoundError
from pikku_django.workflows.runs._bulk_start import BulkStartOptions
from pikku_django.workflows.runs._starting import StartOptions
from pikku_django.workflows.runs.status import RunSnapshot, snapshot


async def astart_workflow(
    workflow: str | Callable[..., Any], input: Any = None, **options: Unpack[StartOptions]
) -> WorkflowRun:
    """:func:`~pikku_django.workflows.start_workflow` for async code (the same options)."""
    return await sync_to_async(start_workflow)(workflow, input, **options)


async def astart_workflows(
    workflow: str | Callable[..., Any],
    inputs: Iterable[Any],
    *,
    idempotency_keys: Sequence[str | None] | None = None,
    **options: Unpack[BulkStartOptions],
) -> list[WorkflowRun]:
    """:func:`~pikku_django.workflows.start_workflows` for async code (the same options)."""
    return await sync_to_async(start_workflows)(
        workflow, list(inputs), idempotency_keys=idempotency_keys, **options
    )


async def aresume_workflow(run_id: uuid.UUID | str, data: Any = None) -> WorkflowRun:
    """:func:`~pikku_django.workflows.resume_workflow` for async code."""
    return await sync_to_async(resume_workflow)(run_id, data)


async def acancel_workflow(run_id: uuid.UUID | str) -> WorkflowRun:
    """:func:`~pikku_django.workflows.cancel_workflow` for async code."""
    return await sync_to_async(cancel_workflow)(run_id)


async def aretry_workflow(run_id: uuid.UUID | str) -> WorkflowRun:
    """:func:`~pikku_django.workflows.retry_workflow` for async code."""
    return await sync_to_async(retry_workflow)(run_id)


def workflow_status(run_id: uuid.UUID | str) -> RunSnapshot:
    """The run's status and each step's now (what the status endpoint answers, as
    ``.as_dict()``); WorkflowRunNotFoundError when there is no such run."""
    found = snapshot(run_id, get_engine().using)
    if found is None:
        raise WorkflowRunNotFoundError(f"No workflow run has id {str(run_id)!r}")
    return found


async def aworkflow_status(run_id: uuid.UUID | str) -> RunSnapshot:
    """:func:`workflow_status` for async code."""
    return await sync_to_async(workflow_status)(run_id)
