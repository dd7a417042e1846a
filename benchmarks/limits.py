"""``python benchmarks/limits.py [--quick]``: what queue limits and priorities cost.

On PostgreSQL, one in-process worker of four threads; each figure next to its
baseline measured in the same run, in rounds (each starting at another claim figure):

- claims per second from a queue with a concurrency limit of 8, against the same
  queue without limits (target at least 0.8): ``runs`` runs of one no-op step, their
  steps made ready first, then claimed and run by the worker;
- the same with a rate limit far above what the worker reaches (``10000/1s``, and
  ``100000/1m``, whose window holds every claim of the last minute);

each batch of runs is ANALYZEd once made, as autovacuum would (the server may run
without it), and each figure starts from emptied tables; a first round of every
figure warms the server and the worker up and is dropped (``--no-warmup`` keeps it);
- steps per second of ``runs`` runs of five no-op steps with 100 distinct priorities, against
  the same runs all of one priority (target at least 0.9).

The database is ``PIKKU_BENCH_WORKFLOWS_URL`` (default ``.../pikku_bench_limits``);
its pikku tables are emptied first. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]
os.environ.setdefault(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_limits"
)
os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"

import django  # noqa: E402
from benchlib import ensure_database, pg_server_settings, wait_for  # noqa: E402

TABLES = (
    "pikku_step_attempt",
    "pikku_workflow_step",
    "pikku_workflow_run",
    "pikku_lease",
    "pikku_queue_claim",
)
#: The queues of the claim figures: none, a concurrency limit, and two rates.
QUEUES = {
    "free": {},
    "limited": {"concurrency": 8},
    "rated": {"rate": "10000/1s"},
    "rated_1m": {"rate": "100000/1m"},
}
TARGETS = {"concurrency": 0.8, "rate": 0.8, "rate_1m": 0.8, "priorities": 0.9}


class Bench:
    """An engine whose config declares :data:`QUEUES`, and a worker started per round."""

    def __init__(self) -> None:
        from types import MappingProxyType

        from pikku_django.workflows import WorkflowEngine
        from pikku_django.workflows.config import EngineConfig
        from pikku_django.workflows.control.queues import parse_queues

        config = EngineConfig.from_settings(queues=MappingProxyType(parse_queues(QUEUES)))
        self.engine = WorkflowEngine("default", config=config)

    def _with_worker(self, queues: list[str], until: Any) -> float:
        """Seconds from starting a worker on ``queues`` until ``until()`` holds."""
        from django.db import connections

        from pikku_django.workflows.worker.loop import Worker

        worker = Worker(self.engine, concurrency=4, queues=queues, poll_interval=0.05)
        thread = threading.Thread(target=worker.run, name="limits-worker", daemon=True)
        t0 = time.perf_counter()
        thread.start()
        try:
            wait_for(until, 600, "the round's runs", every=0.05)
            return time.perf_counter() - t0
        finally:
            worker.stop()
            thread.join(60)
            connections.close_all()

    def claims_per_second(self, queue: str, runs: int) -> float:
        """``runs`` one-step runs on ``queue``, passed first so their steps wait ready;
        then the worker claims and runs them: claims per second."""
        from pikku_django.models import RunStatus, WorkflowRun

        for _ in range(runs):
            self.engine.start("bench.queued", {"steps": 1}, queue=queue)
        while due := self.engine.claim_due_runs(50):
            for run_id in due:
                self.engine.orchestrate(run_id)  # no claimer: the step waits, ready
        analyze()
        # The tables were emptied first: every completed run is one of these.
        done = WorkflowRun.objects.filter(status=RunStatus.COMPLETED)
        elapsed = self._with_worker([queue], lambda: done.count() == runs)
        return runs / elapsed

    def steps_per_second(self, runs: int, priorities: int) -> float:
        """Runs of five steps through the worker, their priorities spread over
        ``priorities`` values: steps per second."""
        from pikku_django.models import RunStatus, WorkflowRun

        values = list(range(-50, -50 + priorities))
        for _ in range(runs):
            self.engine.start("bench.queued", {"steps": 5}, priority=random.choice(values))
        analyze()
        done = WorkflowRun.objects.filter(status=RunStatus.COMPLETED)
        return runs * 5 / self._with_worker([], lambda: done.count() == runs)


def analyze() -> None:
    """Refresh the planner's statistics of the tables, as autovacuum would after a
    batch this size (the benchmark's server may run without it)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {', '.join(TABLES)}")


def clear() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")


def measure(bench: Bench, runs: int, rounds: int, say: Any, warmup: bool) -> dict[str, Any]:
    """Each figure's median over ``rounds`` alternating rounds, with its ratio (after
    one round of every figure whose samples are dropped, with ``warmup``)."""
    samples: dict[str, list[float]] = {
        k: [] for k in ("free", "limited", "rated", "rated_1m", "one", "hundred")
    }
    order = ["free", "limited", "rated", "rated_1m"]
    for n in range(-1 if warmup else 0, rounds):
        name = "warm-up" if n < 0 else f"round {n + 1}"
        # Each round starts at another queue, so no figure always follows the same one.
        for queue in order[n % len(order) :] + order[: n % len(order)]:
            clear()
            got = bench.claims_per_second(queue, runs)
            say(f"{name}: {queue} {got:.0f} claims/s")
            if n >= 0:
                samples[queue].append(got)
        for key, priorities in (("one", 1), ("hundred", 100)):
            clear()
            got = bench.steps_per_second(runs, priorities)
            say(f"{name}: {priorities} priorities {got:.0f} steps/s")
            if n >= 0:
                samples[key].append(got)
    med = {k: statistics.median(v) for k, v in samples.items()}
    spread = {k: (min(v), max(v)) for k, v in samples.items()}

    def figure(value: str, baseline: str, target: str, unit: str) -> dict[str, Any]:
        ratio = med[value] / med[baseline]
        return {
            "value": round(med[value], 1),
            "value_range": [round(x, 1) for x in spread[value]],
            "baseline": round(med[baseline], 1),
            "baseline_range": [round(x, 1) for x in spread[baseline]],
            "unit": unit,
            "ratio": round(ratio, 3),
            "target": TARGETS[target],
            "met": ratio >= TARGETS[target],
        }

    return {
        "claims_per_s_concurrency_8": figure("limited", "free", "concurrency", "claims/s"),
        "claims_per_s_rate_10000_per_1s": figure("rated", "free", "rate", "claims/s"),
        "claims_per_s_rate_100000_per_1m": figure("rated_1m", "free", "rate_1m", "claims/s"),
        "steps_per_s_100_priorities": figure("hundred", "one", "priorities", "steps/s"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small end-to-end run")
    parser.add_argument("--runs", type=int, default=2000, help="runs per claim round (2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each figure (3)")
    parser.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="measure from the first round (by default one round of every figure runs first "
        "and its samples are dropped)",
    )
    args = parser.parse_args()
    url = os.environ["PIKKU_BENCH_WORKFLOWS_URL"]
    if not url.startswith("postgres"):
        parser.error("limits.py runs on PostgreSQL: set PIKKU_BENCH_WORKFLOWS_URL to postgres://")
    ensure_database(url)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    runs, rounds = (30, 1) if args.quick else (args.runs, args.rounds)

    def say(line: str) -> None:
        print(line, flush=True)

    figures = measure(Bench(), runs, rounds, say, args.warmup and not args.quick)
    clear()
    print(
        json.dumps(
            {
                "benchmark": "limits",
                "quick": args.quick,
                "runs": runs,
                "rounds": rounds,
                "warmup": args.warmup and not args.quick,
                "server": pg_server_settings(url),
                "figures": figures,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
