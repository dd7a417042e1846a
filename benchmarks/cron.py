"""Cron tick lag: from each tick's time to the start of its run, under three workers.

Three processes each run a real :class:`~pikku_django.workflows.worker.loop.Worker` (what
``pikku_worker`` runs, ``--concurrency`` threads, polling every ``--poll`` seconds):
each starts the runs of due ticks through the schedules' intake and passes runs.
``--schedules`` schedules tick every second (a six-field cron expression) for
``--seconds``. Two lags are measured per tick: to its run's creation (``created_at``)
and to its run's start (when its first pass began: the attempt of the run's first
step, an inline step). Target: the start lag's p50 under 1 s.

Baseline, measured next to it with the same workers: what a project does without
ticks in the workers, one dedicated scheduler process (cron, celery beat) that sleeps
until each tick and calls ``start_workflow`` for it; the workers only pass the runs.
Printed: a table, then one JSON object as the last line.

PostgreSQL at PIKKU_BENCH_POSTGRES_URL (default
postgres://postgres@127.0.0.1:5432/pikku_bench_cron); the database is created if
missing and this benchmark's rows are deleted before each side starts.

    python benchmarks/cron.py --seconds 20
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

from benchlib import (  # noqa: E402
    BenchError,
    Processes,
    ensure_database,
    format_table,
    machine,
    percentile,
    wait_for,
)

log = logging.getLogger("pikku.bench.cron")

URL = os.environ.get(
    "PIKKU_BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_cron"
)
WORKFLOW = "bench.cron_tick"
PREFIX = "bench-cron-"
TARGET_P50_MS = 1000.0


def configure(schedules: int) -> None:
    """Django on the benchmark database, with ``schedules`` schedules ticking each second
    (none: the baseline's workers, whose runs a scheduler process starts)."""
    import dj_database_url
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="pikku-bench-not-secret",  # noqa: S106
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["pikku_django"],
        DATABASES={"default": dj_database_url.parse(URL)},
        PIKKU={
            "SCHEDULES": {
                f"{PREFIX}{i}": {"workflow": WORKFLOW, "cron": "* * * * * *", "missed": "all"}
                for i in range(schedules)
            }
        },
        LOGGING_CONFIG=None,
    )
    django.setup()
    logging.getLogger("pikku_django").setLevel(logging.WARNING)

    from pikku_django.workflows import workflow

    @workflow(name=WORKFLOW)
    def cron_tick(ctx: Any, input: Any) -> None:
        ctx.do("started", _started)  # its attempt's started_at: when the first pass began


def _started() -> None:
    return None


def worker(stop_file: Path, ready_file: Path, poll: float, concurrency: int) -> None:
    """One worker process: a real Worker, until told to stop."""
    from pikku_django.schedules import start_due_ticks
    from pikku_django.workflows import get_engine
    from pikku_django.workflows.worker.loop import Worker

    start_due_ticks(sync=False)  # connected and warm before the first tick
    running = Worker(get_engine(), concurrency=concurrency, poll_interval=poll)

    def watch() -> None:
        while not stop_file.exists():
            time.sleep(0.1)
        running.stop()

    threading.Thread(target=watch, daemon=True).start()
    ready_file.touch()
    running.run()


def scheduler(stop_file: Path, ready_file: Path, schedules: int) -> None:
    """The baseline: one process that sleeps until each tick and starts its runs."""
    from pikku_django.schedules import tick_key
    from pikku_django.workflows import start_workflow

    ready_file.touch()
    while not stop_file.exists():
        now = time.time()
        tick = math.floor(now) + 1
        time.sleep(tick - now)
        at = datetime.fromtimestamp(tick, UTC)
        for i in range(schedules):
            name = f"{PREFIX}{i}"
            start_workflow(WORKFLOW, None, idempotency_key=tick_key(name, at))


def _argv(role: str, ready: Path, stop_file: Path, args: argparse.Namespace, n: int) -> list[str]:
    return [
        sys.executable,
        __file__,
        f"--{role}",
        str(ready),
        "--stop-file",
        str(stop_file),
        "--poll",
        str(args.poll),
        "--concurrency",
        str(args.concurrency),
        "--schedules",
        str(n),
    ]


