"""System checks for declared schedules and the SCHEDULE_* settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from pikku_django.conf import pikku_settings
from pikku_django.schedules.cron import parse_timezone
from pikku_django.schedules.declarations import parse_missed, read_declarations
from pikku_django.schedules.errors import ScheduleError


@checks.register(checks.Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every declared schedule must have a valid cron expression, time zone and options."""
    if not isinstance(getattr(settings, "PIKKU", None) or {}, dict):
        return []  # pikku_django.E001 reports it
    if not pikku_settings.well_typed("SCHEDULES"):
        return _check_settings()  # check_settings reports it
    errors: list[checks.CheckMessage] = [
        checks.Error(
            str(exc),
            hint="Fix the schedule's declaration; it does not start runs until then.",
            id="pikku_django.E301",
        )
        for exc in read_declarations().errors
    ]
    errors += _check_settings()
    return errors


def _check_settings() -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []

    def error(message: str) -> None:
        errors.append(checks.Error(message, id="pikku_django.E302"))

    # The type and range of every SCHEDULE_* key is reported by pikku_django.checks
    # (check_settings); here, what a value of the right type means.
    zone = pikku_settings.SCHEDULE_TIMEZONE
    if zone is not None and pikku_settings.well_typed("SCHEDULE_TIMEZONE"):
        try:
            parse_timezone(zone)
        except ScheduleError as exc:
            error(f"PIKKU['SCHEDULE_TIMEZONE']: {exc}")
    if pikku_settings.well_typed("SCHEDULE_MISSED"):
        try:
            parse_missed(pikku_settings.SCHEDULE_MISSED, "PIKKU['SCHEDULE_MISSED']")
        except ScheduleError as exc:
            error(str(exc))
    return errors
