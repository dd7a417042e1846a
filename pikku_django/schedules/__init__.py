"""Cron schedules: declared workflows started once per tick by whichever worker sees it first.

Declare a schedule with ``@workflow(schedule="0 3 * * *", timezone="Europe/Helsinki")``
or in ``PIKKU["SCHEDULES"]``; :func:`sync_schedules` records the declarations as
:class:`~pikku_django.models.Schedule` rows, and every worker calls
:func:`start_due_ticks` on each poll.
"""

from pikku_django.schedules import checks as _checks  # noqa: F401  (registers the check)
from pikku_django.schedules.cron import Cron, parse_timezone
from pikku_django.schedules.declarations import (
    Declarations,
    ScheduleSpec,
    read_declarations,
)
from pikku_django.schedules.errors import ScheduleError, ScheduleNotFoundError
from pikku_django.schedules.store import (
    SwitchResult,
    SyncReport,
    disable_schedule,
    enable_schedule,
    get_schedule,
    sync_schedules,
    tick_key,
    trigger_schedule,
)
from pikku_django.schedules.ticks import (
    SkippedTicks,
    TickFailure,
    TickPlan,
    TickReport,
    TickStart,
    plan_ticks,
    start_due_ticks,
)

__all__ = [
    "Cron",
    "Declarations",
    "ScheduleError",
    "ScheduleNotFoundError",
    "ScheduleSpec",
    "SkippedTicks",
    "SwitchResult",
    "SyncReport",
    "TickFailure",
    "TickPlan",
    "TickReport",
    "TickStart",
    "disable_schedule",
    "enable_schedule",
    "get_schedule",
    "parse_timezone",
    "plan_ticks",
    "read_declarations",
    "start_due_ticks",
    "sync_schedules",
    "tick_key",
    "trigger_schedule",
]
