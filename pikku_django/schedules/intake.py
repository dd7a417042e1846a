"""Schedules as an intake: every ``pikku_worker`` starts the runs of due ticks."""

from __future__ import annotations

from django.utils import timezone

from pikku_django.schedules.store import schedules
from pikku_django.schedules.ticks import start_due_ticks
from pikku_django.workflows.intake import RunStarter, register_intake


class ScheduleIntake:
    """Due ticks of enabled schedules, as a source of new runs for the worker.

    Each look calls :func:`~pikku_django.schedules.start_due_ticks`, so a tick's run
    is started by whichever worker looks first, once, with no separate process.
    """

    name = "pikku.schedules"
    notify_payload: str | None = None

    def start_waiting(self, engine: RunStarter, limit: int) -> int:
        return len(start_due_ticks(using=engine.using).started)

    def has_waiting(self, engine: RunStarter) -> bool:
        due = schedules(engine.using).filter(next_tick_at__lte=timezone.now())
        return bool(due.exists())


def register() -> None:
    """Make workers start the runs of due ticks (from the AppConfig)."""
    register_intake(ScheduleIntake())
