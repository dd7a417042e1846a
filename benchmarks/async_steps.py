"""``python benchmarks/async_steps.py [--quick]``: async I/O-bound steps per second in one
worker process, next to the same work as plain steps, in the same run.

On PostgreSQL, one in-process worker of four threads runs ``--runs`` runs of one step
each that waits ``--sleep`` seconds, all started before the worker: first as an
``async def`` step awaiting ``asyncio.sleep`` on the worker's event loop (at most
``PIKKU["ASYNC_CONCURRENCY"]`` at once), then as a plain step calling ``time.sleep``
on the worker's threads, the baseline. Each figure is steps per second from the
worker's start to the last run's end; the plain steps' ideal is threads / sleep.
Beside them, the most attempts of each kind that were running at one moment.
``--quick`` is a small end-to-end run.

The database is ``PIKKU_BENCH_WORKFLOWS_URL`` (default ``.../pikku_bench_async``);
its pikku tables are emptied first. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]
os.environ.setdefault(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_async"
)
os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"

import django  # noqa: E402
from benchlib import ensure_database, wait_for  # noqa: E402

TABLES = ("pikku_step_attempt", "pikku_workflow_step", "pikku_workflow_run", "pikku_lease")
THREADS = 4


def register() -> None:
    """The benchmark's two workflows: one async step, or one plain step, that sleeps."""
    from pikku_django.workflows import WorkflowContext, step, workflow

    @step(name="bench.async_nap")
    async def async_nap(data: dict[str, Any]) -> int:
        await asyncio.sleep(data["sleep"])
        return int(data["n"])

    @step(name="bench.sync_nap")
    def sync_nap(data: dict[str, Any]) -> int:
        time.sleep(data["sleep"])
        return int(data["n"])

    @workflow(name="bench.async_naps")
    def async_naps(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
        return ctx.do("nap", "bench.async_nap", input)

    @workflow(name="bench.sync_naps")
    def sync_naps(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
        return ctx.do("nap", "bench.sync_nap", input)


def most_at_once(function: str) -> int:
    """The most attempts of the step ``function`` that were running at one moment."""
    from pikku_django.models import StepAttempt

    spans = StepAttempt.objects.filter(step__function=function).values_list(
        "started_at", "finished_at"
    )
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = running = 0
    for _, change in events:  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


def steps_per_second(workflow: str, runs: int, sleep: float) -> float:
    """Start ``runs`` runs of ``workflow``, then a fresh worker: steps per second."""
    from django.db import connections

    from pikku_django.models import RunStatus, WorkflowRun
    from pikku_django.workflows import WorkflowEngine
    from pikku_django.workflows.worker.loop import Worker

    engine = WorkflowEngine("default")
    ids = [engine.start(workflow, {"n": n, "sleep": sleep}).id for n in range(runs)]
    done = WorkflowRun.objects.filter(id__in=ids, status=RunStatus.COMPLETED)
    worker = Worker(engine, concurrency=THREADS)
    thread = threading.Thread(target=worker.run, name="async-bench-worker", daemon=True)
    t0 = time.perf_counter()
    thread.start()
    try:
        wait_for(lambda: done.count() == runs, 600, f"the {workflow} runs", every=0.01)
        return runs / (time.perf_counter() - t0)
    finally:
        worker.stop()
        thread.join(60)
        connections.close_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small end-to-end run")
    parser.add_argument("--runs", type=int, default=None, help="runs of each kind (400)")
    parser.add_argument("--sleep", type=float, default=None, help="each step's wait (0.2 s)")
    args = parser.parse_args()
    runs = args.runs or (20 if args.quick else 400)
    sleep = args.sleep if args.sleep is not None else (0.05 if args.quick else 0.2)
    url = os.environ["PIKKU_BENCH_WORKFLOWS_URL"]
    if not url.startswith("postgres"):
        parser.error("async_steps.py runs on PostgreSQL: set PIKKU_BENCH_WORKFLOWS_URL")
    ensure_database(url)
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from pikku_django.conf import pikku_settings

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")
    register()
    async_rate = steps_per_second("bench.async_naps", runs, sleep)
    print(f"async steps: {async_rate:.1f}/s ({runs} steps of {sleep:g} s)", flush=True)
    sync_rate = steps_per_second("bench.sync_naps", runs, sleep)
    print(
        f"plain steps (baseline): {sync_rate:.1f}/s, ideal {THREADS / sleep:.1f}/s "
        f"on {THREADS} threads",
        flush=True,
    )
    print(
        json.dumps(
            {
                "benchmark": "async_steps",
                "quick": args.quick,
                "runs": runs,
                "sleep_s": sleep,
                "threads": THREADS,
                "async_concurrency": int(pikku_settings.ASYNC_CONCURRENCY),
                "figures": {
                    "async_steps_per_s": round(async_rate, 2),
                    "sync_steps_per_s": round(sync_rate, 2),
                    "sync_ideal_steps_per_s": round(THREADS / sleep, 2),
                    "speedup": round(async_rate / sync_rate, 2),
                    "async_most_at_once": most_at_once("bench.async_nap"),
                    "sync_most_at_once": most_at_once("bench.sync_nap"),
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
