"""``python benchmarks/scale.py [--quick | --scale F]``: how a worker holds up as tables grow.

On PostgreSQL, one in-process worker of four threads, each figure next to its baseline
measured in the same run:

- steps/s for runs of 10 queued steps on empty tables, then after bulk-loading
  completed runs (10 steps and attempts each, by SQL), then sleeping runs (a one-day
  ``ctx.sleep``), then failed runs; each against the empty-table figure (target 0.9),
  with the server's buffer reads and transactions per step beside the empty tables'
  (the work a step costs, which the machine's load does not change);
- a long run's time per step against a 10-step run's (target at most 1.5x);
- runs of 10 registered (queued) steps started with ``inline=True`` against runs of 10
  inline closures, in the caller's thread (target at least 0.5x), with SQL per run;
- start-to-first-step latency of an idle worker, p50 and p95, on empty and loaded
  tables (target p50 under 10 ms);
- the loaded figures again with Django's default ``CONN_MAX_AGE = 0``, against 60;
- an idle worker's server transactions per second, loaded against empty;
- the rows per second ``pikku_prune`` deletes;
- 1,000 runs of one queued step against 1,000 Procrastinate jobs, with the server
  transactions of each (``throughput.py``'s pairing, in a process of its own;
  ``--no-single`` leaves it out).

Before every steps/s phase (the empty tables too) the pikku tables get the same
``VACUUM ANALYZE``, as a server's autovacuum would give them after a bulk load: freshly
loaded rows otherwise carry no hint bits and no visibility map, so the first phase
after a load pays a one-off cost no running system has; then a ``CHECKPOINT``, so the
load's writes are flushed before the phase rather than during it. ``--no-vacuum`` runs only
``ANALYZE`` instead (the earlier measurement). What ran, and how long it took, is in
the JSON under ``maintenance``.

Full size: 200 runs of 10 steps (each steps/s figure the median of ``--repeats``
batches, 3), 200,000 completed, 100,000 sleeping and 20,000 failed
runs, 1,000- and 2,000-step runs. ``--scale 0.1`` divides the loaded rows and the long
runs by ten (``--long 1000,2000`` keeps the long runs whole); ``--quick`` is a small
end-to-end run. ``--only long`` measures only the long runs against the 10-step run
(``--repeats N`` rounds, interleaved, medians printed), without loading tables. The
database is ``PIKKU_BENCH_WORKFLOWS_URL`` (default ``.../pikku_bench_scale``); its
pikku tables are emptied first. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH_DIR), str(BENCH_DIR.parent)]
os.environ.setdefault(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_scale"
)
os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"

import django  # noqa: E402
from benchlib import (  # noqa: E402
    STATS_SETTLE,
    ensure_database,
    percentile,
    pg_server_settings,
    wait_for,
)

MARKS: dict[int, float] = {}
TABLES = ("pikku_step_attempt", "pikku_workflow_step", "pikku_workflow_run", "pikku_lease")


def sizes(args: argparse.Namespace) -> dict[str, int]:
    if args.quick:
        return dict(runs=20, completed=2_000, sleeping=1_000, failed=200, long1=100, long2=200,
                    latency=15, inline=10, repeats=1)  # fmt: skip
    f = args.scale
    long1, long2 = args.long or (max(int(1_000 * f), 20), max(int(2_000 * f), 40))
    return {
        "runs": 200,
        "completed": int(200_000 * f),
        "sleeping": int(100_000 * f),
        "failed": int(20_000 * f),
        "long1": long1,
        "long2": long2,
        "latency": 100,
        "inline": 100,
        "repeats": args.repeats,
    }


class Bench:
    """The worker, the engine and the measurements over one database."""

    def __init__(self, size: dict[str, int]) -> None:
        from pikku_django.workflows import WorkflowEngine

        self.size = size
        self.engine = WorkflowEngine("default")
        self.worker: Any = None
        #: The last steps/s figure's buffers and transactions a step, on the server.
        self.per_step: dict[str, float] = {}
        self.thread: threading.Thread | None = None

    # -- the worker -----------------------------------------------------------------------

    def start_worker(self) -> None:
        from pikku_django.workflows.worker.loop import Worker

        self.worker = Worker(self.engine, concurrency=4)
        self.thread = threading.Thread(target=self.worker.run, name="scale-worker", daemon=True)
        self.thread.start()
        time.sleep(0.5)

    def stop_worker(self) -> None:
        from django.db import connections

        self.worker.stop()
        assert self.thread is not None
        self.thread.join(60)
        connections.close_all()

    # -- figures --------------------------------------------------------------------------

    def steps_per_second(self) -> float:
        """10-step runs through the worker: steps per second from first start to last
        end, the median of ``repeats`` batches."""
        from pikku_django.models import RunStatus, WorkflowRun

        n, figures = self.size["runs"], []
        before = self.server_counts()
        for _ in range(self.size.get("repeats", 1)):
            t0 = time.perf_counter()
            ids = [self.engine.start("bench.queued", {"steps": 10}).id for _ in range(n)]
            runs = WorkflowRun.objects.filter(id__in=ids)
            done = runs.filter(status=RunStatus.COMPLETED)
            wait_for(lambda d=done: d.count() == n, 600, "the runs")
            figures.append(n * 10 / (time.perf_counter() - t0))
        time.sleep(STATS_SETTLE)  # the worker's statistics reach the server
        after = self.server_counts()
        steps = n * 10 * len(figures)
        self.per_step = {k: (after[k] - before[k]) / steps for k in before}
        return percentile(figures, 50)

    def server_counts(self) -> dict[str, int]:
        """The database's buffer reads (from shared buffers or not) and transactions
        so far, by the server's statistics: the work done, whatever the machine's load."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT blks_hit + blks_read, blks_read, xact_commit + xact_rollback "
                "FROM pg_stat_database WHERE datname = current_database()"
            )
            blocks, read, transactions = cursor.fetchone()
        return {"blocks": int(blocks), "read": int(read), "transactions": int(transactions)}

    def per_step_ms(self, steps: int, repeats: int = 1) -> float:
        from pikku_django.models import RunStatus, WorkflowRun

        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run_id = self.engine.start("bench.queued", {"steps": steps}).id
            run = WorkflowRun.objects.filter(id=run_id, status=RunStatus.COMPLETED)
            wait_for(run.exists, 1800, f"the {steps}-step run", every=0.005)
            times.append((time.perf_counter() - t0) * 1000 / steps)
        return percentile(times, 50)

    def latency_ms(self) -> tuple[float, float]:
        """Start-to-first-step on an idle worker: p50 and p95 in milliseconds."""
        samples = []
        for i in range(self.size["latency"]):
            time.sleep(0.05)  # the worker goes idle
            key = len(MARKS) + 1_000_000 * (i + 1)
            t0 = time.perf_counter()
            self.engine.start("scale.first", {"key": key})
            wait_for(lambda k=key: k in MARKS, 30, "the first step", every=0.0005)
            samples.append((MARKS[key] - t0) * 1000)
        return percentile(samples, 50), percentile(samples, 95)

    def inline_runs(self, workflow: str, runs: int) -> tuple[float, float]:
        """Runs of 10 steps started with ``inline=True`` in this thread, one after the
        other: runs per second, and SQL statements per run."""
        from django.db import connection

        statements = 0

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            nonlocal statements
            statements += 1
            return execute(sql, params, many, context)

        for _ in range(3):  # warm-up
            self.engine.start(workflow, {"steps": 10}, inline=True)
        with connection.execute_wrapper(count):
            t0 = time.perf_counter()
            for _ in range(runs):
                run = self.engine.start(workflow, {"steps": 10}, inline=True)
                assert run.status == "completed", run.status
            seconds = time.perf_counter() - t0
        return runs / seconds, statements / runs

    def idle_transactions_per_second(self, seconds: float) -> float:
        from django.db import connection

        def count() -> int:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                    "WHERE datname = current_database()"
                )
                return int(cursor.fetchone()[0])

        # Earlier work's statistics reach the server: an idle backend may hold its
        # counts for up to 10 s (PostgreSQL's PGSTAT_IDLE_INTERVAL).
        time.sleep(STATS_SETTLE)
        before = count()
        time.sleep(seconds)
        after = count()
        return max(after - before - 2, 0) / seconds  # less this process's two reads

    def prune_rows_per_second(self) -> tuple[float, int]:
        from django.core.management import call_command
        from django.db import connection

        def rows() -> int:
            with connection.cursor() as cursor:
                total = 0
                for table in TABLES[:3]:
                    cursor.execute(f"SELECT count(*) FROM {table}")
                    total += int(cursor.fetchone()[0])
                return total

        before = rows()
        t0 = time.perf_counter()
        call_command("pikku_prune", "--older-than", "1d", stdout=open(os.devnull, "w"))  # noqa: SIM115
        elapsed = time.perf_counter() - t0
        deleted = before - rows()
        return deleted / elapsed, deleted


