"""Deadlines as an intake: every worker's due-work look enforces them."""

from __future__ import annotations

from pikku_django.workflows.engine import WorkflowEngine
from pikku_django.workflows.intake import RunStarter, register_intake


class DeadlineIntake:
    """Runs past their deadline and suspensions past their timeout, handled by
    whichever worker looks first (each change is guarded, so once)."""

    name = "pikku.deadlines"
    notify_payload: str | None = None

    def start_waiting(self, engine: RunStarter, limit: int) -> int:
        if not isinstance(engine, WorkflowEngine):
            return 0
        return engine.deadlines.enforce(limit)

    def has_waiting(self, engine: RunStarter) -> bool:
        return isinstance(engine, WorkflowEngine) and engine.deadlines.has_due()


def register() -> None:
    """Make workers enforce run deadlines and suspension timeouts (from the AppConfig)."""
    register_intake(DeadlineIntake())
