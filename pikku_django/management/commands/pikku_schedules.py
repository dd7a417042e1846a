"""``manage.py pikku_schedules``: list, switch, trigger and record cron schedules."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pikku_django.management.output import format_table, shown, yes_no
from pikku_django.models import Schedule
from pikku_django.schedules import (
    ScheduleError,
    ScheduleNotFoundError,
    disable_schedule,
    enable_schedule,
    sync_schedules,
    trigger_schedule,
)
from pikku_django.schedules.store import cron_of, schedules
from pikku_django.schema import require_migrated
from pikku_django.workflows.errors import WorkflowNotFoundError

EMPTY = "-"


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def row_data(row: Schedule) -> dict[str, Any]:
    """One schedule as the plain values ``list --json`` prints."""
    return {
        "name": row.name,
        "workflow": row.workflow,
        "cron": row.cron,
        "timezone": row.timezone,
        "missed": row.missed,
        "enabled": row.enabled,
        "declared": row.declared,
        "origin": row.origin,
        "input": row.input,
        "next_tick": iso(row.next_tick_at),
        "last_tick": iso(row.last_tick_at),
        "last_run": str(row.last_run_id) if row.last_run_id else None,
        "last_run_at": iso(row.last_run_at),
    }


def local(row: Schedule, moment: datetime | None) -> str:
    """``moment`` in the schedule's own time zone, to the second."""
    if moment is None:
        return EMPTY
    try:
        zone = cron_of(row).zone
    except ScheduleError:
        return moment.isoformat(timespec="seconds")
    return moment.astimezone(zone).isoformat(timespec="seconds")


class Command(BaseCommand):
    help = (
        "Cron schedules (declared with @workflow(schedule=...) or in PIKKU['SCHEDULES']): "
        "list them, switch one on or off, start one now (trigger), or record the "
        "declarations as rows (sync). Workers start each tick's run; no separate "
        "scheduler process runs. See `pikku_schedules SUBCOMMAND --help`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(
            dest="subcommand",
            required=True,
            title="subcommands",
            metavar="{list,enable,disable,trigger,sync}",
        )
        listing = commands.add_parser(
            "list",
            help="Show every schedule with its next tick and last run.",
            description="Record the declared schedules (as sync does), then show each "
            "schedule: name, enabled, declared, workflow, cron expression and time zone, "
            "missed-tick policy, next tick and last tick (in the schedule's time zone) and "
            "the last run started.",
        )
        listing.add_argument(
            "--json",
            action="store_true",
            help="Print a JSON list of objects instead of a table (times in ISO 8601, UTC).",
        )
        enable = commands.add_parser(
            "enable",
            help="Switch a schedule on.",
            description="Switch NAME on. Its next tick is the first one from now: ticks "
            "that passed while it was off are not started.",
        )
        enable.add_argument("name", metavar="NAME", help="The schedule's name.")
        disable = commands.add_parser(
            "disable",
            help="Switch a schedule off.",
            description="Switch NAME off: no tick starts a run until it is enabled again. "
            "Runs already started go on.",
        )
        disable.add_argument("name", metavar="NAME", help="The schedule's name.")
        trigger = commands.add_parser(
            "trigger",
            help="Start one run of a schedule's workflow now.",
            description="Start one run of NAME's workflow with its input now, whether or "
            "not the schedule is enabled. Its ticks are unchanged.",
        )
        trigger.add_argument("name", metavar="NAME", help="The schedule's name.")
        commands.add_parser(
            "sync",
            help="Record the declared schedules; mark the rest undeclared.",
            description="Write each schedule declared in code or settings to its row (a "
            "new one ticks first after now) and stop rows whose declaration is gone. The "
            "enabled switch is kept unless the declaration's own enabled changed. Workers "
            "do this when they start.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        subcommand = options["subcommand"]
        try:
            if subcommand == "list":
                self.show(options["json"])
            elif subcommand == "sync":
                self.sync()
            elif subcommand in ("enable", "disable"):
                self.switch(subcommand, options["name"])
            elif subcommand == "trigger":
                run = trigger_schedule(options["name"])
                name, workflow = shown(options["name"]), shown(run.workflow)
                self.stdout.write(f"{name}: started run {run.id} of {workflow}")
        except (ScheduleError, ScheduleNotFoundError, WorkflowNotFoundError) as exc:
            raise CommandError(shown(exc)) from exc

    def sync(self) -> None:
        report = sync_schedules()
        self.stdout.write(
            f"Created {len(report.created)}, updated {len(report.updated)}, "
            f"{len(report.undeclared)} no longer declared."
        )
        for label, names in (("created", report.created), ("updated", report.updated)):
            for name in names:
                self.stdout.write(f"  {label}: {shown(name)}")
        for name in report.undeclared:
            self.stdout.write(f"  no longer declared (stopped): {shown(name)}")

    def switch(self, verb: str, name: str) -> None:
        result = enable_schedule(name) if verb == "enable" else disable_schedule(name)
        state = f"{verb}d" if result.changed else f"already {verb}d"
        row = result.schedule
        suffix = f"; next tick {local(row, row.next_tick_at)}" if row.next_tick_at else ""
        self.stdout.write(f"{shown(name)}: {state}{suffix}")

    def show(self, as_json: bool) -> None:
        try:
            sync_schedules()
        except ScheduleError as exc:
            self.stderr.write(f"Declarations not recorded: {shown(exc)}")
        rows = list(schedules().order_by("name"))
        if as_json:
            self.stdout.write(json.dumps([row_data(r) for r in rows], indent=2))
            return
        if not rows:
            self.stdout.write("No schedules. Declare one with @workflow(schedule=...).")
            return
        headers = (
            "name",
            "enabled",
            "declared",
            "workflow",
            "cron",
            "missed",
            "next tick",
            "last tick",
            "last run",
        )
        table = [
            (
                r.name,
                yes_no(r.enabled),
                yes_no(r.declared),
                r.workflow,
                f"{r.cron} ({r.timezone})",
                r.missed,
                local(r, r.next_tick_at),
                local(r, r.last_tick_at),
                str(r.last_run_id) if r.last_run_id else EMPTY,
            )
            for r in rows
        ]
        self.stdout.write(format_table(headers, table))
