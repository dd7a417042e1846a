"""Debounced starts: the starts with one idempotency key inside a quiet window make
one run, with the latest input, that starts once no start has come for the window.

The key's run row is reused: each start inside the window replaces its input and
pushes its start back, but only while no worker has claimed its first pass (its
``wake_at`` is still its ``start_at``, and that is still to come). A start after
that frees the key from the run that began and makes a new one. The key's row is
locked while a start decides, and a worker's claim of the run locks it too, so
concurrent starters on PostgreSQL or MariaDB collapse into one run as well.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import IntegrityError

from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.workflows import registry
from pikku_django.workflows.durations import Duration
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.runs._options import RunOptions
from pikku_django.workflows.store import WorkflowStore

logger = workflow_logger(__name__)

#: How many times a start looks again when other starters change the key's run
#: between its read and its write.
ROUNDS = 20


def check_debounce(debounce: Duration | None, key: str | None, inline: bool) -> float | None:
    """The debounce window in seconds (None: not debounced); ValueError if it cannot be."""
    if debounce is None:
        return None
    window = registry.check_timeout(debounce, "debounce")
    if key is None:
        raise ValueError(
            "debounce needs an idempotency_key: the starts with the same key are the ones "
            "collapsed into one run"
        )
    if inline:
        raise ValueError("An inline run starts at once: it cannot be debounced")
    return window


def debounced_start(
    store: WorkflowStore,
    workflow: str,
    payload: Any,
    key: str,
    options: RunOptions,
    create: Callable[[], WorkflowRun],
    clock: Callable[[], datetime],
) -> tuple[WorkflowRun, bool]:
    """The key's waiting run with ``payload`` as its input and its start pushed back
    to ``options.start_at``, else a new run by ``create``: the run, and whether it
    is new. Concurrent starts of the key take turns where the store needs it."""
    with store.key_turn(workflow, key):
        return _debounced_start(store, workflow, payload, key, options, create, clock)


def _debounced_start(
    store: WorkflowStore,
    workflow: str,
    payload: Any,
    key: str,
    options: RunOptions,
    create: Callable[[], WorkflowRun],
    clock: Callable[[], datetime],
) -> tuple[WorkflowRun, bool]:
    runs = store.runs()
    for _ in range(ROUNDS):
        if not runs.filter(workflow=workflow, idempotency_key=key).exists():
            try:
                return create(), True
            except IntegrityError:
                continue  # another starter made it first: join its window
        with store.atomic():
            # Locked, so the run's state is read as it is now, not as a snapshot had it.
            existing = (
                runs.select_for_update()
                .filter(workflow=workflow, idempotency_key=key)
                .only("id", "status", "start_at", "wake_at")
                .first()
            )
            if existing is None:
                continue  # its key was freed meanwhile
            now = clock()  # the engine's clock, which claims judge start_at by
            waiting = (
                existing.status == RunStatus.RUNNING
                and existing.start_at is not None
                and existing.start_at > now
                and existing.wake_at == existing.start_at  # no worker has claimed it
            )
            if waiting:
                store.rewindow_run(existing.id, payload, options.start_at, options.deadline_at)
            else:
                # Its run began (or ended): free the key for a new run.
                store.free_key(existing.id)
        if waiting:
            logger.debug("Debounced start of %s: run %s waits on", workflow, existing.id)
            return runs.get(id=existing.id), False
    raise RuntimeError(
        f"Could not start {workflow!r} with idempotency key {key!r}: its run kept changing "
        f"under {ROUNDS} other starts"
    )
