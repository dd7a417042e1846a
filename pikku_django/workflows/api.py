"""Starting, resuming and cancelling runs with the project's engine."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pikku_django.models import WorkflowRun
from pikku_django.workflows.durations import Duration
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
    priority: int | None = None,
    queue: str | None = None,
    start_at: datetime | None = None,
    delay: Duration | None = None,
    deadline: datetime | None = None,
    timeout: Duration | None = None,
    debounce: Duration | None = None,
) -> WorkflowRun:
    """Start a run of ``workflow`` (its name or decorated function) and return it.

    The same ``idempotency_key`` for the same workflow returns the existing run
    (the other arguments are then ignored). ``inline=True`` runs the whole workflow
    in this process before returning. Each of these overrides the default given
    to ``@workflow(...)``:

    - ``priority``: -100 to 100 (default 0), higher first; the run's passes and its
      steps are claimed highest priority first, first in first out within one.
    - ``queue``: the queue of the run's steps that name none (neither in
      ``ctx.do(..., queue=...)`` nor ``@step(queue=...)``); default ``"default"``.
    - ``start_at`` (a timezone-aware datetime) or ``delay`` (seconds, a timedelta
      or text like ``"10min"``), not both: no worker passes the run before then.
    - ``deadline`` (a timezone-aware datetime) or ``timeout`` (a duration from the
      run's start), not both: a run that has not ended by then fails with
      ``WorkflowTimeoutError``, its waiting steps and child runs cancelled.

    ``debounce`` (a duration; needs ``idempotency_key``) collapses the starts with
    that key into one run that starts once no start has come for that long, with
    the latest start's input; a start after its run has begun makes a new run.
    """
    return get_engine().start(
        workflow,
        input,
        idempotency_key=idempotency_key,
        inline=inline,
        priority=priority,
        queue=queue,
        start_at=start_at,
        delay=delay,
        deadline=deadline,
        timeout=timeout,
        debounce=debounce,
    )


def resume_workflow(run_id: uuid.UUID | str, data: Any = None) -> WorkflowRun:
    """Resume a suspended run; the ``ctx.suspend()`` it waits in returns ``data``."""
    return get_engine().resume(run_id, data)


def cancel_workflow(run_id: uuid.UUID | str) -> WorkflowRun:
    """Cancel a running or suspended run, and the child runs it waits for."""
    return get_engine().cancel(run_id)


def retry_workflow(run_id: uuid.UUID | str) -> WorkflowRun:
    """Retry a failed run from the step that failed it: one more attempt, history kept."""
    return get_engine().retry(run_id)
