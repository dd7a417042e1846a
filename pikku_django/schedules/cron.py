"""Cron expressions read in a time zone, parsed and stepped through by cronsim.

Daylight saving follows ``zoneinfo`` the way cron itself does: a tick at a wall
time that a spring-forward change skips (02:30 in New York on the second Sunday
of March) happens at the first time after the gap (03:00 local), and a tick at a
wall time that a fall-back change repeats (01:30 in New York on the first Sunday
of November) happens once, at its first occurrence. Expressions whose hour field
is a wildcard or a step (``*/30 * * * *``) tick in both copies of a repeated hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from pikku_django.schedules.errors import ScheduleError

_ONE_MICROSECOND = timedelta(microseconds=1)


def parse_timezone(name: object) -> ZoneInfo:
    """The ``zoneinfo`` zone called ``name``, or a :class:`ScheduleError` saying why not."""
    if not isinstance(name, str) or not name.strip():
        raise ScheduleError(f"A time zone must be an IANA name like 'Europe/Helsinki': {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(
            f"Unknown time zone {name!r}: use an IANA name like 'Europe/Helsinki' or 'UTC' "
            "(install the tzdata package where the system has no zone database)"
        ) from exc


@dataclass(frozen=True)
class Cron:
    """A cron expression (5 fields, or 6 with seconds first) read in ``zone``."""

    expression: str
    zone: ZoneInfo

    @classmethod
    def parse(cls, expression: object, timezone: object) -> Cron:
        """Check both parts and return the pair; a :class:`ScheduleError` names what is wrong."""
        zone = parse_timezone(timezone)
        if not isinstance(expression, str) or not expression.strip():
            raise ScheduleError(
                f"A cron expression must be a str like '0 3 * * *', not {expression!r}"
            )
        cron = cls(" ".join(expression.split()), zone)
        try:
            # Stepping once catches what parsing alone lets through ("0 0 30 2 *").
            next(CronSim(cron.expression, datetime(2000, 1, 1, tzinfo=zone)))
        except (CronSimError, StopIteration) as exc:
            detail = str(exc) or "it never matches"
            raise ScheduleError(
                f"Invalid cron expression {expression!r}: {detail}. Use five fields "
                "(minute hour day-of-month month day-of-week), e.g. '0 3 * * *'"
            ) from exc
        return cron

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment``, in UTC."""
        return next(CronSim(self.expression, moment.astimezone(self.zone))).astimezone(UTC)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before ``moment``, in UTC."""
        start = (moment + _ONE_MICROSECOND).astimezone(self.zone)
        return next(CronSim(self.expression, start, reverse=True)).astimezone(UTC)

    def ticks_between(self, first: datetime, last: datetime, limit: int) -> list[datetime]:
        """The latest ``limit`` ticks in ``[first, last]``, oldest first, in UTC."""
        ticks: list[datetime] = []
        start = (last + _ONE_MICROSECOND).astimezone(self.zone)
        for tick in CronSim(self.expression, start, reverse=True):
            if tick < first or len(ticks) >= limit:
                break
            ticks.append(tick.astimezone(UTC))
        ticks.reverse()
        return ticks

    def describe(self) -> str:
        """The expression in words, e.g. "At 03:00 every day"."""
        try:
            return CronSim(self.expression, datetime(2000, 1, 1, tzinfo=self.zone)).explain()
        except Exception:  # a description is never worth an error
            return self.expression
