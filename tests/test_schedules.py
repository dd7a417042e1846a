"""Cron schedules: ticks, missed-tick policies after downtime, sync, the switch, bad input.

Each database test drives start_due_ticks with an explicit clock (``now=``), so a
worker that was down for hours is a jump of the clock, not a wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import checks
from django.db import connections, transaction

from pikku_django.checks import check_settings
from pikku_django.models import Schedule, WorkflowRun
from pikku_django.schedules import (
    ScheduleError,
    ScheduleNotFoundError,
    TickReport,
    disable_schedule,
    enable_schedule,
    start_due_ticks,
    sync_schedules,
    tick_key,
    trigger_schedule,
)
from pikku_django.schedules.checks import check_schedules
from pikku_django.schedules.ticks import forget_process_state, soonest_ticks
from pikku_django.workflows import registry
from pikku_django.workflows.registry import workflow
from tests.conftest import database_alias, on_databases
from tests.test_webhook_store import at_once

ALL = ("sqlite", "postgres", "mariadb")
WORKFLOW = "tests.schedules.report"
CODE_WORKFLOW = "tests.schedules.nightly"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def report(ctx: Any, input: Any) -> Any:
    return input


@pytest.fixture(autouse=True)
def plain_workflow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A workflow for the schedules declared in settings; only these tests' code schedules.

    Workflows other test modules registered with schedule= (the README's samples)
    stay registered for the whole run; these tests see only their own.
    """
    everything = registry.scheduled_workflows
    monkeypatch.setattr(
        registry,
        "scheduled_workflows",
        lambda: [d for d in everything() if d.name.startswith("tests.schedules.")],
    )
    workflow(name=WORKFLOW)(report)
    forget_process_state()
    yield
    registry.unregister(WORKFLOW)
    forget_process_state()


@pytest.fixture
def code_schedule() -> Iterator[None]:
    """A workflow declared with schedule=: 03:00 in Helsinki."""
    workflow(name=CODE_WORKFLOW, schedule="0 3 * * *", timezone="Europe/Helsinki")(report)
    yield
    registry.unregister(CODE_WORKFLOW)


def declare(settings: Any, alias: str = "default", **schedules: dict[str, Any]) -> None:
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "SCHEDULES": schedules}


def runs_of(alias: str, name: str) -> list[WorkflowRun]:
    prefix = f"schedule:{name}:"
    return list(
        WorkflowRun.objects.using(alias)
        .filter(idempotency_key__startswith=prefix)
        .order_by("idempotency_key")
    )


def row(alias: str, name: str) -> Schedule:
    return Schedule.objects.using(alias).get(name=name)


# -- ticks on the databases --------------------------------------------------------------


@on_databases(*ALL)
def test_each_tick_starts_one_run_with_the_schedule_input(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    declare(
        settings, alias, tenmin={"workflow": WORKFLOW, "cron": "*/10 * * * *", "input": {"a": 1}}
    )
    sync_schedules(utc(2026, 1, 1, 0, 1), using=alias)
    assert row(alias, "tenmin").next_tick_at == utc(2026, 1, 1, 0, 10)

    quiet = start_due_ticks(utc(2026, 1, 1, 0, 9), using=alias, sync=False)
    assert quiet == TickReport(next_due=utc(2026, 1, 1, 0, 10))
    assert quiet.seconds_until_next(utc(2026, 1, 1, 0, 9)) == 60

    first = start_due_ticks(utc(2026, 1, 1, 0, 10, 1), using=alias, sync=False)
    again = start_due_ticks(utc(2026, 1, 1, 0, 10, 2), using=alias, sync=False)
    assert [(s.schedule, s.tick) for s in first.started] == [("tenmin", utc(2026, 1, 1, 0, 10))]
    assert again.started == ()
    assert first.next_due == again.next_due == utc(2026, 1, 1, 0, 20)
    (run,) = runs_of(alias, "tenmin")
    assert run.id == first.started[0].run_id
    assert run.input == {"a": 1}
    assert run.workflow == WORKFLOW
    assert run.idempotency_key == "schedule:tenmin:2026-01-01T00:10:00Z"
    schedule = row(alias, "tenmin")
    assert schedule.last_tick_at == utc(2026, 1, 1, 0, 10)
    assert schedule.last_run_id == run.id
    assert schedule.next_tick_at == utc(2026, 1, 1, 0, 20)


@pytest.mark.parametrize(
    ("policy", "started_minutes"),
    [("latest", [60]), ("all", [0, 10, 20, 30, 40, 50, 60]), ("none", [])],
)
@on_databases(*ALL)
def test_missed_tick_policy_after_a_worker_was_down(
    vendor: str, settings: Any, policy: str, started_minutes: list[int]
) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, s={"workflow": WORKFLOW, "cron": "*/10 * * * *", "missed": policy})
    sync_schedules(utc(2026, 1, 1) - timedelta(minutes=5), using=alias)
    # Down from before 00:00 until 01:05: seven ticks passed, the last five minutes ago.
    done = start_due_ticks(utc(2026, 1, 1, 1, 5), using=alias, sync=False)
    ticks = [utc(2026, 1, 1) + timedelta(minutes=m) for m in started_minutes]
    assert [s.tick for s in done.started] == ticks
    assert [r.idempotency_key for r in runs_of(alias, "s")] == [tick_key("s", t) for t in ticks]
    if policy != "all":
        (skipped,) = done.skipped
        assert skipped.first == utc(2026, 1, 1)
        assert skipped.last == (
            utc(2026, 1, 1, 0, 50) if policy == "latest" else utc(2026, 1, 1, 1)
        )
    assert row(alias, "s").next_tick_at == utc(2026, 1, 1, 1, 10)
    # Back on time: the next tick starts under every policy.
    later = start_due_ticks(utc(2026, 1, 1, 1, 10, 2), using=alias, sync=False)
    assert [s.tick for s in later.started] == [utc(2026, 1, 1, 1, 10)]


