"""Event round trip: from ``send_event`` to the waiting run's next step, on PostgreSQL.

A worker (four threads, woken by LISTEN/NOTIFY) runs in this process. Each sample
is a fresh run parked at ``ctx.wait_for_event``; the time is from just before
``send_event`` to the start of the step that follows the wait. Beside it, measured
in the same run and interleaved with it, two baselines: ``resume_workflow`` of a
run suspended at ``ctx.suspend`` to its next step, and a fresh run's start to its
first step. Printed: a table, then one JSON object as the last line.

PostgreSQL at PIKKU_BENCH_POSTGRES_URL (default
postgres://postgres@127.0.0.1:5432/pikku_bench_events); the database is created if
missing and this benchmark's runs are deleted before it starts.

    python benchmarks/events.py --samples 100
    python benchmarks/events.py --quick
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]

from benchlib import BenchError, ensure_database, format_table, machine, wait_for  # noqa: E402
from figures import latency_json  # noqa: E402

log = logging.getLogger("pikku.bench.events")

URL = os.environ.get(
    "PIKKU_BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_events"
)
PREFIX = "bench.events."

#: When the step after each run's wait started (time.perf_counter()), by run id.
_marked: dict[str, float] = {}
_marked_lock = threading.Lock()


def configure() -> None:
    """Django on the benchmark database, with the three workflows measured."""
    import dj_database_url
    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="pikku-bench-not-secret",  # noqa: S106
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["pikku_django"],
        DATABASES={"default": {**dj_database_url.parse(URL), "CONN_MAX_AGE": None}},
        LOGGING_CONFIG=None,
    )
    django.setup()
    logging.getLogger("pikku_django").setLevel(logging.WARNING)

    from pikku_django.workflows import step, workflow

    @step(name=PREFIX + "mark")
    def mark(data: Any) -> None:
        with _marked_lock:
            _marked.setdefault(str(data["run"]), time.perf_counter())

    @workflow(name=PREFIX + "wait")
    def wait_for_go(ctx: Any, input: Any) -> None:
        ctx.wait_for_event("go")
        ctx.do("mark", mark, {"run": str(ctx.run_id)})

    @workflow(name=PREFIX + "suspend")
    def suspended(ctx: Any, input: Any) -> None:
        ctx.suspend("bench")
        ctx.do("mark", mark, {"run": str(ctx.run_id)})

    @workflow(name=PREFIX + "start")
    def started(ctx: Any, input: Any) -> None:
        ctx.do("mark", mark, {"run": str(ctx.run_id)})


def _marked_at(run_id: Any, timeout: float) -> float:
    key = str(run_id)

    def found() -> float | None:
        with _marked_lock:
            return _marked.get(key)

    return float(wait_for(found, timeout, f"the step after run {key}'s wake", every=0.0005))


def sample_event(timeout: float) -> float:
    from pikku_django.models import StepKind, WorkflowStep
    from pikku_django.workflows import send_event, start_workflow

    run = start_workflow(PREFIX + "wait")
    wait_for(
        lambda: WorkflowStep.objects.filter(run_id=run.id, kind=StepKind.EVENT).exists(),
        timeout,
        "the run to reach its wait",
    )
    time.sleep(0.02)  # let the pass that stored the wait finish parking the run
    started = time.perf_counter()
    send_event(run.id, "go", {"n": 1})
    return (_marked_at(run.id, timeout) - started) * 1000


def sample_resume(timeout: float) -> float:
    from pikku_django.models import RunStatus, WorkflowRun
    from pikku_django.workflows import resume_workflow, start_workflow

    run = start_workflow(PREFIX + "suspend")
    wait_for(
        lambda: WorkflowRun.objects.filter(id=run.id, status=RunStatus.SUSPENDED).exists(),
        timeout,
        "the run to suspend",
    )
    started = time.perf_counter()
    resume_workflow(run.id, {"n": 1})
    return (_marked_at(run.id, timeout) - started) * 1000


def sample_start(timeout: float) -> float:
    from pikku_django.workflows import start_workflow

    started = time.perf_counter()
    run = start_workflow(PREFIX + "start")
    return (_marked_at(run.id, timeout) - started) * 1000


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connection

    from pikku_django.models import WorkflowRun
    from pikku_django.workflows import get_engine
    from pikku_django.workflows.worker.loop import Worker

    call_command("migrate", "pikku_django", verbosity=0)
    WorkflowRun.objects.filter(workflow__startswith=PREFIX).delete()
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = str(cursor.fetchone()[0])

    worker = Worker(get_engine(), concurrency=4, poll_interval=5.0)
    thread = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
    thread.start()
    kinds: dict[str, Callable[[float], float]] = {
        "send_event": sample_event,
        "resume_workflow": sample_resume,
        "start_workflow": sample_start,
    }
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    try:
        for warm in kinds.values():  # warm: connections, prepared statements
            warm(args.timeout)
        for i in range(args.samples):
            # Interleaved, in a rotating order: a slow moment falls on each alike.
            order = list(kinds.items())
            order = order[i % len(order) :] + order[: i % len(order)]
            for name, sample in order:
                samples[name].append(sample(args.timeout))
    finally:
        worker.stop()
        thread.join(30)
        if thread.is_alive():
            raise BenchError("the worker did not stop")
    figures = {name: latency_json(values) for name, values in samples.items()}
    event, resume = figures["send_event"], figures["resume_workflow"]
    if event is None or resume is None:
        raise BenchError("no samples")
    return {
        "benchmark": "event_round_trip",
        "samples": args.samples,
        "event_round_trip_ms": event,
        "baselines": {
            "resume_workflow_ms": resume,
            "start_to_first_step_ms": figures["start_workflow"],
        },
        "p50_ratio_to_resume": (
            round(event["p50_ms"] / resume["p50_ms"], 2) if resume["p50_ms"] else None
        ),
        "machine": machine(server),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--samples", type=int, default=100, help="samples of each kind (100)")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="longest wait for one sample, seconds (60)"
    )
    parser.add_argument("--quick", action="store_true", help="a few samples (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples = 5
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ensure_database(URL)
    configure()
    result = measure(args)
    rows = [("send_event (this)", result["event_round_trip_ms"])]
    rows += [(name.removesuffix("_ms"), value) for name, value in result["baselines"].items()]
    print(
        format_table(
            ("round trip", "p50 ms", "p95 ms", "max ms"),
            [
                (name, str(fig["p50_ms"]), str(fig["p95_ms"]), str(fig["max_ms"]))
                for name, fig in rows
                if fig is not None
            ],
        )
    )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
