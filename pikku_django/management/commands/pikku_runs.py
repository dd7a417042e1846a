"""``manage.py pikku_runs``: list, show, resume, cancel, retry and fork workflow runs."""

from __future__ import annotations

import argparse
import json
import logging
import uuid
from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pikku_django.admin.formatting import (
    error_part,
    format_duration,
    format_time,
    workflow_database,
    workflow_title,
)
from pikku_django.admin.queries import RunFilters, describe, run_duration, with_list_columns
from pikku_django.admin.steering import OPERATIONS, Operation
from pikku_django.management.commands._run_forks import add_fork_parser, fork_command
from pikku_django.management.output import format_table, shown
from pikku_django.models import RunStatus, StepAttempt, WorkflowRun, WorkflowStep
from pikku_django.read_database import read_database
from pikku_django.schema import require_migrated
from pikku_django.workflows.errors import WorkflowError

logger = logging.getLogger(__name__)

#: The shortest id prefix ``show`` and the operations accept.
MIN_PREFIX = 8


def day(value: str) -> date:
    """argparse type: a day as YYYY-MM-DD."""
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a day (YYYY-MM-DD)") from exc


def json_value(value: str) -> Any:
    """argparse type: a JSON text."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not JSON ({exc.msg})") from exc


def find_run(value: str, using: str) -> WorkflowRun:
    """The run with id ``value``, or the one run whose id starts with it."""
    runs = WorkflowRun.objects.using(using)
    try:
        exact: uuid.UUID | None = uuid.UUID(value)
    except ValueError:
        exact = None
    if exact is not None:
        run = runs.filter(id=exact).first()
    else:
        prefix = value.strip().lower()
        if len(prefix.replace("-", "")) < MIN_PREFIX or any(
            c not in "0123456789abcdef-" for c in prefix
        ):
            raise CommandError(
                f"{value!r} is not a run id: give the id, or at least its first "
                f"{MIN_PREFIX} characters"
            )
        # A database without a uuid type stores the id's hex digits: Django's
        # startswith on a UUIDField drops the dashes from the prefix there.
        found = list(runs.filter(id__startswith=prefix)[:2])
        if len(found) > 1:
            raise CommandError(f"More than one run id starts with {value!r}: give more of it")
        run = found[0] if found else None
    if run is None:
        raise CommandError(f"No workflow run has id {value!r}")
    return run


def step_data(step: WorkflowStep) -> dict[str, Any]:
    attempts: list[StepAttempt] = sorted(step.attempts.all(), key=lambda a: a.attempt)
    return {
        "name": step.name,
        "kind": step.kind,
        "function": step.function,
        "status": step.status,
        "attempt": step.attempt,
        "attempts_allowed": step.attempts_allowed,
        "queue": step.queue,
        "created_at": step.created_at.isoformat(),
        "updated_at": step.updated_at.isoformat(),
        "child_run": str(step.child_run_id) if step.child_run_id else None,
        "error": step.error,
        "attempts": [
            {
                "attempt": a.attempt,
                "status": a.status,
                "worker": a.worker,
                "started_at": a.started_at.isoformat(),
                "finished_at": a.finished_at.isoformat() if a.finished_at else None,
                "error": a.error,
            }
            for a in attempts
        ],
    }


class Command(BaseCommand):
    help = (
        "Workflow runs from the command line: list them (with the admin's filters), show "
        "one with its steps and attempts, resume, cancel or retry one, or fork one (re-run "
        "it from a step as a new run). list and show read PIKKU['READ_DATABASE'] when it "
        "is set, the others PIKKU['WORKFLOW_DATABASE']. "
        "A run is named by its id or the id's first "
        f"{MIN_PREFIX} or more characters (as the admin list shows them). --json prints "
        "JSON instead of a table. See `pikku_runs SUBCOMMAND --help` for each one's options."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(
            dest="subcommand",
            required=True,
            title="subcommands",
            metavar="{list,show,resume,cancel,retry,fork}",
        )
        listing = commands.add_parser(
            "list",
            help="List runs, newest first.",
            description="List runs newest first: id, workflow, status, current step, "
            "started, duration, attempts, suspend reason and parent.",
        )
        listing.add_argument("--workflow", help="Only runs of this workflow (its name).")
        listing.add_argument("--status", choices=RunStatus.values, help="Only runs in this status.")
        listing.add_argument("--queue", help="Only runs with a step on this queue.")
        listing.add_argument(
            "--since",
            type=day,
            metavar="YYYY-MM-DD",
            help="Only runs started on or after this day.",
        )
        listing.add_argument(
            "--until",
            type=day,
            metavar="YYYY-MM-DD",
            help="Only runs started on or before this day.",
        )
        listing.add_argument(
            "--search",
            help="Runs whose id, idempotency key or workflow contains this text "
            "(on PostgreSQL also the input's text).",
        )
        listing.add_argument(
            "--limit", type=int, default=50, help="At most this many runs (default 50)."
        )
        listing.add_argument("--json", action="store_true", help="Print JSON.")

        show = commands.add_parser(
            "show",
            help="Show one run with its steps and their attempts.",
            description="Show one run: its fields, then each step in order with its "
            "attempts (worker, times, error).",
        )
        show.add_argument("run", help="The run's id, or its first characters.")
        show.add_argument("--json", action="store_true", help="Print JSON.")

        texts = {
            Operation.RESUME: "Resume a suspended run; its ctx.suspend() returns --data.",
            Operation.CANCEL: "Cancel a running or suspended run and the child runs it waits for.",
            Operation.RETRY: "Retry a failed run from the step that failed it.",
        }
        for operation in (Operation.RESUME, Operation.CANCEL, Operation.RETRY):
            sub = commands.add_parser(
                operation.value, help=texts[operation], description=texts[operation]
            )
            sub.add_argument("run", help="The run's id, or its first characters.")
            if operation == Operation.RESUME:
                sub.add_argument(
                    "--data",
                    type=json_value,
                    default=None,
                    help="JSON handed to the run, e.g. '{\"approved\": true}' (default null).",
                )
            sub.add_argument("--json", action="store_true", help="Print the run as JSON after.")

        add_fork_parser(commands)

    def handle(self, *args: Any, **options: Any) -> None:
        using = workflow_database()
        require_migrated(using)
        subcommand = options["subcommand"]
        if subcommand == "list":
            self.list_runs(read_database(using), options)
        elif subcommand == "show":
            reading = read_database(using)
            self.show_run(find_run(options["run"], reading), reading, as_json=options["json"])
        elif subcommand == "fork":
            fork_command(self, find_run(options["run"], using), using, options)
        else:
            self.operate(Operation(subcommand), find_run(options["run"], using), using, options)

    # -- list ------------------------------------------------------------------------------

    def list_runs(self, using: str, options: dict[str, Any]) -> None:
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        if options["since"] and options["until"] and options["since"] > options["until"]:
            raise CommandError("--since is after --until: no run can match")
        filters = RunFilters(
            workflow=options["workflow"],
            status=options["status"],
            queue=options["queue"],
            since=options["since"],
            until=options["until"],
            search=options["search"],
        )
        runs: list[Any] = list(
            with_list_columns(filters.apply(WorkflowRun.objects.using(using))).order_by(
                "-created_at"
            )[: options["limit"]]
        )
        if options["json"]:
            self.stdout.write(json.dumps([describe(run) for run in runs], indent=2))
            return
        if not runs:
            self.stdout.write("No workflow runs match.")
            return
        rows = [
            [
                str(run.id)[:8],
                workflow_title(run.workflow, run.idempotency_key),
                run.status,
                run.current_step or "-",
                format_time(run.created_at),
                format_duration(run_duration(run)),
                str(run.attempt_count or 0),
                (run.suspend_reason[:40] if run.status == RunStatus.SUSPENDED else "") or "-",
                str(run.parent_run_id)[:8] if run.parent_run_id else "-",
            ]
            for run in runs
        ]
        headers = ["ID", "WORKFLOW", "STATUS", "STEP", "STARTED", "DURATION", "ATTEMPTS"]
        self.stdout.write(format_table([*headers, "SUSPEND REASON", "PARENT"], rows))

    # -- show ------------------------------------------------------------------------------

    def show_run(self, run: WorkflowRun, using: str, *, as_json: bool) -> None:
        listed: Any = with_list_columns(WorkflowRun.objects.using(using).filter(pk=run.pk)).get()
        steps = list(
            WorkflowStep.objects.using(using)
            .of_run(run.pk)
            .prefetch_related("attempts")
            .order_by("id")
        )
        if as_json:
            data = describe(listed)
            data.update(
                input=run.input,
                output=run.output,
                error=run.error,
                steps=[step_data(s) for s in steps],
            )
            self.stdout.write(json.dumps(data, indent=2, default=str))
            return
        fields = [
            ("id", str(run.id)),
            ("workflow", workflow_title(run.workflow, run.idempotency_key)),
            ("status", run.status),
            ("started", format_time(run.created_at)),
            ("last change", format_time(run.updated_at)),
            ("duration", format_duration(run_duration(listed))),
            ("idempotency key", run.idempotency_key or "-"),
            ("parent", str(listed.parent_run_id) if listed.parent_run_id else "-"),
        ]
        if run.forked_from_id:
            fields.append(("forked from", f"{run.forked_from_id} at {run.forked_at_step!r}"))
        if run.status == RunStatus.SUSPENDED:
            fields.append(("suspend reason", run.suspend_reason or "-"))
        if run.error:
            fields.append(
                ("error", f"{error_part(run.error, 'type')}: {error_part(run.error, 'message')}")
            )
        if run.output is not None:
            fields.append(("output", json.dumps(run.output, default=str)))
        width = max(len(name) for name, _ in fields)
        for name, value in fields:
            self.stdout.write(f"{name.rjust(width)}  {shown(value)}")
        self.stdout.write("")
        if not steps:
            self.stdout.write("No steps yet.")
            return
        rows = []
        for n, step in enumerate(steps, 1):
            error = error_part(step.error, "type")
            rows.append(
                [
                    str(n),
                    step.name,
                    step.kind,
                    step.status,
                    f"{step.attempt}/{step.attempts_allowed}",
                    step.queue,
                    format_time(step.created_at),
                    format_duration(step.updated_at - step.created_at),
                    f"{error}: {error_part(step.error, 'message')}" if error else "",
                ]
            )
            for attempt in sorted(step.attempts.all(), key=lambda a: a.attempt):
                ended = attempt.finished_at
                kind = error_part(attempt.error, "type")
                rows.append(
                    [
                        "",
                        f"  attempt {attempt.attempt}",
                        attempt.worker or "-",
                        attempt.status,
                        "",
                        "",
                        format_time(attempt.started_at),
                        format_duration(ended - attempt.started_at) if ended else "-",
                        f"{kind}: {error_part(attempt.error, 'message')}" if kind else "",
                    ]
                )
        headers = ["#", "STEP", "KIND/WORKER", "STATUS", "ATTEMPT", "QUEUE", "STARTED"]
        self.stdout.write(format_table([*headers, "DURATION", "ERROR"], rows))

    # -- resume, cancel, retry ------------------------------------------------------------

    def operate(
        self, operation: Operation, run: WorkflowRun, using: str, options: dict[str, Any]
    ) -> None:
        op = OPERATIONS[operation]
        if not op.applies_to(run):
            raise CommandError(f"Run {run.id} is {run.status}: it cannot be {op.past}")
        data = options.get("data")
        try:
            op.call(run, data)
        except WorkflowError as exc:
            raise CommandError(f"Run {run.id} could not be {op.past}: {shown(exc)}") from exc
        logger.info("%s run %s (%s) from the command line", op.done, run.id, run.workflow)
        after = with_list_columns(WorkflowRun.objects.using(using).filter(pk=run.pk)).get()
        if options["json"]:
            self.stdout.write(json.dumps(describe(after), indent=2))
        else:
            self.stdout.write(f"{op.done} run {run.id}; it is now {after.status}.")
