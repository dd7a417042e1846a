"""``pikku_runs fork``: re-run a finished run from one of its steps as a new run."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pikku_django.admin.queries import describe, with_list_columns
from pikku_django.management.output import shown
from pikku_django.models import WorkflowRun
from pikku_django.workflows.errors import WorkflowError
from pikku_django.workflows.runs.forks import ForkPoint, StepRef, fork_run, preview_fork

logger = logging.getLogger(__name__)

DESCRIPTION = (
    "Start a NEW run of a completed, failed or cancelled run's workflow, with the same "
    "input, re-run from the step --from-step names (or the step at position --at, as "
    "`pikku_runs show` numbers them). The steps before it are kept: their recorded "
    "results are copied into the new run and not run again (their effects, a "
    "transactional step's writes included, happened once, in the original). That step "
    "and every step after it RUN AGAIN: charges, emails and writes they make happen "
    "again, and child workflows from there on start new child runs. An event the "
    "original received is copied only if a kept wait took it. The original run is not "
    "changed; the new one records it as forked_from. Refused, with the reason, for a "
    "run still running or suspended (cancel it first), a step the run does not have, "
    "a branch of a parallel group (fork from the group), a workflow this code does not "
    "register or a run recorded under a version the deployed code does not replay. "
    "Without --yes it prints what it would do and asks (or, with no terminal, stops)."
)


def add_fork_parser(commands: Any) -> None:
    """The ``fork`` subcommand's arguments, on ``pikku_runs``'s subparsers."""
    fork = commands.add_parser(
        "fork",
        help="Re-run a finished run from a step, as a new run (the steps before it kept).",
        description=DESCRIPTION,
    )
    fork.add_argument("run", help="The run's id, or its first characters.")
    where = fork.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--from-step", metavar="NAME", help="The recorded name of the step to re-run from."
    )
    where.add_argument(
        "--at", type=int, metavar="N", help="The step's position in the run (1 is the first)."
    )
    fork.add_argument("--priority", type=int, help="The new run's priority (default: the run's).")
    fork.add_argument("--queue", help="The new run's queue (default: the run's).")
    fork.add_argument(
        "--yes", action="store_true", help="Do it without asking: the re-run steps run again."
    )
    fork.add_argument("--json", action="store_true", help="Print the new run as JSON.")


def plan_lines(point: ForkPoint) -> list[str]:
    """What a fork at ``point`` keeps and runs again, in plain lines (user data escaped)."""
    kept = ", ".join(shown(s.name) for s in point.kept) or "none"
    again = ", ".join(shown(s.name) for s in point.again)
    return [
        f"Fork run {point.run.id} ({shown(point.run.workflow)}, {point.run.status}) "
        f"from step '{shown(point.step.name)}':",
        f"  kept, not run again ({len(point.kept)}): {kept}",
        f"  RUN AGAIN, their effects repeated ({len(point.again)}): {again}",
    ]


def fork_command(
    command: BaseCommand, run: WorkflowRun, using: str, options: dict[str, Any]
) -> None:
    ref: StepRef = options["at"] if options["at"] is not None else options["from_step"]
    try:
        point = preview_fork(run.id, ref, using=using)
        if not options["yes"]:
            for line in plan_lines(point):
                command.stdout.write(line)
            if not _confirmed(command):
                raise CommandError("Not forked: confirm with --yes")
        fork = fork_run(
            run.id, ref, using=using, priority=options["priority"], queue=options["queue"]
        )
    except WorkflowError as exc:
        raise CommandError(f"Run {run.id} cannot be forked: {shown(exc)}") from exc
    except (TypeError, ValueError) as exc:
        raise CommandError(shown(exc)) from exc
    logger.info("Forked run %s as %s from the command line", run.id, fork.id)
    if options["json"]:
        after = with_list_columns(WorkflowRun.objects.using(using).filter(pk=fork.pk)).get()
        data = describe(after) | {"forked_from": str(run.id), "forked_at_step": fork.forked_at_step}
        command.stdout.write(json.dumps(data, indent=2))
        return
    command.stdout.write(
        f"Forked run {run.id} at step '{shown(fork.forked_at_step)}': new run {fork.id} "
        f"({len(point.kept)} steps kept)."
    )


def _confirmed(command: BaseCommand) -> bool:
    if not sys.stdin.isatty():
        return False
    answer = input("Start the new run? Type 'yes' to confirm: ")
    return answer.strip().lower() == "yes"
