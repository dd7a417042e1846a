"""Starting, resuming and cancelling runs with the project's engine."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Unpack

from pikku_django.models import WorkflowRun
from pikku_django.workflows.compose._events import SentEvent
from pikku_django.workflows.engine import WorkflowEngine
from pikku_django.workflows.runs._bulk_start import BulkStartOptions
from pikku_django.workflows.runs._sending import RunRef
from pikku_django.workflows.runs._starting import StartOptions

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
    workflow: str | Callable[..., Any], input: Any = None, **options: Unpack[StartOptions]
) -> WorkflowRun:
    """Start a run of ``workflow`` (its name or decorated function) and return it.

    The options (:class:`~pikku_django.workflows.StartOptions`, each optional):
    the same ``idempotency_key`` for the same workflow returns the existing run
    (the other arguments are then ignored). ``inline=True`` runs the whole workflow
    in this process before returning. Each of these overrides the default given
    to ``@workflow(...)``:

    - ``priority``: -100 to 100 (default 0), higher first; the run's passes and its
      steps are claimed highest priority first, first in first out within one.
    - ``queue``: the queue of the run's steps that name none (neither in
      ``ctx.do(..., queue=...)`` nor ``@step(queue=...)``); default ``"default"``.
    - ``start_at`` (a timezone-aware datetime) or ``delay`` (seconds, a timedelta
      or text like ``"10min"``), not both: no worker passes the run before then.
    - ``concurrency_key`` (e.g. a customer id) and ``concurrency_limit`` (default 1):
      runs sharing the key are in progress at most that many at a time; the others
      wait, and start in start order as earlier ones end.
    - ``deadline`` (a timezone-aware datetime) or ``timeout`` (a duration from the
      run's start), not both: a run that has not ended by then fails with
      ``WorkflowTimeoutError``, its waiting steps and child runs cancelled.

    ``debounce`` (a duration; needs ``idempotency_key``) collapses the starts with
    that key into one run that starts once no start has come for that long, with
    the latest start's input; a start after its run has begun makes a new run.
    """
    return get_engine().start(workflow, input, **options)


def start_workflows(
    workflow: str | Callable[..., Any],
    inputs: Iterable[Any],
    *,
    idempotency_keys: Sequence[str | None] | None = None,
    **options: Unpack[BulkStartOptions],
) -> list[WorkflowRun]:
    """Start a run of ``workflow`` per input, together, and return them in order.

    The runs are written a batch of a thousand per statement, in one transaction (the
    caller's, if any: a rolled-back ``transaction.atomic()`` leaves none), and idle
    workers are told once per batch, as it commits. Every input is checked before
    anything is written: an unknown workflow, an input that is not JSON or a bad
    option raises and starts nothing.

    ``idempotency_keys`` gives one key (or None) per input: a key whose run exists
    returns that run, and inputs sharing a key share one run. The options
    (:class:`~pikku_django.workflows.BulkStartOptions`: ``priority``, ``queue``,
    ``start_at`` or ``delay``, ``concurrency_key`` and ``concurrency_limit``,
    ``deadline`` or ``timeout``) apply to every run, as
    :func:`start_workflow` describes them; ``inline`` and ``debounce`` are for
    single starts.
    """
    return get_engine().start_many(workflow, inputs, idempotency_keys=idempotency_keys, **options)


def resume_workflow(run_id: uuid.UUID | str, data: Any = None) -> WorkflowRun:
    """Resume a suspended run; the ``ctx.suspend()`` it waits in returns ``data``."""
    return get_engine().resume(run_id, data)


def cancel_workflow(run_id: uuid.UUID | str) -> WorkflowRun:
    """Cancel a running or suspended run, and the child runs it waits for."""
    return get_engine().cancel(run_id)


def retry_workflow(run_id: uuid.UUID | str) -> WorkflowRun:
    """Retry a failed run from the step that failed it: one more attempt, history kept."""
    return get_engine().retry(run_id)


def send_event(
    run: RunRef, name: str, data: Any = None, *, event_id: str | None = None
) -> SentEvent:
    """Send the event ``name`` with ``data`` to a run: by id, as a row, or by
    ``RunKey(workflow, idempotency_key)``.

    Durable and idempotent by ``event_id`` (default: a new id each call): the same
    id again changes nothing. A pending ``ctx.wait_for_event(name)`` of the run gets
    it and the run is woken, in the caller's transaction; an event sent before its
    wait is kept for it. Nothing is stored for a run that has ended.
    """
    return get_engine().events.send(run, name, data, event_id=event_id)


def send_event_with_start(
    workflow: str | Callable[..., Any],
    idempotency_key: str,
    name: str,
    data: Any = None,
    *,
    input: Any = None,
    event_id: str | None = None,
    priority: int | None = None,
    queue: str | None = None,
) -> SentEvent:
    """As :func:`send_event` to the run of ``workflow`` with ``idempotency_key``,
    first starting it (with ``input``) when no run holds the key: concurrent
    senders start one run, and each event reaches it."""
    return get_engine().events.send_with_start(
        workflow,
        idempotency_key,
        name,
        data,
        input=input,
        event_id=event_id,
        priority=priority,
        queue=queue,
    )


def published_values(run_id: uuid.UUID | str) -> dict[str, Any]:
    """The values a run has published with ``ctx.set_event``, by name."""
    return get_engine().events.published_values(run_id)


def wait_for_run(
    run_id: uuid.UUID | str, timeout: float, *, poll_interval: float | None = None
) -> WorkflowRun:
    """Block until the run has ended (completed, failed or cancelled) and return it;
    :class:`~pikku_django.workflows.RunWaitTimeoutError` after ``timeout`` seconds.
    PostgreSQL wakes the wait with NOTIFY the moment the run ends; elsewhere it
    polls every ``poll_interval`` seconds (default 0.2)."""
    return get_engine().events.wait_for_run(run_id, timeout, poll_interval=poll_interval)


async def await_run(
    run_id: uuid.UUID | str, timeout: float, *, poll_interval: float | None = None
) -> WorkflowRun:
    """:func:`wait_for_run` for async code: waits in a worker thread (whose database
    connections are closed when it is done), not on the event loop."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    def wait() -> WorkflowRun:
        try:
            return wait_for_run(run_id, timeout, poll_interval=poll_interval)
        finally:
            connections.close_all()

    return await sync_to_async(wait, thread_sensitive=False)()