@on_databases("sqlite", "postgres")
def test_all_starts_at_most_the_catch_up_limit(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, s={"workflow": WORKFLOW, "cron": "*/10 * * * *", "missed": "all"})
    settings.PIKKU = {**settings.PIKKU, "SCHEDULE_CATCHUP_LIMIT": 4}
    sync_schedules(utc(2025, 12, 31, 23, 55), using=alias)
    done = start_due_ticks(utc(2026, 1, 3), using=alias, sync=False)  # two days down
    assert [s.tick for s in done.started] == [
        utc(2026, 1, 2, 23, 30),
        utc(2026, 1, 2, 23, 40),
        utc(2026, 1, 2, 23, 50),
        utc(2026, 1, 3),
    ]
    assert len(runs_of(alias, "s")) == 4


@on_databases(*ALL)
def test_disable_and_enable(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, s={"workflow": WORKFLOW, "cron": "*/10 * * * *", "missed": "all"})
    sync_schedules(utc(2026, 1, 1, 0, 1), using=alias)
    result = disable_schedule("s", using=alias)
    assert result.changed
    assert not result.schedule.enabled
    assert result.schedule.next_tick_at is None
    assert not disable_schedule("s", using=alias).changed
    off = start_due_ticks(utc(2026, 1, 1, 2), using=alias, sync=False)
    assert off.started == ()
    assert off.next_due is None
    # Switched on again at 02:03: the ticks while it was off are not caught up.
    result = enable_schedule("s", utc(2026, 1, 1, 2, 3), using=alias)
    assert result.changed
    assert result.schedule.next_tick_at == utc(2026, 1, 1, 2, 10)
    assert not enable_schedule("s", utc(2026, 1, 1, 2, 4), using=alias).changed
    on = start_due_ticks(utc(2026, 1, 1, 2, 10, 1), using=alias, sync=False)
    assert [s.tick for s in on.started] == [utc(2026, 1, 1, 2, 10)]
    assert len(runs_of(alias, "s")) == 1
    # A resync keeps the switch the admin or the command set.
    disable_schedule("s", using=alias)
    sync_schedules(utc(2026, 1, 1, 3), using=alias)
    assert not row(alias, "s").enabled


@on_databases(*ALL)
def test_trigger_starts_a_run_now_without_moving_the_ticks(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, s={"workflow": WORKFLOW, "cron": "0 3 * * *", "input": [1, 2]})
    sync_schedules(utc(2026, 1, 1), using=alias)
    disable_schedule("s", using=alias)
    run = trigger_schedule("s", utc(2026, 1, 1, 12), using=alias)
    assert run.workflow == WORKFLOW
    assert run.input == [1, 2]
    assert run.idempotency_key.startswith("schedule:s:manual:2026-01-01T12:00:00")
    schedule = row(alias, "s")
    assert schedule.last_run_id == run.id
    assert schedule.next_tick_at is None
    with pytest.raises(ScheduleNotFoundError, match=r"No schedule is named 'nope'\. Known: s"):
        trigger_schedule("nope", using=alias)


# -- sync -----------------------------------------------------------------------------


