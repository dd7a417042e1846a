"""The errors schedules raise."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class ScheduleError(ImproperlyConfigured, ValueError):
    """A schedule's declaration is wrong: a bad cron expression, time zone or option."""


class ScheduleNotFoundError(LookupError):
    """No schedule row has the name asked for."""
