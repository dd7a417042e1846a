"""``python benchmarks/bulk_start.py [--quick] [--runs N] [--repeats R]``: starting N
runs with one ``start_workflows`` call against ``start_workflow`` in a loop.

Each repeat times both ways of starting N runs of a one-step workflow (no worker
runs them; the tables are emptied between timings), alternating which goes first.
The figure is the ratio of the medians, one by one over bulk (target at least 10),
beside each way's runs per second and, on PostgreSQL, the server's transactions per
run (``pg_stat_database`` commits and rollbacks before and after). Full size: 10,000
runs, three repeats; ``--quick`` is 1,000 runs, one repeat; ``--no-first-step`` turns
``PIKKU["FIRST_STEP_AT_START"]`` off for both. The database is
``PIKKU_BENCH_WORKFLOWS_URL`` (default ``postgres://.../pikku_bench_bulk``; a
``mysql://`` or ``sqlite:///`` one works too, without the transaction count); its
pikku tables are emptied first. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]
os.environ.setdefault(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_bulk"
)
os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"

import django  # noqa: E402
from benchlib import (  # noqa: E402
    ensure_database,
    mysql_ensure_database,
    pg_server_settings,
    server_transactions,
)

TABLES = ("pikku_step_attempt", "pikku_workflow_step", "pikku_workflow_run")
WORKFLOW = "bulk.bench"


def register() -> None:
    from pikku_django.workflows import WorkflowContext, workflow

    def send(user: int) -> int:
        return user

    @workflow(name=WORKFLOW)
    def newsletter(ctx: WorkflowContext, inp: dict[str, Any]) -> int:
        return int(ctx.do("send", send, inp["user"]))


def empty() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")


def report_counts() -> None:
    """Have this process's PostgreSQL backend, which made the starts, report its
    transaction counts to the server now: left alone, a busy server may keep them up to
    10 s (PGSTAT_IDLE_INTERVAL). The flush happens before the statement returns."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")


class Timing:
    """One way of starting the runs: seconds taken, and server transactions per run."""

    def __init__(self, url: str, runs: int) -> None:
        self.url = url
        self.runs = runs
        self.counted = url.startswith("postgres")

    def one_by_one(self) -> None:
        from pikku_django.workflows import start_workflow

        for user in range(self.runs):
            start_workflow(WORKFLOW, {"user": user})

    def bulk(self) -> None:
        from pikku_django.workflows import start_workflows

        start_workflows(WORKFLOW, [{"user": user} for user in range(self.runs)])

    def time(self, start: Callable[[], None]) -> tuple[float, float | None]:
        from pikku_django.models import WorkflowRun

        empty()
        report_counts()
        before = server_transactions(self.url) if self.counted else 0
        t0 = time.perf_counter()
        start()
        elapsed = time.perf_counter() - t0
        report_counts()
        after = server_transactions(self.url) if self.counted else 0
        made = WorkflowRun.objects.count()
        if made != self.runs:
            raise SystemExit(f"{start.__name__} made {made} runs, not {self.runs}")
        # Less the count's own read (one transaction each side).
        per_run = (after - before - 1) / self.runs if self.counted else None
        return elapsed, per_run


def summary(values: list[float]) -> dict[str, Any]:
    median = statistics.median(values)
    return {
        "median": round(median, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "spread_pct": round(100 * (max(values) - min(values)) / median, 1) if median else 0.0,
        "repeats": len(values),
    }


def measure(timing: Timing, repeats: int, say: Callable[[str], None]) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {"one_by_one": [], "bulk": []}
    xacts: dict[str, float | None] = {}
    ways = {"one_by_one": timing.one_by_one, "bulk": timing.bulk}
    timing.runs, n = min(100, timing.runs), timing.runs
    for way in ways.values():  # warm up: imports, connections, statement caches
        timing.time(way)
    timing.runs = n
    for r in range(repeats):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            elapsed, per_run = timing.time(ways[name])
            seconds[name].append(elapsed)
            xacts[name] = per_run
            say(f"repeat {r + 1}: {name} {n} runs in {elapsed:.3f}s ({n / elapsed:.0f} runs/s)")
    empty()
    one, bulk = summary(seconds["one_by_one"]), summary(seconds["bulk"])
    ratio = round(one["median"] / bulk["median"], 1) if bulk["median"] else None
    say(
        f"{n} runs: one by one {one['median']:.3f}s, bulk {bulk['median']:.3f}s: "
        f"ratio {ratio} (target >= 10); server transactions per run: "
        f"one by one {xacts['one_by_one']}, bulk {xacts['bulk']}"
    )
    return {
        "bulk_start_seconds": {
            **bulk,
            "baseline": one,
            "ratio": ratio,
            "unit": f"s to start {n} runs with start_workflows",
            "baseline_unit": f"s to start {n} runs with start_workflow in a loop",
            "target": ">= 10",
            "runs_per_s": round(n / bulk["median"]),
            "baseline_runs_per_s": round(n / one["median"]),
            "server_transactions_per_run": xacts["bulk"],
            "baseline_server_transactions_per_run": xacts["one_by_one"],
        }
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 runs, one repeat")
    parser.add_argument("--runs", type=int, default=None, help="runs (10,000)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (3)")
    parser.add_argument(
        "--no-first-step",
        action="store_true",
        help='PIKKU["FIRST_STEP_AT_START"] off: neither way looks for first steps',
    )
    args = parser.parse_args()
    url = os.environ["PIKKU_BENCH_WORKFLOWS_URL"]
    runs = args.runs or (1000 if args.quick else 10_000)
    repeats = args.repeats or (1 if args.quick else 3)
    if url.startswith("postgres"):
        ensure_database(url)
    elif url.startswith("mysql"):
        mysql_ensure_database(url)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.no_first_step:
        from django.conf import settings
        from django.test.utils import override_settings

        override_settings(PIKKU={**settings.PIKKU, "FIRST_STEP_AT_START": False}).enable()
    register()

    def say(line: str) -> None:
        print(line, flush=True)

    figures = measure(Timing(url, runs), repeats, say)
    print(
        json.dumps(
            {
                "benchmark": "bulk_start",
                "quick": args.quick,
                "runs": runs,
                "repeats": repeats,
                "first_step_at_start": not args.no_first_step,
                "database": url.split(":", 1)[0],
                "server": pg_server_settings(url) if url.startswith("postgres") else {},
                "figures": figures,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