@on_databases(*ALL)
@pytest.mark.usefixtures("code_schedule")
def test_sync_records_code_and_settings_declarations(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, hourly={"workflow": WORKFLOW, "cron": "0 * * * *", "enabled": False})
    first = sync_schedules(utc(2026, 6, 1, 12, 30), using=alias)
    assert set(first.created) == {CODE_WORKFLOW, "hourly"}
    code = row(alias, CODE_WORKFLOW)
    assert (code.origin, code.cron, code.timezone, code.missed) == (
        "code",
        "0 3 * * *",
        "Europe/Helsinki",
        "latest",
    )
    assert code.next_tick_at == utc(2026, 6, 2, 0, 0)  # 03:00 EEST
    hourly = row(alias, "hourly")
    assert (hourly.origin, hourly.enabled, hourly.next_tick_at) == ("settings", False, None)

    # Unchanged declarations keep their next tick, so missed ticks stay missed.
    again = sync_schedules(utc(2026, 6, 3), using=alias)
    assert again.created == again.updated == again.undeclared == ()
    assert row(alias, CODE_WORKFLOW).next_tick_at == utc(2026, 6, 2, 0, 0)

    # The declaration's own enabled changing wins; a new expression ticks from now.
    declare(settings, alias, hourly={"workflow": WORKFLOW, "cron": "15 * * * *", "enabled": True})
    changed = sync_schedules(utc(2026, 6, 3, 10, 20), using=alias)
    assert changed.updated == ("hourly",)
    hourly = row(alias, "hourly")
    assert (hourly.enabled, hourly.cron, hourly.next_tick_at) == (
        True,
        "15 * * * *",
        utc(2026, 6, 3, 11, 15),
    )

    # Gone from settings: stopped and marked, not deleted; it cannot be switched on.
    declare(settings, alias)
    gone = sync_schedules(utc(2026, 6, 3, 11), using=alias)
    assert gone.undeclared == ("hourly",)
    hourly = row(alias, "hourly")
    assert (hourly.declared, hourly.next_tick_at) == (False, None)
    with pytest.raises(ScheduleError, match="no longer declared"):
        enable_schedule("hourly", using=alias)


# -- cheap when nothing is due -----------------------------------------------------------


@on_databases(*ALL)
@pytest.mark.usefixtures("code_schedule")
def test_nothing_due_costs_one_query(
    vendor: str, settings: Any, django_assert_num_queries: Any
) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, s={"workflow": WORKFLOW, "cron": "0 3 * * *"})
    sync_schedules(utc(2026, 1, 1), using=alias)
    with django_assert_num_queries(1, using=alias):
        done = start_due_ticks(utc(2026, 1, 1, 0, 30), using=alias, sync=False)
    assert done.next_due == utc(2026, 1, 1, 1, 0)  # the code schedule: 03:00 in Helsinki


@on_databases("postgres")
def test_the_due_query_reads_the_next_tick_index(vendor: str) -> None:
    alias = database_alias(vendor)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # the table is tiny in a test
        sql, params = soonest_ticks(alias).query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(r[0] for r in cursor.fetchall())
    assert "pikku_schedule_due" in plan


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"workflow": WORKFLOW, "cron": "61 * * * *"},
            r"Invalid cron expression '61 \* \* \* \*': Bad minute",
        ),
        ({"workflow": WORKFLOW, "cron": "0 3 * *"}, "Wrong number of fields"),
        ({"workflow": WORKFLOW, "cron": "0 0 30 2 *"}, "Invalid cron expression"),
        (
            {"workflow": WORKFLOW, "cron": "0 3 * * *", "timezone": "Mars/Olympus"},
            "Unknown time zone 'Mars/Olympus'",
        ),
        (
            {"workflow": "nope", "cron": "0 3 * * *"},
            "names workflow 'nope', which is not registered",
        ),
        ({"workflow": WORKFLOW}, "needs 'cron'"),
        (
            {"workflow": WORKFLOW, "cron": "0 3 * * *", "misssed": "all"},
            r"unknown key\(s\) \['misssed'\]",
        ),
        (
            {"workflow": WORKFLOW, "cron": "0 3 * * *", "missed": "some"},
            "missed must be one of 'latest', 'all', 'none'",
        ),
        ({"workflow": WORKFLOW, "cron": "0 3 * * *", "input": {1, 2}}, "input must be plain JSON"),
        (
            {"workflow": WORKFLOW, "cron": "0 3 * * *", "enabled": "yes"},
            "enabled must be True or False",
        ),
    ],
)
@pytest.mark.django_db
def test_bad_declarations_give_clear_errors_and_change_nothing(
    settings: Any, options: dict[str, Any], message: str
) -> None:
    declare(settings, bad=options)
    with pytest.raises(ScheduleError, match=message):
        sync_schedules()
    assert not Schedule.objects.exists()
    (error,) = check_schedules()
    assert error.id == "pikku_django.E301"
    assert "PIKKU['SCHEDULES']['bad']" in error.msg


