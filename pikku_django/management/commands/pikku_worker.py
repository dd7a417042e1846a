"""``manage.py pikku_worker``: run workflow orchestration and step execution."""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pikku_django.conf import pikku_settings
from pikku_django.logging import LogFormat, configure_worker_logging
from pikku_django.schema import require_migrated
from pikku_django.workflows.engine import WorkflowEngine
from pikku_django.workflows.worker.loop import Worker

logger = logging.getLogger("pikku_django.worker")


class Command(BaseCommand):
    help = (
        "Run durable workflows: orchestration passes and queued steps, on --concurrency "
        "threads, until stopped with SIGTERM or Ctrl-C (work in flight is finished, or "
        "handed back to other workers on a second signal). Workers claim work from the "
        "database, so any number may run side by side on PostgreSQL or MariaDB; on SQLite "
        "run one. Due ticks of cron schedules start their runs in any worker. It logs a "
        "start-up line, each run started, failed step and finished run, and each signal, "
        "to stderr unless settings.LOGGING handles the pikku_django logger; -v 2 adds "
        "debug lines, -v 0 keeps warnings only. Defaults come from settings.PIKKU."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="Worker threads in this process (default: PIKKU['WORKER_CONCURRENCY'], 4).",
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            default=[],
            metavar="NAME",
            help="Serve only this step queue; repeat for several (default: every queue). "
            "Orchestration passes are always served.",
        )
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="Exit once no work is in flight and none is due within --idle-grace seconds "
            "(for scripts and tests). Runs waiting on a later timer are left for the next "
            "worker.",
        )
        parser.add_argument(
            "--idle-grace",
            type=float,
            default=10.0,
            help="With --until-idle: keep going for work due within this many seconds "
            "(default: 10).",
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            default=None,
            help="Seconds between polls for new work (default: PIKKU['WORKER_POLL_INTERVAL'], "
            "1). On PostgreSQL new work also wakes the worker at once.",
        )
        parser.add_argument(
            "--database",
            default=None,
            help="The DATABASES alias holding workflows (default: PIKKU['WORKFLOW_DATABASE']).",
        )
        parser.add_argument(
            "--log-format",
            choices=[f.value for f in LogFormat],
            default=None,
            help="Log lines as text (the default) or as one JSON object a line; also set on "
            "the handlers settings.LOGGING gives the pikku_django logger.",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=30.0,
            help="Seconds to let work in flight finish after SIGTERM/SIGINT before handing "
            "it back (default: 30).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        log_format = options["log_format"]
        configure_worker_logging(
            options["verbosity"], LogFormat(log_format) if log_format else None
        )
        require_migrated(options["database"])
        concurrency = options["concurrency"]
        if concurrency is None:
            concurrency = pikku_settings.WORKER_CONCURRENCY
        poll = options["poll_interval"]
        if poll is None:
            poll = pikku_settings.WORKER_POLL_INTERVAL
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        if poll <= 0:
            raise CommandError("--poll-interval must be greater than 0")
        engine = WorkflowEngine(options["database"])
        worker = Worker(
            engine,
            concurrency=concurrency,
            queues=options["queues"],
            poll_interval=poll,
            until_idle=options["until_idle"],
            idle_grace=options["idle_grace"],
            shutdown_timeout=options["shutdown_timeout"],
            notify=pikku_settings.WORKER_NOTIFY,
        )
        signals = {"count": 0}

        def hand_back_and_exit() -> None:
            worker.hand_back()
            worker.heartbeats.beat(0, stopping=True)
            logging.shutdown()
            os._exit(0)  # the threads still running user code cannot be interrupted

        def on_signal(signum: int, frame: FrameType | None) -> None:
            signals["count"] += 1
            name = signal.Signals(signum).name
            if signals["count"] == 1:
                logger.info(
                    "Received %s: finishing work in flight (up to %gs; %s again hands it back)",
                    name,
                    options["shutdown_timeout"],
                    name,
                )
                worker.stop()
                timer = threading.Timer(options["shutdown_timeout"], hand_back_and_exit)
                timer.daemon = True
                timer.start()
            else:
                logger.warning("Received %s again: handing back work in flight", name)
                hand_back_and_exit()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            worker.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if options["until_idle"]:
            left = worker.pending_summary()
            self.stdout.write(
                f"Idle after {worker.passes} passes and {worker.steps} steps. "
                f"Running runs: {left['running_runs']}, suspended: {left['suspended_runs']}"
                + (
                    f", next timer at {left['next_wake_at']:%Y-%m-%d %H:%M:%S}"
                    if left["next_wake_at"]
                    else ""
                )
            )
