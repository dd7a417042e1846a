"""Deadlines as an intake: every worker's due-work look enforces them."""

from __future__ import annotations

from datetime import datetime

from pikku_django.workflows.control._deadlines import next_deadline
from pikku_django.workflows.engine import WorkflowEngine
from pikku_django.workflows.worker.intake import RunStarter, register_intake


class DeadlineIntake:
    """Runs past their deadline and suspensions past their timeout, handled by
    whichever worker looks first (each change is guarded, so once)."""

    name = "pikku.deadlines"
    notify_payload: str | None = None

    def __init__(self) -> None:
        self._next_due: datetime | None = None

    def start_waiting(self, engine: RunStarter, limit: int) -> int:
        if not isinstance(engine, WorkflowEngine):
            return 0
        enforced = engine.deadlines.enforce(limit)
        self._next_due = next_deadline(engine.store)
        return enforced

    def seconds_until_due(self, engine: RunStarter) -> float | None:
        """Seconds until the next deadline or suspension timeout the last look found
        (None: none, or past already), so that a worker that looks for work rarely
        (notified on PostgreSQL) still enforces it on time."""
        due = self._next_due
        if due is None or not isinstance(engine, WorkflowEngine):
            return None
        seconds = (due - engine.clock.now()).total_seconds()
        return seconds if seconds > 0 else None

    def has_waiting(self, engine: RunStarter) -> bool:
        return isinstance(engine, WorkflowEngine) and engine.deadlines.has_due()


def register() -> None:
    """Make workers enforce run deadlines and suspension timeouts (from the AppConfig)."""
    register_intake(DeadlineIntake())
