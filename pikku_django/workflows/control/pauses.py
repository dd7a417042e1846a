"""Pausing a queue: no worker claims its steps until it is resumed.

A pause is a row of ``pikku_queue_pause``: every claim of a queued step (a worker's
claim of ready steps, a retry, a claim that lapsed, the step a pass reaches, a run's
first step stored as it starts) checks it in the statement that takes the step, so it
holds across every worker at once and survives restarts of workers and databases.
Steps already running finish and settle as usual; nothing is cancelled. Passes go on
(they are not on a queue): a step of a paused queue that a pass reaches is stored,
waiting, and claimed once the queue is resumed.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import connections, transaction

from pikku_django.models import QueuePause
from pikku_django.workflows.control._pause_conditions import paused_look
from pikku_django.workflows.store import store_for

logger = logging.getLogger(__name__)

#: Seconds :func:`pause_queue` waits, at most, for claims begun before the pause
#: committed to end.
SETTLE_SECONDS = 5.0

#: The longest queue name (``WorkflowStep.queue``).
QUEUE_NAME_MAX = 100


class PauseChange(enum.StrEnum):
    """What :func:`pause_queue` or :func:`resume_queue` changed."""

    PAUSED = "paused"
    ALREADY_PAUSED = "already paused"
    RESUMED = "resumed"
    NOT_PAUSED = "not paused"


@dataclass(frozen=True)
class PausedQueue:
    """A paused queue: since when, by whom and why."""

    queue: str
    paused_at: datetime
    paused_by: str
    reason: str

    @classmethod
    def of(cls, row: QueuePause) -> PausedQueue:
        return cls(row.queue, row.paused_at, row.paused_by, row.reason)

    def as_json(self) -> dict[str, str]:
        """The pause as plain JSON (its time in ISO 8601)."""
        return {
            "queue": self.queue,
            "paused_at": self.paused_at.isoformat(),
            "paused_by": self.paused_by,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class QueuePauseResult:
    """The outcome of :func:`pause_queue` or :func:`resume_queue`: what changed, the
    pause in force afterwards (None once resumed), and whether every claim begun
    before a new pause committed had ended when it returned (see
    :data:`SETTLE_SECONDS`; None where the pause commits with the caller's
    transaction, and is waited for as that commits)."""

    change: PauseChange
    pause: PausedQueue | None
    settled: bool | None = True


def _database(using: str | None) -> str:
    if using is not None:
        return using
    from pikku_django.workflows.api import get_engine

    return get_engine().using


def _checked_name(queue: str) -> str:
    if not isinstance(queue, str):
        raise TypeError(f"A queue name is text, not {type(queue).__name__}")
    if not queue or len(queue) > QUEUE_NAME_MAX:
        raise ValueError(f"A queue name has 1 to {QUEUE_NAME_MAX} characters, not {len(queue)}")
    return queue


def pause_queue(
    queue: str, *, reason: str = "", paused_by: str = "", using: str | None = None
) -> QueuePauseResult:
    """Pause ``queue``: from the moment the pause commits no worker claims its steps
    (steps already running finish). ``reason`` and ``paused_by`` are shown wherever
    the pause is; ``using`` is the workflow database (default: the engine's).

    Outside a transaction the pause commits at once, and the call returns once the
    claims begun before it have ended (waiting up to :data:`SETTLE_SECONDS`;
    ``settled`` says whether they had); inside one it commits with it. A queue already
    paused keeps its pause as it was (:attr:`PauseChange.ALREADY_PAUSED`)."""
    queue = _checked_name(queue)
    alias = _database(using)
    store = store_for(alias)
    added = store.add_pause(queue, str(reason), str(paused_by))
    if not added.added:
        return QueuePauseResult(PauseChange.ALREADY_PAUSED, PausedQueue.of(added.row))
    paused_look.forget(alias)
    pause = PausedQueue.of(added.row)
    logger.info("Queue %r paused by %s: %s", queue, paused_by or "-", reason or "-")
    if connections[alias].in_atomic_block:
        transaction.on_commit(lambda: store.await_open_transactions(SETTLE_SECONDS), using=alias)
        return QueuePauseResult(PauseChange.PAUSED, pause, settled=None)
    settled = store.await_open_transactions(SETTLE_SECONDS)
    return QueuePauseResult(PauseChange.PAUSED, pause, settled=settled)


def resume_queue(queue: str, *, using: str | None = None) -> QueuePauseResult:
    """Resume ``queue``: its steps are claimable again, and idle workers are told of
    the work at once where new work is announced (PostgreSQL). A queue that is not
    paused is left as it is (:attr:`PauseChange.NOT_PAUSED`)."""
    queue = _checked_name(queue)
    alias = _database(using)
    store = store_for(alias)
    with store.atomic():
        deleted = store.remove_pause(queue)
        if deleted:
            store.notify()  # sent as this commits
    paused_look.forget(alias)
    if not deleted:
        return QueuePauseResult(PauseChange.NOT_PAUSED, None)
    logger.info("Queue %r resumed", queue)
    return QueuePauseResult(PauseChange.RESUMED, None)


def paused_queues(using: str | None = None) -> list[PausedQueue]:
    """The paused queues, by name."""
    rows = QueuePause.objects.using(_database(using)).order_by("queue")
    return [PausedQueue.of(row) for row in rows]


__all__ = [
    "SETTLE_SECONDS",
    "PauseChange",
    "PausedQueue",
    "QueuePauseResult",
    "pause_queue",
    "paused_queues",
    "resume_queue",
]
