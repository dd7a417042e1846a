"""Cron tick lag: from each tick's time to the start of its run, under three ticking processes.

Three processes stand in for workers: each calls ``start_due_ticks()`` in a loop and
sleeps until the next tick its report names (at most ``--poll`` seconds, as a worker
sleeps at most its poll interval). ``--schedules`` schedules tick every second (a
six-field cron expression) for ``--seconds``. The lag of a tick is its run's
``created_at`` minus the tick's time. Printed: a table, then one JSON object as the
last line.

PostgreSQL at PIKKU_BENCH_POSTGRES_URL (default
postgres://postgres@127.0.0.1:5432/pikku_bench_cron); the database is created if
missing and this benchmark's rows are deleted before it starts.

    python benchmarks/cron.py --seconds 20
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
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
    """Django on the benchmark database, with ``schedules`` schedules ticking each second."""
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
        return None


def ticker(stop_file: Path, ready_file: Path, poll: float) -> None:
    """One stand-in worker: start due ticks, sleep until the next one, until told to stop."""
    from pikku_django.schedules import start_due_ticks

    start_due_ticks(sync=False)  # connected and warm before the first tick
    ready_file.touch()
    while not stop_file.exists():
        report = start_due_ticks(sync=False)
        wait = report.seconds_until_next()
        time.sleep(poll if wait is None else min(wait, poll))


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connection

    from pikku_django.models import Schedule, WorkflowRun
    from pikku_django.schedules import sync_schedules

    call_command("migrate", "pikku_django", verbosity=0)
    Schedule.objects.filter(name__startswith=PREFIX).delete()
    WorkflowRun.objects.filter(workflow=WORKFLOW).delete()
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = str(cursor.fetchone()[0])

    stop_file = tmp / "stop"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH_DIR.parent), str(BENCH_DIR)])}
    procs = Processes(tmp, env)
    names = [f"ticker{i}" for i in range(args.processes)]
    try:
        for name in names:
            procs.start(
                name,
                [
                    sys.executable,
                    __file__,
                    "--ticker",
                    str(tmp / f"{name}.ready"),
                    "--stop-file",
                    str(stop_file),
                    "--poll",
                    str(args.poll),
                    "--schedules",
                    str(args.schedules),
                ],
            )
        wait_for(lambda: all((tmp / f"{n}.ready").exists() for n in names), 60, "the tickers")
        sync_schedules()  # the first ticks are the next second's
        log.info("ticking for %ss with %d processes", args.seconds, args.processes)
        time.sleep(args.seconds)
        procs.check_alive()
        Schedule.objects.filter(name__startswith=PREFIX).update(enabled=False, next_tick_at=None)
        time.sleep(args.poll + 0.5)
    finally:
        stop_file.touch()
        procs.stop_all()

    lags_ms: list[float] = []
    per_schedule: dict[str, list[datetime]] = {}
    for key, created in WorkflowRun.objects.filter(workflow=WORKFLOW).values_list(
        "idempotency_key", "created_at"
    ):
        name, stamp = key.split(":", 1)[1].split(":", 1)
        tick = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        lags_ms.append((created - tick).total_seconds() * 1000)
        per_schedule.setdefault(name, []).append(tick)
    if not lags_ms:
        raise BenchError("no tick started a run")
    expected = sum(
        int((max(ticks) - min(ticks)).total_seconds()) + 1 for ticks in per_schedule.values()
    )
    p50 = percentile(lags_ms, 50)
    return {
        "benchmark": "cron_tick_lag",
        "processes": args.processes,
        "schedules": args.schedules,
        "seconds": args.seconds,
        "poll_s": args.poll,
        "runs": len(lags_ms),
        "ticks_expected": expected,
        "ticks_missing": expected - len(lags_ms),
        "lag_ms_p50": round(p50, 1),
        "lag_ms_p90": round(percentile(lags_ms, 90), 1),
        "lag_ms_max": round(max(lags_ms), 1),
        "target_p50_ms": TARGET_P50_MS,
        "p50_under_target": p50 < TARGET_P50_MS,
        "machine": machine(server, "cronsim"),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to tick (20)")
    parser.add_argument("--processes", type=int, default=3, help="ticking processes (3)")
    parser.add_argument("--schedules", type=int, default=3, help="schedules, each every second")
    parser.add_argument(
        "--poll", type=float, default=1.0, help="longest sleep between calls, seconds (1.0)"
    )
    parser.add_argument("--ticker", metavar="READY_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--stop-file", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.ticker:
        configure(args.schedules)
        ticker(Path(args.stop_file), Path(args.ticker), args.poll)
        return 0
    import tempfile

    ensure_database(URL)
    configure(args.schedules)
    with tempfile.TemporaryDirectory(prefix="pikku-cron-bench-") as tmp:
        result = measure(args, Path(tmp))
    print(
        format_table(
            ("runs", "expected", "missing", "p50 ms", "p90 ms", "max ms"),
            [
                (
                    str(result["runs"]),
                    str(result["ticks_expected"]),
                    str(result["ticks_missing"]),
                    str(result["lag_ms_p50"]),
                    str(result["lag_ms_p90"]),
                    str(result["lag_ms_max"]),
                )
            ],
        )
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