def bulk_load(kind: str, count: int, chunk: int = 20_000) -> None:
    """``count`` runs of ``kind`` (completed, sleeping, failed) with their steps and
    attempts, by SQL."""
    from django.db import connection

    old = "now() - interval '40 days'"
    run_cols = (
        "id, workflow, status, input, output, error, suspend_reason, inline, "
        "idempotency_key, wake_at, wakes, pass_errors, created_at, updated_at"
    )
    step_cols = (
        "run_id, name, kind, function, input, status, result, error, retries, retry_delay, "
        "backoff, attempt, lease_expires_at, child_run_id, queue, transactional, "
        "available_at, created_at, updated_at"
    )
    attempt_cols = "step_id, attempt, status, result, error, worker, started_at, finished_at"
    error = '\'{"type": "RuntimeError", "message": "bulk"}\'::jsonb'
    if kind == "completed":
        run = f"'bench.queued', 'completed', '{{\"steps\": 10}}', '10', NULL, '', false, NULL, NULL, 11, 0, {old}, {old}"  # noqa: E501
        steps = f"'s' || g, 'queued', 'bench.noop', 'null', 'succeeded', 'null', NULL, 5, 0, 'fixed', 1, NULL, NULL, 'default', false, NULL, {old}, {old}"  # noqa: E501
        per_run, attempt = "generate_series(0, 9) g", "'succeeded', 'null', NULL"
    elif kind == "sleeping":
        run = "'scale.sleeper', 'running', 'null', NULL, NULL, '', false, NULL, now() + interval '1 day', 1, 0, now(), now()"  # noqa: E501
        steps = "'nap', 'sleep', '', '{\"seconds\": 86400}', 'scheduled', NULL, NULL, 0, 0, 'fixed', 0, NULL, NULL, 'default', false, now() + interval '1 day', now(), now()"  # noqa: E501
        per_run, attempt = "generate_series(1, 1) g", None
    else:
        run = f"'bench.queued', 'failed', '{{\"steps\": 10}}', NULL, {error}, '', false, NULL, NULL, 7, 0, {old}, {old}"  # noqa: E501
        steps = f"'s0', 'queued', 'bench.noop', 'null', 'failed', NULL, {error}, 5, 0, 'fixed', 6, NULL, NULL, 'default', false, NULL, {old}, {old}"  # noqa: E501
        per_run, attempt = "generate_series(1, 1) g", f"'failed', NULL, {error}"
    with connection.cursor() as cursor:
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            tail = (
                f", a AS (INSERT INTO pikku_step_attempt ({attempt_cols}) SELECT s.id, "
                f"s.attempt, {attempt}, 'bulk', s.created_at, s.updated_at FROM s) "
                if attempt
                else " "
            )
            cursor.execute(
                f"WITH r AS (INSERT INTO pikku_workflow_run ({run_cols}) "
                f"SELECT gen_random_uuid(), {run} FROM generate_series(1, {n}) RETURNING id), "
                f"s AS (INSERT INTO pikku_workflow_step ({step_cols}) "
                f"SELECT r.id, {steps} FROM r, {per_run} RETURNING id, attempt, created_at, "
                f"updated_at){tail}SELECT count(*) FROM s"
            )


