"""``python benchmarks/retention.py [--quick]``: the retention job's rows/s next to pikku_prune's.

On PostgreSQL, the same data loaded before each (``scale.py``'s bulk load: completed
runs of 10 steps and attempts each, and failed runs of one, 40 days old, by SQL, then
``ANALYZE``): ``pikku_prune --older-than 30d`` deletes it once, and the retention job
(the ``pikku.retention`` workflow, its steps run by an engine in this process, with
``PIKKU["RETENTION"] = "30d"``) deletes it again; ``--rounds`` pairs (3; 1 with
``--quick``), in alternating order, the medians printed. Both delete 500 rows a
transaction; the job's own run, step and attempt are left, so it counts three rows
fewer. The database is
``PIKKU_BENCH_WORKFLOWS_URL`` (default ``.../pikku_bench_retention``); its pikku tables
are emptied first. The last line printed is one JSON object.
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

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]
os.environ.setdefault(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_retention"
)

import django  # noqa: E402
from benchlib import ensure_database  # noqa: E402
from scale import TABLES, bulk_load  # noqa: E402  (sets DJANGO_SETTINGS_MODULE)


def rows() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        total = 0
        for table in TABLES[:3]:
            cursor.execute(f"SELECT count(*) FROM {table}")
            total += int(cursor.fetchone()[0])
        return total


def load(completed: int, failed: int) -> None:
    from django.db import connection

    bulk_load("completed", completed)
    bulk_load("failed", failed)
    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"ANALYZE {table}")


def timed(delete: Callable[[], None]) -> tuple[float, int]:
    """Rows per second ``delete()`` removes, and how many."""
    before = rows()
    t0 = time.perf_counter()
    delete()
    elapsed = time.perf_counter() - t0
    deleted = before - rows()
    return deleted / elapsed, deleted


def prune() -> None:
    from django.core.management import call_command

    with open(os.devnull, "w") as quiet:
        call_command("pikku_prune", "--older-than", "30d", stdout=quiet)


def retention_job() -> None:
    from django.test import override_settings

    from pikku_django.models import RunStatus
    from pikku_django.retention import RETENTION_WORKFLOW
    from pikku_django.workflows import WorkflowEngine

    with override_settings(PIKKU={"RETENTION": "30d"}):
        engine = WorkflowEngine("default")
        run = engine.start(RETENTION_WORKFLOW)
        engine.run_until_idle()
        assert engine.get_run(run.id).status == RunStatus.COMPLETED


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small end-to-end run")
    parser.add_argument(
        "--rounds", type=int, default=None, help="pairs of deletions (3; --quick: 1)"
    )
    args = parser.parse_args()
    url = os.environ["PIKKU_BENCH_WORKFLOWS_URL"]
    if not url.startswith("postgres"):
        parser.error("retention.py runs on PostgreSQL: set PIKKU_BENCH_WORKFLOWS_URL")
    ensure_database(url)
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")
    completed, failed = (2_000, 200) if args.quick else (20_000, 2_000)
    rounds = args.rounds or (1 if args.quick else 3)
    figures: dict[str, list[float]] = {"pikku_prune": [], "retention_job": []}
    deleted: dict[str, int] = {}
    for n in range(rounds):
        pair = [("pikku_prune", prune), ("retention_job", retention_job)]
        for name, delete in pair if n % 2 == 0 else pair[::-1]:
            load(completed, failed)
            rate, count = timed(delete)
            figures[name].append(rate)
            deleted[name] = count
            print(f"{name}: {count} rows at {rate:.0f} rows/s", flush=True)
    medians = {name: statistics.median(rates) for name, rates in figures.items()}
    ratio = medians["retention_job"] / medians["pikku_prune"]
    print(
        f"median rows/s: retention job {medians['retention_job']:.0f}, "
        f"pikku_prune {medians['pikku_prune']:.0f} ({ratio:.2f}x)",
        flush=True,
    )
    print(
        json.dumps(
            {
                "benchmark": "retention",
                "quick": args.quick,
                "runs": {"completed": completed, "failed": failed},
                "rows_deleted": deleted,
                "rows_per_s": {name: round(value, 1) for name, value in medians.items()},
                "retention_against_prune": round(ratio, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
