"""``python benchmarks/fanout.py [--quick] [--children N] [--repeats R]``: a fan-out of
child runs against as many independent runs.

On PostgreSQL, one in-process worker of four threads. Each repeat times, from first
start to last end:

- a parent run whose ``ctx.parallel`` group starts N child runs and joins them all
  (children per second, parent start to parent completed);
- N independent runs of the same child workflow, each started by ``engine.start``
  (runs per second, first start to last completed): the baseline.

The ratio of the two medians is the figure (target at least 0.9): a child of a
fan-out costs about what a run of its own does. Full size: 1,000 children, three
repeats; ``--quick`` is 100 children, one repeat. The database is
``PIKKU_BENCH_WORKFLOWS_URL`` (default ``.../pikku_bench_fanout``); its pikku tables
are emptied first. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]
os.environ.setdefault(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_fanout"
)
os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"

import django  # noqa: E402
from benchlib import ensure_database, pg_server_settings, wait_for  # noqa: E402

TABLES = ("pikku_step_attempt", "pikku_workflow_step", "pikku_workflow_run", "pikku_lease")


def register() -> None:
    from pikku_django.workflows import WorkflowContext, workflow

    def add_one(n: int) -> int:
        return n + 1

    @workflow(name="fanout.child")
    def child(ctx: WorkflowContext, n: int) -> int:
        return int(ctx.do("add", add_one, n))

    @workflow(name="fanout.parent")
    def parent(ctx: WorkflowContext, inp: dict[str, Any]) -> int:
        group = ctx.parallel("children")
        for n in range(int(inp["children"])):
            group.do("child", child, n)
        return sum(group.join())


class Bench:
    """An in-process worker over the benchmark database, and the two timings."""

    def __init__(self, children: int) -> None:
        from pikku_django.workflows import WorkflowEngine

        self.children = children
        self.engine = WorkflowEngine("default")
        self.worker: Any = None
        self.thread: threading.Thread | None = None

    def start_worker(self) -> None:
        from pikku_django.workflows.worker.loop import Worker

        self.worker = Worker(self.engine, concurrency=4)
        self.thread = threading.Thread(target=self.worker.run, name="fanout-worker", daemon=True)
        self.thread.start()
        time.sleep(0.5)

    def stop_worker(self) -> None:
        from django.db import connections

        self.worker.stop()
        assert self.thread is not None
        self.thread.join(60)
        connections.close_all()

    def fan_out(self) -> float:
        """Children per second of one parent's fan-out, parent start to its end."""
        from pikku_django.models import RunStatus, WorkflowRun

        n = self.children
        t0 = time.perf_counter()
        run = self.engine.start("fanout.parent", {"children": n})
        done = WorkflowRun.objects.filter(id=run.id, status__in=RunStatus.values[2:])
        wait_for(done.exists, 1800, "the fan-out")
        elapsed = time.perf_counter() - t0
        run.refresh_from_db()
        expected = sum(range(1, n + 1))
        if run.status != RunStatus.COMPLETED or run.output != expected:
            raise SystemExit(f"the fan-out ended {run.status}: {run.output or run.error}")
        return n / elapsed

    def independent(self) -> float:
        """Runs per second of as many independent runs, first start to last end."""
        from pikku_django.models import RunStatus, WorkflowRun

        n = self.children
        t0 = time.perf_counter()
        ids = [self.engine.start("fanout.child", i).id for i in range(n)]
        runs = WorkflowRun.objects.filter(id__in=ids)
        wait_for(lambda: runs.filter(status=RunStatus.COMPLETED).count() == n, 1800, "the runs")
        return n / (time.perf_counter() - t0)


def summary(values: list[float]) -> dict[str, Any]:
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    median = statistics.median(values)
    return {
        "median": round(median, 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "q1": round(quartiles[0], 2),
        "q3": round(quartiles[2], 2),
        "spread_pct": round(100 * (max(values) - min(values)) / median, 1) if median else 0.0,
        "repeats": len(values),
    }


def measure(bench: Bench, repeats: int, say: Callable[[str], None]) -> dict[str, Any]:
    fan, solo = [], []
    bench.start_worker()
    try:
        for r in range(repeats):
            # Alternate which goes first, so neither always meets the warmer caches.
            order = (bench.fan_out, bench.independent) if r % 2 == 0 else (
                bench.independent, bench.fan_out)  # fmt: skip
            for timing in order:
                value = timing()
                (fan if timing == bench.fan_out else solo).append(value)
                say(f"repeat {r + 1}: {timing.__name__} {value:.1f}/s")
    finally:
        bench.stop_worker()
    fan_s, solo_s = summary(fan), summary(solo)
    ratio = round(fan_s["median"] / solo_s["median"], 3) if solo_s["median"] else None
    say(
        f"fan-out of {bench.children} children: {fan_s['median']:.1f} children/s; "
        f"{bench.children} independent runs: {solo_s['median']:.1f} runs/s; "
        f"ratio {ratio} (target >= 0.9)"
    )
    return {
        "fanout_children_per_s": {
            **fan_s,
            "baseline": solo_s,
            "ratio": ratio,
            "unit": "children/s",
            "baseline_unit": "independent runs/s",
            "target": ">= 0.9",
        }
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 children, one repeat")
    parser.add_argument("--children", type=int, default=None, help="children (1000)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (3)")
    args = parser.parse_args()
    url = os.environ["PIKKU_BENCH_WORKFLOWS_URL"]
    if not url.startswith("postgres"):
        parser.error("fanout.py runs on PostgreSQL: set PIKKU_BENCH_WORKFLOWS_URL to postgres://")
    children = args.children or (100 if args.quick else 1000)
    repeats = args.repeats or (1 if args.quick else 3)
    ensure_database(url)
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")
    register()

    def say(line: str) -> None:
        print(line, flush=True)

    figures = measure(Bench(children), repeats, say)
    print(
        json.dumps(
            {
                "benchmark": "fanout",
                "quick": args.quick,
                "children": children,
                "repeats": repeats,
                "server": pg_server_settings(url),
                "figures": figures,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
