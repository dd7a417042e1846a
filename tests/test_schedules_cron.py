"""Cron expressions: which ticks a policy starts, and daylight saving in two time zones.

Daylight saving follows zoneinfo as cron does: a tick in a spring-forward gap happens
right after the gap, a tick in a repeated fall-back hour happens once (its first
occurrence), and an hourly expression ticks in both copies of the repeated hour.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from pikku_django.models import MissedTicks
from pikku_django.schedules import Cron, plan_ticks, start_due_ticks, sync_schedules, tick_key
from tests.conftest import database_alias, on_databases
from tests.test_schedules import (  # noqa: F401  (plain_workflow: the autouse fixture)
    ALL,
    WORKFLOW,
    declare,
    plain_workflow,
    runs_of,
    utc,
)

# -- planning, without a database ---------------------------------------------------


EVERY_10 = Cron.parse("*/10 * * * *", "UTC")


@pytest.mark.parametrize(
    ("policy", "started", "skipped"),
    [
        (
            MissedTicks.LATEST,
            [utc(2026, 1, 1, 1, 0)],
            (utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 50)),
        ),
        (MissedTicks.NONE, [], (utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 1, 0))),
        (
            MissedTicks.ALL,
            [utc(2026, 1, 1, 0, m) for m in range(0, 60, 10)] + [utc(2026, 1, 1, 1)],
            None,
        ),
    ],
)
def test_policies_after_an_hour_down(
    policy: MissedTicks, started: list[datetime], skipped: tuple[datetime, datetime] | None
) -> None:
    # Due since 00:00, seen at 01:05: the 01:00 tick is five minutes late, past the grace.
    plan = plan_ticks(EVERY_10, policy, utc(2026, 1, 1), utc(2026, 1, 1, 1, 5), grace=60, limit=100)
    assert list(plan.start) == started
    assert plan.skipped == skipped
    assert plan.next_tick == utc(2026, 1, 1, 1, 10)


def test_a_tick_inside_the_grace_is_on_time_for_every_policy() -> None:
    for policy in MissedTicks:
        plan = plan_ticks(
            EVERY_10, policy, utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 30), grace=60, limit=100
        )
        assert list(plan.start) == [utc(2026, 1, 1)], policy
        assert plan.skipped is None


def test_none_starts_every_tick_still_on_time() -> None:
    every_second = Cron.parse("* * * * * *", "UTC")
    due = utc(2026, 1, 1)
    plan = plan_ticks(
        every_second, MissedTicks.NONE, due, due + timedelta(seconds=70), grace=3, limit=100
    )
    assert list(plan.start) == [due + timedelta(seconds=s) for s in (67, 68, 69, 70)]
    assert plan.skipped == (due, due + timedelta(seconds=66))
    latest = plan_ticks(
        every_second, MissedTicks.LATEST, due, due + timedelta(seconds=70), grace=3, limit=100
    )
    assert list(latest.start) == [due + timedelta(seconds=70)]  # one run for the lot


def test_all_is_bounded_by_the_catch_up_limit() -> None:
    plan = plan_ticks(
        EVERY_10, MissedTicks.ALL, utc(2026, 1, 1), utc(2026, 1, 2, 0, 5), grace=60, limit=3
    )
    assert list(plan.start) == [utc(2026, 1, 1, 23, 40), utc(2026, 1, 1, 23, 50), utc(2026, 1, 2)]
    assert plan.skipped == (utc(2026, 1, 1), utc(2026, 1, 1, 23, 30))


# -- daylight saving -------------------------------------------------------------------


def daily_ticks(cron: Cron, start: datetime, days: int) -> list[datetime]:
    ticks, moment = [], start
    for _ in range(days):
        moment = cron.next_after(moment)
        ticks.append(moment)
    return ticks


def test_spring_forward_tick_in_the_gap_happens_right_after_it() -> None:
    # New York, 8 March 2026: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist.
    cron = Cron.parse("30 2 * * *", "America/New_York")
    assert daily_ticks(cron, utc(2026, 3, 7, 12), 3) == [
        utc(2026, 3, 8, 7, 0),  # 03:00 EDT, the first minute after the gap
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
        utc(2026, 3, 10, 6, 30),
    ]


def test_fall_back_tick_in_the_repeated_hour_happens_once() -> None:
    # New York, 1 November 2026: 02:00 EDT falls back to 01:00 EST; 01:30 comes twice.
    cron = Cron.parse("30 1 * * *", "America/New_York")
    assert daily_ticks(cron, utc(2026, 10, 31, 12), 3) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT, the first of the two
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
        utc(2026, 11, 3, 6, 30),
    ]


def test_hourly_schedules_tick_in_both_copies_of_a_repeated_hour() -> None:
    cron = Cron.parse("30 * * * *", "America/New_York")
    ticks = daily_ticks(cron, utc(2026, 11, 1, 4, 45), 3)
    assert ticks == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 7, 30)]


@pytest.mark.parametrize(
    ("zone", "expression", "start", "expected"),
    [
        (  # Helsinki springs forward at 03:00 EET to 04:00 EEST on 29 March 2026.
            "Europe/Helsinki",
            "30 3 * * *",
            utc(2026, 3, 27, 12),
            [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)],
        ),
        (  # and falls back at 04:00 EEST to 03:00 EET on 25 October 2026.
            "Europe/Helsinki",
            "30 3 * * *",
            utc(2026, 10, 23, 12),
            [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)],
        ),
        (
            "America/New_York",
            "30 2 * * *",
            utc(2026, 3, 6, 12),
            [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)],
        ),
        (
            "America/New_York",
            "30 1 * * *",
            utc(2026, 10, 30, 12),
            [utc(2026, 10, 31, 5, 30), utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)],
        ),
    ],
    ids=["helsinki-spring", "helsinki-autumn", "new-york-spring", "new-york-autumn"],
)
@on_databases(*ALL)
def test_a_schedule_across_a_dst_change_starts_one_run_a_day(
    vendor: str,
    settings: Any,
    zone: str,
    expression: str,
    start: datetime,
    expected: list[datetime],
) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, daily={"workflow": WORKFLOW, "cron": expression, "timezone": zone})
    sync_schedules(start, using=alias)
    moment = start
    while moment < expected[-1] + timedelta(hours=2):  # a worker polling every 10 minutes
        moment += timedelta(minutes=10)
        start_due_ticks(moment, using=alias, sync=False)
    assert [r.idempotency_key for r in runs_of(alias, "daily")] == [
        tick_key("daily", tick) for tick in expected
    ]
