"""Schedules as an intake: every ``pikku_worker`` starts the runs of due ticks."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from pikku_django.schedules.store import schedules
from pikku_django.schedules.ticks import start_due_ticks
from pikku_django.workflows.worker.intake import RunStarter, register_intake


class ScheduleIntake:
    """Due ticks of enabled schedules, as a source of new runs for the worker.

    Each look calls :func:`~pikku_django.schedules.start_due_ticks`, so a tick's run
    is started by whichever worker looks first, once, with no separate process.
    """

    name = "pikku.schedules"
    notify_payload: str | None = None

    def __init__(self) -> None:
        self._next_due: datetime | None = None

    def start_waiting(self, engine: RunStarter, limit: int) -> int:
        report = start_due_ticks(using=engine.using)
        self._next_due = report.next_due
        return len(report.started)

    def seconds_until_due(self, engine: RunStarter) -> float | None:
        """Seconds until the next tick the last look found (None: none, or due already),
        so that a worker looks again at the tick rather than up to a poll later."""
        due = self._next_due
        if due is None:
            return None
        seconds = (due - timezone.now()).total_seconds()
        return seconds if seconds > 0 else None

    def has_waiting(self, engine: RunStarter) -> bool:
        due = schedules(engine.using).filter(next_tick_at__lte=timezone.now())
        return bool(due.exists())


def register() -> None:
    """Make workers start the runs of due ticks (from the AppConfig)."""
    register_intake(ScheduleIntake())
