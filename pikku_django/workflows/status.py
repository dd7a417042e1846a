"""A run's status as the stream and the status endpoint report it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from pikku_django.models import TERMINAL_RUN_STATUSES, RunStatus, WorkflowRun, WorkflowStep
from pikku_django.models.fields import shown
from pikku_django.workflows._listen import ChannelListener
from pikku_django.workflows.store import CHANNEL


@dataclass(frozen=True)
class RunSnapshot:
    """The run's status and each step's, at one moment."""

    run_id: str
    workflow: str
    status: str
    suspend_reason: str
    steps: tuple[tuple[str, str, int], ...]  # (name, status, attempt)
    output: Any = None
    error: Any = None
    #: The values the run published (``ctx.set_event``), by name.
    published: Any = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def suspended(self) -> bool:
        return self.status == RunStatus.SUSPENDED

    def changes_from(self, other: RunSnapshot | None) -> bool:
        return other is None or (self.status, self.steps, self.published) != (
            other.status,
            other.steps,
            other.published,
        )

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run": self.run_id,
            "workflow": self.workflow,
            "status": self.status,
            "steps": [
                {"name": name, "status": status, "attempt": attempt}
                for name, status, attempt in self.steps
            ],
        }
        if self.published:
            data["published"] = self.published
        if self.suspended:
            data["reason"] = self.suspend_reason
        if self.terminal:
            data["output"] = self.output
            data["error"] = (
                {"type": self.error.get("type"), "message": self.error.get("message")}
                if isinstance(self.error, dict)
                else None
            )
        return data


def snapshot(run_id: uuid.UUID | str, using: str) -> RunSnapshot | None:
    """Read a run and its steps; None when there is no such run."""
    run = (
        WorkflowRun.objects.using(using)
        .filter(id=run_id)
        .only("workflow", "status", "suspend_reason", "output", "error", "published")
        .first()
    )
    if run is None:
        return None
    steps = tuple(
        WorkflowStep.objects.using(using)
        .filter(run_id=run.id)
        .order_by("id")
        .values_list("name", "status", "attempt")
    )
    return RunSnapshot(
        run_id=str(run.id),
        workflow=run.workflow,
        status=run.status,
        suspend_reason=run.suspend_reason,
        steps=steps,
        output=shown(run.output),
        error=run.error,
        published=shown(run.published),
    )


class WorkNotifications:
    """One PostgreSQL ``LISTEN`` per process, waking every stream waiting on it."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._subscribers: set[Callable[[], None]] = set()
        self.channel = ChannelListener(using, CHANNEL, self._notified)

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on the listening thread) on each notification, until the
        function returned is called. Without LISTEN (not PostgreSQL) it is never called."""
        self._ensure_listening()
        with self._lock:
            self._subscribers.add(callback)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.discard(callback)

        return unsubscribe

    def wait(self, timeout: float) -> None:
        """Return on the next notification, or after ``timeout`` seconds."""
        self._ensure_listening()
        with self._changed:
            self._changed.wait(timeout)

    def _ensure_listening(self) -> None:
        if connections[self.using].vendor != "postgresql":
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self.channel.run,
                    args=(threading.Event(),),
                    name="pikku-stream-listen",
                    daemon=True,
                )
                self._thread.start()

    def _notified(self, payload: str) -> None:
        with self._changed:
            self._changed.notify_all()
        with self._lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            callback()


_notifications: dict[str, WorkNotifications] = {}
_notifications_lock = threading.Lock()


def notifications(using: str) -> WorkNotifications:
    with _notifications_lock:
        if using not in _notifications:
            _notifications[using] = WorkNotifications(using)
        return _notifications[using]