#: Whether maintenance ends with a ``CHECKPOINT`` (``--no-checkpoint`` turns it off).
CHECKPOINT = True


def maintain(phase: str, vacuum: bool, record: dict[str, Any]) -> None:
    """The same maintenance before every phase: ``VACUUM ANALYZE`` of the pikku tables
    (``ANALYZE`` only without ``vacuum``), then a ``CHECKPOINT`` (unless
    ``--no-checkpoint``), timed into ``record``.

    The checkpoint flushes what the bulk load wrote now, not during the phase: a
    system whose tables filled over weeks has had its checkpoints as it went, while a
    load of a million rows in a minute would otherwise leave a checkpoint's writes
    spread over the first minutes measured after it (``checkpoint_completion_target``).
    """
    from django.db import connection

    command = "VACUUM (ANALYZE)" if vacuum else "ANALYZE"
    t0 = time.perf_counter()
    with connection.cursor() as cursor:  # autocommit: VACUUM runs outside a transaction
        for table in TABLES:
            cursor.execute(f"{command} {table}")
        if CHECKPOINT:
            cursor.execute("CHECKPOINT")
            command += "; CHECKPOINT"
    record[phase] = {
        "command": command,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def register() -> None:
    from pikku_django.workflows import WorkflowContext, step, workflow

    @step(name="scale.mark")
    def mark(key: int) -> None:
        MARKS[key] = time.perf_counter()

    @workflow(name="scale.first")
    def first(ctx: WorkflowContext, inp: dict[str, Any]) -> None:
        ctx.do("mark", mark, inp["key"])

    @workflow(name="scale.sleeper")
    def sleeper(ctx: WorkflowContext, inp: Any) -> None:
        ctx.sleep("nap", 86400)


def work(per_step: dict[str, float]) -> str:
    return (
        f"{per_step['blocks']:.0f} buffers ({per_step['read']:.1f} not in shared buffers) "
        f"and {per_step['transactions']:.1f} transactions a step"
    )


def figure(value: float, baseline: float | None, unit: str, target: str) -> dict[str, Any]:
    ratio = None if not baseline else round(value / baseline, 3)
    return {
        "value": round(value, 2),
        "baseline": None if baseline is None else round(baseline, 2),
        "ratio": ratio,
        "unit": unit,
        "target": target,
    }


def measure_long(bench: Bench, say: Callable[[str], None], repeats: int) -> dict[str, Any]:
    """Only the long runs' time per step against a 10-step run's, on empty tables:
    ``repeats`` rounds of (10-step x5, long1, long2), each figure a median of the rounds."""
    size, out = bench.size, {}
    bench.start_worker()
    bench.per_step_ms(10, repeats=3)  # warm-up
    samples: dict[str, list[float]] = {"short": [], "long1": [], "long2": []}
    for round_ in range(repeats):
        samples["short"].append(bench.per_step_ms(10, repeats=5))
        for key in ("long1", "long2"):
            samples[key].append(bench.per_step_ms(size[key]))
        say(
            f"round {round_ + 1}: 10 steps {samples['short'][-1]:.2f} ms/step, "
            + ", ".join(f"{size[k]} steps {samples[k][-1]:.2f}" for k in ("long1", "long2"))
        )
    bench.stop_worker()
    short = percentile(samples["short"], 50)
    for key in ("long1", "long2"):
        per_step = percentile(samples[key], 50)
        out[f"per_step_{size[key]}_steps"] = figure(per_step, short, "ms/step", "ratio <= 1.5")
        say(
            f"{size[key]}-step run: {per_step:.2f} ms/step against {short:.2f} for 10 steps "
            f"({per_step / short:.2f}x, median of {repeats})"
        )
    return out


def measure(
    bench: Bench,
    say: Callable[[str], None],
    vacuum: bool,
    maintenance: dict[str, Any],
    single: bool = True,
) -> dict[str, Any]:
    from django.db import connections

    size, out = bench.size, {}
    registered, reg_sql = bench.inline_runs("bench.queued", size["inline"])
    closures, clo_sql = bench.inline_runs("bench.inline", size["inline"])
    out["inline_registered_runs_per_s"] = figure(registered, closures, "runs/s", "ratio >= 0.5")
    out["inline_registered_sql_per_run"] = figure(reg_sql, clo_sql, "statements", "information")
    say(
        f"inline runs of 10 steps: registered {registered:.1f} runs/s ({reg_sql:.0f} statements "
        f"a run) against closures {closures:.1f} ({clo_sql:.0f}): {registered / closures:.2f}"
    )
    maintain("empty", vacuum, maintenance)
    bench.start_worker()
    empty = bench.steps_per_second()
    empty_work = bench.per_step
    say(f"steps/s, empty tables: {empty:.0f} ({work(empty_work)})")
    short = bench.per_step_ms(10, repeats=5)
    for key in ("long1", "long2"):
        per_step = bench.per_step_ms(size[key])
        out[f"per_step_{size[key]}_steps"] = figure(per_step, short, "ms/step", "ratio <= 1.5")
        say(f"{size[key]}-step run: {per_step:.2f} ms/step against {short:.2f} for 10 steps")
    lat_empty = bench.latency_ms()
    idle_empty = bench.idle_transactions_per_second(3 if size["runs"] < 100 else 30)
    say(f"latency, empty: p50 {lat_empty[0]:.1f} ms, p95 {lat_empty[1]:.1f} ms")
    out["steps_per_s_empty"] = figure(empty, empty, "steps/s", "baseline")
    for kind in ("completed", "sleeping", "failed"):
        t0 = time.perf_counter()
        bulk_load(kind, size[kind])
        say(f"loaded {size[kind]} {kind} runs in {time.perf_counter() - t0:.1f}s")
        maintain(kind, vacuum, maintenance)
        say(f"{maintenance[kind]['command']}: {maintenance[kind]['seconds']:.1f}s")
        value = bench.steps_per_second()
        for what, unit in (("blocks", "buffers/step"), ("transactions", "tx/step")):
            out[f"{what}_per_step_with_{kind}"] = figure(
                bench.per_step[what], empty_work[what], unit, "as low as empty"
            )
        say(f"  {kind}: {work(bench.per_step)}, empty: {work(empty_work)}")
        out[f"steps_per_s_with_{kind}"] = figure(value, empty, "steps/s", "ratio >= 0.9")
        say(f"steps/s with {kind} runs too: {value:.0f} ({value / empty:.2f} of empty)")
    lat_loaded = bench.latency_ms()
    say(f"latency, loaded: p50 {lat_loaded[0]:.1f} ms, p95 {lat_loaded[1]:.1f} ms")
    for pct, i in (("p50", 0), ("p95", 1)):
        target = "value < 10 ms" if pct == "p50" else "as low as empty"
        out[f"latency_{pct}_empty"] = figure(lat_empty[i], None, "ms", target)
        out[f"latency_{pct}_loaded"] = figure(lat_loaded[i], lat_empty[i], "ms", target)
    idle_loaded = bench.idle_transactions_per_second(3 if size["runs"] < 100 else 30)
    out["idle_tx_per_s_loaded"] = figure(idle_loaded, idle_empty, "tx/s", "as low as empty")
    say(f"idle worker transactions/s: {idle_loaded:.1f} loaded, {idle_empty:.1f} empty")
    loaded60 = out["steps_per_s_with_failed"]["value"]
    bench.stop_worker()

    connections["default"].settings_dict["CONN_MAX_AGE"] = 0
    maintain("cma0", vacuum, maintenance)
    bench.start_worker()
    cma0 = bench.steps_per_second()
    lat0 = bench.latency_ms()
    bench.stop_worker()
    connections["default"].settings_dict["CONN_MAX_AGE"] = 60
    out["cma0_steps_per_s_loaded"] = figure(cma0, loaded60, "steps/s", "ratio >= 0.9")
    out["cma0_latency_p50_loaded"] = figure(lat0[0], lat_loaded[0], "ms", "ratio <= 1.1")
    out["cma0_latency_p95_loaded"] = figure(lat0[1], lat_loaded[1], "ms", "ratio <= 1.1")
    say(f"CONN_MAX_AGE 0: {cma0:.0f} steps/s, latency p50 {lat0[0]:.1f} ms p95 {lat0[1]:.1f}")

    rate, deleted = bench.prune_rows_per_second()
    out["prune_rows_per_s"] = figure(rate, None, "rows/s", "for information")
    say(f"pikku_prune: {deleted} rows at {rate:.0f} rows/s")
    if single:
        out.update(single_step_runs(say, quick=bench.size["runs"] < 100))
    return out


def single_step_runs(say: Callable[[str], None], *, quick: bool) -> dict[str, Any]:
    """1,000 runs of one queued step next to 1,000 Procrastinate jobs, with the server
    transactions each costs: ``throughput.py``'s pairing of the two (one worker process
    of four threads each, the same warm-up, medians of three interleaved repeats), in a
    process of its own, in its own databases."""
    argv = [
        *(sys.executable, str(BENCH_DIR / "throughput.py"), "--databases", "postgres"),
        *("--systems", "pikku_carried_cma60,procrastinate", "--kinds", "single"),
        *("--conn-max-age", "60", "--memory-steps", "0", "--transactions"),
        *(("--quick",) if quick else ("--concurrency", "4", "--repeat", "3")),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        say(f"single-step runs: throughput.py failed (exit {done.returncode})")
        return {}
    report = json.loads(lines[-1])["databases"]["postgres"]
    pairing = next(
        (p for p in json.loads(lines[-1])["targets"]["pairings"] if p["kind"] == "single"), None
    )
    if pairing is None:
        say("single-step runs: no pairing (is Procrastinate installed? the bench extra)")
        return {}
    tx = report.get("transactions_per_unit", {})
    ours, theirs = pairing["ours_best"]["median"], pairing["theirs_best"]["median"]
    ours_tx = tx.get("pikku_carried_cma60", {}).get("single", {}).get("median")
    theirs_tx = tx.get("procrastinate", {}).get("single", {}).get("median")
    say(
        f"1-step runs: {ours:.1f} runs/s ({ours_tx} transactions a run) against "
        f"Procrastinate's single jobs {theirs:.1f} jobs/s ({theirs_tx} a job): "
        f"{ours / theirs:.2f}"
    )
    return {
        "single_step_runs_per_s": figure(ours, theirs, "runs/s", "ratio >= 1.0"),
        "single_step_transactions_per_run": figure(
            ours_tx or 0.0, theirs_tx, "transactions", "information"
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small end-to-end run")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="fraction of the full loaded sizes (1.0)"
    )
    parser.add_argument(
        "--long",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=None,
        help="the two long runs' step counts, e.g. 1000,2000 (default: scaled)",
    )
    parser.add_argument(
        "--only",
        choices=("long",),
        default=None,
        help="long: only the long runs' ms/step against a 10-step run's, on empty tables",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="batches of runs per steps/s figure, the median reported; with --only long, "
        "rounds of the three figures, interleaved (3)",
    )
    parser.add_argument(
        "--no-vacuum",
        dest="vacuum",
        action="store_false",
        help="only ANALYZE before each phase, not VACUUM ANALYZE",
    )
    parser.add_argument(
        "--no-checkpoint",
        dest="checkpoint",
        action="store_false",
        help="no CHECKPOINT at the start and after each phase's maintenance (for a server "
        "shared with other work, whose commits a checkpoint would stall)",
    )
    parser.add_argument(
        "--no-single",
        dest="single",
        action="store_false",
        help="leave out 1,000 one-step runs against 1,000 Procrastinate jobs",
    )
    args = parser.parse_args()
    global CHECKPOINT
    CHECKPOINT = args.checkpoint
    url = os.environ["PIKKU_BENCH_WORKFLOWS_URL"]
    if not url.startswith("postgres"):
        parser.error("scale.py runs on PostgreSQL: set PIKKU_BENCH_WORKFLOWS_URL to postgres://")
    ensure_database(url)
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")
        if CHECKPOINT:  # what an earlier run wrote is flushed before this one
            cursor.execute("CHECKPOINT")
    register()
    size = sizes(args)

    def say(line: str) -> None:
        print(line, flush=True)

    maintenance: dict[str, Any] = {}
    if args.only == "long":
        figures = measure_long(Bench(size), say, args.repeats)
    else:
        figures = measure(Bench(size), say, args.vacuum, maintenance, args.single)
    print(
        json.dumps(
            {
                "benchmark": "scale",
                "quick": args.quick,
                "only": args.only,
                "sizes": size,
                "server": pg_server_settings(url),
                "maintenance": maintenance,
                "figures": figures,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
