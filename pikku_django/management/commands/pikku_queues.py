"""``manage.py pikku_queues``: list queues, pause one, resume one."""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pikku_django.conf import pikku_settings
from pikku_django.management.output import format_table, shown, yes_no
from pikku_django.models import WorkflowStep
from pikku_django.schema import require_migrated
from pikku_django.workflows.config import engine_config
from pikku_django.workflows.control.pauses import (
    PauseChange,
    QueuePauseResult,
    pause_queue,
    paused_queues,
    resume_queue,
)

EMPTY = "-"


def _operator() -> str:
    """Who runs the command, as the pause records it."""
    try:
        return f"{getpass.getuser()} (pikku_queues)"
    except (KeyError, OSError):
        return "pikku_queues"


class Command(BaseCommand):
    help = (
        "Queues of queued steps: list them with whether each is paused, pause one (no "
        "worker claims its steps until it is resumed; steps already running finish, "
        "nothing is cancelled) or resume one (its steps are claimable again, and idle "
        "workers are told at once). A pause is stored in the database: it holds across "
        "every worker and survives restarts. See `pikku_queues SUBCOMMAND --help`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(
            dest="subcommand", required=True, title="subcommands", metavar="{list,pause,resume}"
        )
        listing = commands.add_parser(
            "list",
            help="Show the queues and which are paused.",
            description="Show every queue declared in PIKKU['QUEUES'], with steps running "
            "or waiting, or paused: whether it is paused, since when, by whom and why.",
        )
        listing.add_argument(
            "--json",
            action="store_true",
            help="Print a JSON list of objects instead of a table (times in ISO 8601).",
        )
        pause = commands.add_parser(
            "pause",
            help="Pause a queue: workers stop claiming its steps.",
            description="Pause NAME. Once the pause is stored no worker claims a step of "
            "the queue (new steps, retries, claims that lapsed, the first step of a new "
            "run); steps already running finish and settle as usual, and runs' passes go "
            "on. It returns once claims begun before the pause have ended. A queue "
            "already paused keeps its pause.",
        )
        pause.add_argument("name", metavar="NAME", help="The queue's name.")
        pause.add_argument("--reason", default="", help="Why, shown with the pause (admin, list).")
        pause.add_argument(
            "--by",
            default=None,
            help="Who paused it, shown with the pause (default: this user, via pikku_queues).",
        )
        resume = commands.add_parser(
            "resume",
            help="Resume a paused queue.",
            description="Resume NAME: its waiting steps are claimable again and idle "
            "workers are told of them at once (PostgreSQL; elsewhere at their next poll).",
        )
        resume.add_argument("name", metavar="NAME", help="The queue's name.")
        for sub in (listing, pause, resume):
            sub.add_argument(
                "--database",
                default=None,
                help="The DATABASES alias holding workflows (default: PIKKU['WORKFLOW_DATABASE']).",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated(options["database"])
        using = options["database"] or pikku_settings.WORKFLOW_DATABASE
        subcommand = options["subcommand"]
        if subcommand == "list":
            self.show(using, options["json"])
            return
        name = options["name"]
        try:
            if subcommand == "pause":
                by = options["by"] if options["by"] is not None else _operator()
                result = pause_queue(name, reason=options["reason"], paused_by=by, using=using)
            else:
                result = resume_queue(name, using=using)
        except (TypeError, ValueError) as exc:
            raise CommandError(shown(exc)) from exc
        self.stdout.write(self.told(name, result))

    @staticmethod
    def told(name: str, result: QueuePauseResult) -> str:
        """The line saying what a pause or resume did."""
        line = f"{shown(name)}: {result.change}"
        pause = result.pause
        if result.change is PauseChange.ALREADY_PAUSED and pause is not None:
            line += f" since {pause.paused_at.isoformat(timespec='seconds')}"
            line += f" by {shown(pause.paused_by or EMPTY)}"
        if result.change is PauseChange.PAUSED and result.settled is False:
            line += " (claims begun before the pause were still open when it returned)"
        return line

    def show(self, using: str, as_json: bool) -> None:
        pauses = {p.queue: p for p in paused_queues(using)}
        open_steps = (
            WorkflowStep.objects.using(using)
            .open_queued()
            .order_by()
            .values_list("queue", flat=True)
            .distinct()
        )
        names = sorted(set(engine_config().queues) | set(open_steps) | set(pauses))
        if as_json:
            rows = []
            for queue in names:
                pause = pauses.get(queue)
                rows.append(
                    {"queue": queue, "paused": pause is not None}
                    | ({} if pause is None else pause.as_json())
                )
            self.stdout.write(json.dumps(rows, indent=2))
            return
        if not names:
            self.stdout.write("No queue is declared, paused, or has steps running or waiting.")
            return
        table = []
        for queue in names:
            pause = pauses.get(queue)
            table.append(
                (
                    queue,
                    yes_no(pause is not None),
                    pause.paused_at.isoformat(timespec="seconds") if pause else EMPTY,
                    (pause.paused_by or EMPTY) if pause else EMPTY,
                    (pause.reason or EMPTY) if pause else EMPTY,
                )
            )
        self.stdout.write(format_table(("queue", "paused", "since", "by", "reason"), table))