def measure(args: argparse.Namespace, tmp: Path, *, baseline: bool) -> dict[str, Any]:
    """Tick for ``args.seconds``: by the workers, or (``baseline``) by one scheduler."""
    from pikku_django.models import Schedule, StepAttempt, WorkflowRun
    from pikku_django.schedules import sync_schedules

    Schedule.objects.filter(name__startswith=PREFIX).delete()
    WorkflowRun.objects.filter(workflow=WORKFLOW).delete()
    side = "baseline" if baseline else "workers"
    stop_file = tmp / f"{side}.stop"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH_DIR.parent), str(BENCH_DIR)])}
    procs = Processes(tmp, env)
    names = [f"{side}-worker{i}" for i in range(args.processes)]
    try:
        ticked_by_workers = 0 if baseline else args.schedules
        for name in names:
            ready = tmp / f"{name}.ready"
            procs.start(name, _argv("worker", ready, stop_file, args, ticked_by_workers))
        wait_for(lambda: all((tmp / f"{n}.ready").exists() for n in names), 60, "the workers")
        if baseline:
            ready = tmp / "scheduler.ready"
            procs.start("scheduler", _argv("scheduler", ready, stop_file, args, args.schedules))
            wait_for(ready.exists, 60, "the scheduler")
        else:
            sync_schedules()  # the first ticks are the next second's
        log.info("%s: ticking for %ss with %d workers", side, args.seconds, args.processes)
        time.sleep(args.seconds)
        procs.check_alive()
        if baseline:
            stop_file.touch()  # the scheduler first: no tick after this
        else:
            Schedule.objects.filter(name__startswith=PREFIX).update(
                enabled=False, next_tick_at=None
            )
        wait_for(
            lambda: not WorkflowRun.objects.filter(workflow=WORKFLOW, status="running").exists(),
            60,
            "the last runs",
        )
    finally:
        stop_file.touch()
        procs.stop_all()

    started = dict(
        StepAttempt.objects.filter(
            step__run__workflow=WORKFLOW, step__name="started", attempt=1
        ).values_list("step__run_id", "started_at")
    )
    created_ms: list[float] = []
    start_ms: list[float] = []
    per_schedule: dict[str, list[datetime]] = {}
    for run_id, key, created in WorkflowRun.objects.filter(workflow=WORKFLOW).values_list(
        "id", "idempotency_key", "created_at"
    ):
        name, stamp = key.split(":", 1)[1].split(":", 1)
        tick = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        created_ms.append((created - tick).total_seconds() * 1000)
        if run_id in started:
            start_ms.append((started[run_id] - tick).total_seconds() * 1000)
        per_schedule.setdefault(name, []).append(tick)
    if not created_ms:
        raise BenchError(f"{side}: no tick started a run")
    expected = sum(
        int((max(ticks) - min(ticks)).total_seconds()) + 1 for ticks in per_schedule.values()
    )
    return {
        "runs": len(created_ms),
        "runs_started": len(start_ms),
        "ticks_expected": expected,
        "ticks_missing": expected - len(created_ms),
        "created_ms_p50": round(percentile(created_ms, 50), 1),
        "created_ms_max": round(max(created_ms), 1),
        "start_ms_p50": round(percentile(start_ms, 50), 1),
        "start_ms_p90": round(percentile(start_ms, 90), 1),
        "start_ms_max": round(max(start_ms, default=float("nan")), 1),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to tick (20)")
    parser.add_argument("--processes", type=int, default=3, help="worker processes (3)")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker (2)")
    parser.add_argument("--schedules", type=int, default=3, help="schedules, each every second")
    parser.add_argument(
        "--poll", type=float, default=1.0, help="the workers' poll interval, seconds (1.0)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few seconds, for a smoke test (no figures)"
    )
    parser.add_argument("--worker", metavar="READY_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--scheduler", metavar="READY_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.worker:
        configure(args.schedules)
        worker(Path(args.stop_file), Path(args.worker), args.poll, args.concurrency)
        return 0
    if args.scheduler:
        configure(0)
        scheduler(Path(args.stop_file), Path(args.scheduler), args.schedules)
        return 0
    if args.quick:
        args.seconds = 3.0
    import tempfile

    ensure_database(URL)
    configure(0)
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", "pikku_django", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = str(cursor.fetchone()[0])
    with tempfile.TemporaryDirectory(prefix="pikku-cron-bench-") as tmp:
        ours = measure(args, Path(tmp), baseline=False)
        base = measure(args, Path(tmp), baseline=True)
    rows = [
        (
            label,
            str(r["runs"]),
            str(r["ticks_missing"]),
            str(r["created_ms_p50"]),
            str(r["created_ms_max"]),
            str(r["start_ms_p50"]),
            str(r["start_ms_p90"]),
            str(r["start_ms_max"]),
        )
        for label, r in (
            ("ticks in the workers (ours)", ours),
            ("one scheduler process (baseline)", base),
        )
    ]
    header = ("", "runs", "missing", "created p50", "created max", "start p50", "p90", "max")
    print(format_table(header, rows))
    print(f"lags in ms from each tick's time; target: start p50 under {TARGET_P50_MS:g} ms")
    result = {
        "benchmark": "cron_tick_lag",
        "processes": args.processes,
        "concurrency": args.concurrency,
        "schedules": args.schedules,
        "seconds": args.seconds,
        "poll_s": args.poll,
        "ours": ours,
        "baseline": base,
        "lag_ms_p50": ours["start_ms_p50"],
        "lag_ms_max": ours["start_ms_max"],
        "baseline_lag_ms_p50": base["start_ms_p50"],
        "baseline_lag_ms_max": base["start_ms_max"],
        "target_p50_ms": TARGET_P50_MS,
        "p50_under_target": ours["start_ms_p50"] < TARGET_P50_MS,
        "machine": machine(server, "cronsim"),
    }
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
