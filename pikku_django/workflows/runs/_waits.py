"""Waiting for a run to end: woken by its announced end where the database can listen
(:mod:`pikku_django.wakeups`), by polling elsewhere."""

from __future__ import annotations

import threading
import time
import uuid

from django.core.exceptions import ValidationError

from pikku_django.models import TERMINAL_RUN_STATUSES, WorkflowRun
from pikku_django.wakeups import RUN_DONE_CHANNEL, listen_alias, shared_listener
from pikku_django.workflows.errors import RunWaitTimeoutError, WorkflowRunNotFoundError

#: Seconds between looks when nothing wakes the wait (listening: a safety net).
POLL_INTERVAL = 0.2
NOTIFIED_POLL_INTERVAL = 2.0


def wait_for_run(
    using: str,
    run_id: uuid.UUID | str,
    timeout: float,
    poll_interval: float | None = None,
    *,
    notifying: bool = True,
) -> WorkflowRun:
    """The run once it has ended (completed, failed or cancelled);
    :class:`RunWaitTimeoutError` when it has not within ``timeout`` seconds. With
    ``notifying``, woken by the run's end where the database can listen; else it polls."""
    if timeout < 0:
        raise ValueError(f"timeout must be 0 or more seconds, not {timeout!r}")
    deadline = time.monotonic() + timeout
    listener = (
        shared_listener(using, RUN_DONE_CHANNEL)
        if notifying and listen_alias(using) is not None
        else None
    )
    woken = threading.Event()
    unsubscribe = listener.subscribe(woken.set, str(run_id)) if listener is not None else None
    try:
        if listener is not None:
            listener.wait_listening(2.0)
        while True:
            run = _read(using, run_id)
            if run.status in TERMINAL_RUN_STATUSES:
                return run
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunWaitTimeoutError(run.id, run.status, timeout)
            if poll_interval:
                interval = poll_interval
            elif listener is not None:
                interval = listener.interval(POLL_INTERVAL, NOTIFIED_POLL_INTERVAL)
            else:
                interval = POLL_INTERVAL
            woken.wait(min(interval, left))
            woken.clear()
    finally:
        if unsubscribe is not None:
            unsubscribe()


def _read(using: str, run_id: uuid.UUID | str) -> WorkflowRun:
    try:
        return WorkflowRun.objects.using(using).get(id=run_id)
    except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError) as exc:
        raise WorkflowRunNotFoundError(f"No workflow run has id {run_id!r}") from exc
