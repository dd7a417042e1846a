"""Starting, resuming and cancelling runs with the project's engine."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from pikku_django.models import WorkflowRun
from pikku_django.workflows.engine import WorkflowEngine

_lock = threading.Lock()
_engine: WorkflowEngine | None = None


def get_engine() -> WorkflowEngine:
    """The engine on ``PIKKU['WORKFLOW_DATABASE']`` with the project's lease service."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                _engine = WorkflowEngine()
    return _engine


def reset_engine() -> None:
    """Forget the engine, so the next call reads the settings again."""
    global _engine
    with _lock:
        _engine = None


def start_workflow(
    workflow: str | Callable[..., Any],
    input: Any = None,
    *,
    idempotency_key: str | None = None,
    inline: bool = False,
) -> WorkflowRun:
    """Start a run of ``workflow`` (its name or decorated function) and return it.

    The same ``idempotency_key`` for the same workflow returns the existing run.
    ``inline=True`` runs the whole workflow in this process before returning.
    """
    return get_engine().start(workflow, input, idempotency_key=idempotency_key, inline=inline)


def resume_workflow(run_id: uuid.UUID | str, data: Any = None) -> WorkflowRun:
    """Resume a suspended run; the ``ctx.suspend()`` it waits in returns ``data``."""
    return get_engine().resume(run_id, data)


def cancel_workflow(run_id: uuid.UUID | str) -> WorkflowRun:
    """Cancel a running or suspended run, and the child runs it waits for."""
    return get_engine().cancel(run_id)


def retry_workflow(run_id: uuid.UUID | str) -> WorkflowRun:
    """Retry a failed run from the step that failed it: one more attempt, history kept."""
    return get_engine().retry(run_id)