def test_a_bad_schedule_in_code_is_reported_by_the_check(settings: Any) -> None:
    workflow(name="tests.schedules.bad", schedule="0 25 * * *")(report)
    try:
        (error,) = check_schedules()
    finally:
        registry.unregister("tests.schedules.bad")
    assert error.id == "pikku_django.E301"
    assert "@workflow 'tests.schedules.bad'" in error.msg
    assert "Bad hour" in error.msg


@pytest.mark.django_db(databases="__all__")  # Django 6.1 checks ask each database for JSON
def test_the_check_runs_through_django(settings: Any) -> None:
    declare(settings, bad={"workflow": WORKFLOW, "cron": "0 3 * * *", "timezone": "Nowhere"})
    assert "pikku_django.E301" in [m.id for m in checks.run_checks()]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("SCHEDULE_TIMEZONE", "Atlantis/Capital"),
        ("SCHEDULE_MISSED", "most"),
        ("SCHEDULE_CATCHUP_LIMIT", 0),
        ("SCHEDULE_GRACE", -1),
    ],
)
def test_bad_schedule_settings_are_reported(settings: Any, key: str, value: Any) -> None:
    settings.PIKKU = {key: value}
    messages = check_settings() + check_schedules()
    assert any(m.id == "pikku_django.E302" and key in m.msg for m in messages), messages


def test_the_decorator_refuses_a_time_zone_without_a_schedule() -> None:
    with pytest.raises(Exception, match="timezone= is only meaningful with schedule="):
        workflow(name="tests.schedules.tz", timezone="UTC")
    with pytest.raises(Exception, match="schedule= must be a non-empty str"):
        workflow(name="tests.schedules.empty", schedule="")


@pytest.mark.usefixtures("code_schedule")
def test_a_clash_of_names_between_code_and_settings(settings: Any) -> None:
    declare(settings, **{CODE_WORKFLOW: {"workflow": WORKFLOW, "cron": "0 3 * * *"}})
    (error,) = check_schedules()
    assert f"Two schedules are named '{CODE_WORKFLOW}'" in error.msg


# -- threads, and a run that cannot start -------------------------------------------------


@on_databases(*ALL)
def test_threads_racing_on_the_same_ticks_start_each_once(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    cron = {"workflow": WORKFLOW, "cron": "* * * * *", "missed": "all"}
    declare(settings, alias, a=cron, b=cron, c=cron)
    sync_schedules(utc(2026, 1, 1) - timedelta(seconds=30), using=alias)

    def walk() -> list[TickReport]:
        return [
            start_due_ticks(utc(2026, 1, 1, 0, minute, 1), using=alias, sync=False)
            for minute in range(5)
        ]

    results = at_once(alias, 4, walk)
    assert not [r for r in results if isinstance(r, Exception)], results
    started = [(s.schedule, s.tick) for reports in results for r in reports for s in r.started]
    expected = [(n, utc(2026, 1, 1, 0, m)) for n in "abc" for m in range(5)]
    assert sorted(started) == sorted(expected)
    assert len(runs_of(alias, "a") + runs_of(alias, "b") + runs_of(alias, "c")) == 15


@on_databases("sqlite", "postgres")
def test_a_run_that_cannot_start_leaves_its_tick_due(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, s={"workflow": WORKFLOW, "cron": "0 3 * * *"})
    sync_schedules(utc(2026, 1, 1), using=alias)
    registry.unregister(WORKFLOW)  # a worker whose code does not have the workflow
    done = start_due_ticks(utc(2026, 1, 1, 3, 0, 1), using=alias, sync=False)
    (failure,) = done.failed
    assert failure.schedule == "s"
    assert failure.tick == utc(2026, 1, 1, 3)
    assert "WorkflowNotFoundError" in failure.error
    assert done.started == ()
    assert done.next_due == utc(2026, 1, 1, 3, 0, 31)  # this process tries again in 30 s
    assert row(alias, "s").next_tick_at == utc(2026, 1, 1, 3)  # still due, nothing lost
    assert runs_of(alias, "s") == []

    workflow(name=WORKFLOW)(report)  # the code is fixed
    assert start_due_ticks(utc(2026, 1, 1, 3, 0, 2), using=alias, sync=False).started == ()
    forget_process_state()  # or 30 s pass
    retried = start_due_ticks(utc(2026, 1, 1, 3, 0, 40), using=alias, sync=False)
    assert [s.tick for s in retried.started] == [utc(2026, 1, 1, 3)]


@on_databases("sqlite")
def test_the_first_call_in_a_process_records_the_declarations(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    declare(settings, alias, s={"workflow": WORKFLOW, "cron": "*/5 * * * *"})
    done = start_due_ticks(using=alias)
    assert row(alias, "s").next_tick_at == done.next_due
    declare(settings, alias)
    start_due_ticks(using=alias)  # once per process: the row is still declared
    assert row(alias, "s").declared
