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

    if pikku_settings.SCHEDULE_TIMEZONE is not None:
        try:
            parse_timezone(pikku_settings.SCHEDULE_TIMEZONE)
        except ScheduleError as exc:
            error(f"PIKKU['SCHEDULE_TIMEZONE']: {exc}")
    try:
        parse_missed(pikku_settings.SCHEDULE_MISSED, "PIKKU['SCHEDULE_MISSED']")
    except ScheduleError as exc:
        error(str(exc))
    limit = pikku_settings.SCHEDULE_CATCHUP_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        error(f"PIKKU['SCHEDULE_CATCHUP_LIMIT'] must be an int from 1 to 10000, not {limit!r}")
    grace = pikku_settings.SCHEDULE_GRACE
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
        error(f"PIKKU['SCHEDULE_GRACE'] must be a number of seconds, 0 or more, not {grace!r}")
    return errors
