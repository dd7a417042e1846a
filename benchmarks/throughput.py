"""Workflow throughput and claim latency on PostgreSQL, next to Procrastinate and DBOS.

One run measures, with 1, 2 and 4 worker processes (``--processes``), each with
``--concurrency`` threads (default 4: on 2 cores the threads mostly wait on
PostgreSQL, and 4 kept a single process busiest in trials; more added only
contention):

- pikku queued: ``--runs`` runs (default 100) of a workflow of ``--steps`` (10)
  no-op steps that ``pikku_worker`` processes claim one by one. Steps per second
  over the window from the commit that created every run to the last run's
  completion (its ``updated_at``), and claim latency: for each step, its attempt's
  ``started_at`` minus the step's ``created_at`` (when the pass scheduled it, which
  is also its ``available_at``), from the rows after the run. A worker thread
  stores the step its own pass reaches already claimed (its attempt starts in the
  same statement), so for those steps this is 0 by construction; the column
  "step to step" is therefore printed too: each step's attempt start minus the end
  of the step before it in its run, which includes the orchestration pass between
  them;
- pikku inline: the same workflow with its steps run inline in the orchestration
  pass (``ctx.do(name, plain_function)``): steps per second;
- Procrastinate: the same number of no-op jobs (an ``async`` task that returns at
  once), deferred in one batch, run by the same number of Procrastinate worker
  processes with the same ``--concurrency``, on a database of its own: jobs per
  second over the window from the commit to the last ``succeeded`` event, and its
  claim latency (``started`` event minus ``deferred`` event);
- DBOS: the same runs of the same 10-step workflow (``@DBOS.step()`` no-ops), in
  the same number of DBOS processes with ``--concurrency`` threads each, every
  workflow called directly (DBOS's fastest way to run one), system database on
  the same server: steps per second from the start signal to the last workflow's
  end.

With one process it also measures claim latency one run at a time (``--latency-runs``
runs, one after another, on an idle worker: the latency a step sees when nothing
queues ahead of it), for pikku and for Procrastinate (one job at a time), and the
memory of that long-running worker: VmRSS from ``/proc/<pid>/status`` once warmed
up (after ``--warmup`` runs) and after ``--memory-steps`` (20,000) more steps,
with VmHWM as its peak. Those 20,000 steps are the queued, inline and latency
measurements above plus ``bench.inline`` runs until the count is reached
(``--memory-workflow queued`` tops up with queued steps instead; slower).

Targets: pikku queued steps/s >= Procrastinate jobs/s, pikku inline steps/s >=
1.5 x DBOS steps/s (each at the same process count), p50 claim latency < 10 ms,
memory growth <= 10 MB. ``--profile DIR`` records the one-process worker with
py-spy during one more queued and one more inline measurement (not among the
figures: the sampling slows it), keeps the raw stacks in DIR and prints where the
worker threads' time went to stderr.

Run it from the repository root:

    .venv/bin/pip install -e ".[bench]"       # procrastinate, dbos (and py-spy)
    .venv/bin/python benchmarks/throughput.py
    .venv/bin/python benchmarks/throughput.py --runs 200 --processes 1,2 --repeat 3

The databases come from ``PIKKU_BENCH_WORKFLOWS_URL`` (default
postgres://postgres@127.0.0.1:5432/pikku_bench_workflows), ``PIKKU_BENCH_PROCRASTINATE_URL``
(.../pikku_bench_procrastinate) and ``PIKKU_BENCH_DBOS_URL`` (.../pikku_bench_dbos);
they are created when missing, and runs and jobs this benchmark left behind are
deleted first, and each phase starts with VACUUM ANALYZE of its database (this
machine's PostgreSQL runs with autovacuum off; without it the step table's
status indexes fill with dead entries and the workers' queries slow down as the
history grows). A default run takes about 5 minutes. Progress goes to stderr;
stdout gets the table and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from benchlib import (
    BENCH_DIR,
    BenchError,
    Processes,
    django_env,
    ensure_database,
    format_table,
    listening_sessions,
    machine,
    percentile,
    pg_params,
    proc_memory_kb,
    vacuum,
    wait_for,
)

log = logging.getLogger("pikku.bench.throughput")

SETTINGS = "bench_settings"
WORKFLOWS_URL = os.environ.get(
    "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_workflows"
)
PROCRASTINATE_URL = os.environ.get(
    "PIKKU_BENCH_PROCRASTINATE_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_procrastinate"
)
DBOS_URL = os.environ.get(
    "PIKKU_BENCH_DBOS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_dbos"
)
QUEUED, INLINE = "bench.queued", "bench.inline"
MB = 1024  # kB


# -- pikku ---------------------------------------------------------------------------------------


def start_runs(workflow: str, runs: int, steps: int) -> tuple[list[Any], float]:
    """Create ``runs`` runs in one transaction; their ids and the commit's epoch time."""
    from django.db import transaction

    from pikku_django.workflows import WorkflowEngine

    engine = WorkflowEngine()
    with transaction.atomic():
        ids = [engine.start(workflow, {"steps": steps}).id for _ in range(runs)]
    return ids, time.time()


def wait_completed(ids: list[Any], timeout: float, every: float = 0.05) -> int:
    """Wait until every run in ``ids`` has completed; how many polls that took."""
    from pikku_django.models import RunStatus, WorkflowRun

    polls = 0

    def done() -> bool:
        nonlocal polls
        polls += 1
        counts = Counter(
            WorkflowRun.objects.filter(id__in=ids).values_list("status", flat=True).iterator()
        )
        bad = {s: n for s, n in counts.items() if s not in (RunStatus.RUNNING, RunStatus.COMPLETED)}
        if bad:
            raise BenchError(f"runs ended {bad}")
        return counts[RunStatus.COMPLETED] == len(ids)

    wait_for(done, timeout, f"{len(ids)} runs to complete", every=every)
    return polls


def pikku_window(ids: list[Any], started: float) -> float:
    from django.db.models import Max

    from pikku_django.models import WorkflowRun

    end = WorkflowRun.objects.filter(id__in=ids).aggregate(end=Max("updated_at"))["end"]
    return end.timestamp() - started


def claim_latencies_ms(ids: list[Any]) -> list[float]:
    """Per queued step: its first attempt's start minus the step's creation, in ms."""
    from pikku_django.models import StepAttempt

    rows = StepAttempt.objects.filter(
        step__run_id__in=ids, step__kind="queued", attempt=1
    ).values_list("started_at", "step__created_at")
    return [(started - created).total_seconds() * 1000 for started, created in rows.iterator()]


def step_gaps_ms(ids: list[Any]) -> list[float]:
    """Per queued step after a run's first: its first attempt's start minus the end of
    the attempt before it in the run, in ms (the pass between them included)."""
    from pikku_django.models import StepAttempt

    rows = (
        StepAttempt.objects.filter(step__run_id__in=ids, step__kind="queued", attempt=1)
        .order_by("step__run_id", "step_id")
        .values_list("step__run_id", "started_at", "finished_at")
    )
    gaps, last = [], (None, None)
    for run_id, started, finished in rows.iterator():
        if run_id == last[0] and last[1] is not None:
            gaps.append((started - last[1]).total_seconds() * 1000)
        last = (run_id, finished)
    return gaps


def server_transactions(url: str) -> int:
    """Transactions committed in the database so far (the server's own count)."""
    import psycopg

    with psycopg.connect(autocommit=True, connect_timeout=5, **pg_params(url)) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0])


def measure_pikku(
    workflow: str, args: argparse.Namespace, *, count_transactions: bool = False
) -> dict[str, Any]:
    before = server_transactions(WORKFLOWS_URL) if count_transactions else 0
    ids, started = start_runs(workflow, args.runs, args.steps)
    polls = wait_completed(ids, args.timeout)
    elapsed = pikku_window(ids, started)
    steps = args.runs * args.steps
    out: dict[str, Any] = {
        "runs": args.runs,
        "steps": steps,
        "seconds": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed, 1),
    }
    if workflow == QUEUED:
        lat = claim_latencies_ms(ids)
        if len(lat) != steps:
            raise BenchError(f"{len(lat)} first attempts for {steps} steps")
        out.update(latency_summary(lat))
        out.update(gap_summary(step_gaps_ms(ids)))
    if count_transactions:
        time.sleep(1.2)  # the server publishes its counters at most a second late
        # Every poll of this script was one transaction too (the two counts as well).
        spent = server_transactions(WORKFLOWS_URL) - before - polls - 2
        out["server_transactions_per_step"] = round(spent / steps, 2)
    return out


def latency_summary(lat: list[float]) -> dict[str, float]:
    return {
        "claim_latency_p50_ms": round(percentile(lat, 50), 2),
        "claim_latency_p95_ms": round(percentile(lat, 95), 2),
        "claim_latency_max_ms": round(max(lat), 2),
    }


def gap_summary(gaps: list[float]) -> dict[str, float]:
    if not gaps:
        return {}
    return {
        "step_gap_p50_ms": round(percentile(gaps, 50), 2),
        "step_gap_p95_ms": round(percentile(gaps, 95), 2),
    }


def measure_pikku_latency_one_at_a_time(args: argparse.Namespace) -> dict[str, Any]:
    lat: list[float] = []
    gaps: list[float] = []
    for _ in range(args.latency_runs):
        ids, _ = start_runs(QUEUED, 1, args.steps)
        wait_completed(ids, args.timeout, every=0.005)
        lat += claim_latencies_ms(ids)
        gaps += step_gaps_ms(ids)
    return {"steps": len(lat), **latency_summary(lat), **gap_summary(gaps)}


def reset_pikku_database() -> str:
    """Migrate, delete what earlier runs left; the server version."""
    from django.core.management import call_command
    from django.db import connection

    from pikku_django.models import WorkflowRun

    call_command("migrate", verbosity=0)
    deleted, _ = WorkflowRun.objects.all().delete()
    with connection.cursor() as cursor:
        # Each run's orchestration lease leaves a row behind: drop those of runs now gone.
        cursor.execute("DELETE FROM pikku_lease WHERE key LIKE 'workflow-run:%%'")
        cursor.execute("SHOW server_version")
        server = str(cursor.fetchone()[0])
    if deleted:
        log.info("deleted %d rows that earlier runs left behind", deleted)
    return server


def start_pikku_workers(procs: Processes, n: int, args: argparse.Namespace) -> list[int]:
    names = [f"pikku-{n}p-{i}" for i in range(n)]
    for name in names:
        procs.start_pikku_worker(name, args.concurrency)

    def ready() -> bool:
        procs.check_alive(*names)
        return listening_sessions(WORKFLOWS_URL, "pikku_work") >= n

    wait_for(ready, args.timeout, f"{n} pikku_worker processes to listen", every=0.1)
    return [procs.procs[name].pid for name in names]


def stop_group(procs: Processes, prefix: str) -> None:
    for name in [n for n in procs.procs if n.startswith(prefix)]:
        procs.stop(name)


# -- profiling ---------------------------------------------------------------------------------


def start_profiler(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        log.warning("--profile: py-spy is not installed (pip install py-spy); no profile")
        return None
    return subprocess.Popen(
        [
            *(exe, "record", "--pid", str(pid), "--idle", "--nonblocking", "--rate", "200"),
            *("--format", "raw", "--output", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop_profiler(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def summarise_profile(raw: Path, top: int = 25) -> str:
    """Where the worker threads' time went: inclusive share of pikku_django functions."""
    inclusive: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "Worker._loop" not in stack:
            continue  # the main thread's joins, the LISTEN thread, lease renewals
        n = int(count)
        total += n
        frames = stack.split(";")
        seen = set()
        for frame in frames:
            name = frame.split(" (")[0]
            where = frame.split(" (")[-1]
            if "pikku_django/" in where and name not in seen:
                seen.add(name)
                inclusive[name] += n
        leaf = frames[-1]
        if "Connection.wait" in stack or "Connection.commit" in stack:
            categories["waiting on PostgreSQL (psycopg Connection.wait)"] += n
        elif "Condition.wait" in leaf or "Event.wait" in leaf or "_wait_for_tstate_lock" in leaf:
            categories["idle or joining a thread"] += n
        elif "django/db/models" in stack:
            categories["Python: Django ORM building and reading queries"] += n
        elif "psycopg/" in stack:
            categories["Python: psycopg adapting and sending"] += n
        else:
            categories["Python: other"] += n
    if not total:
        return "no samples of the worker threads"
    lines = [f"{total} samples of the worker threads ({raw})"]
    lines += [f"  {n / total:6.1%}  {what}" for what, n in categories.most_common()]
    lines.append("inclusive time of pikku_django functions:")
    lines += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(lines)


# -- memory --------------------------------------------------------------------------------------


def steps_of(ids: list[Any]) -> int:
    from pikku_django.models import WorkflowStep

    return WorkflowStep.objects.filter(run_id__in=ids).count()


def top_up_memory(pid: int, done: int, args: argparse.Namespace) -> list[dict[str, int]]:
    """Run batches of runs until the worker ``pid`` has done ``--memory-steps`` steps."""
    workflow = QUEUED if args.memory_workflow == "queued" else INLINE
    trace = []
    batch = max(1, min(200, args.runs * 2))
    while done < args.memory_steps:
        runs = min(batch, -(-(args.memory_steps - done) // args.steps))
        ids, _ = start_runs(workflow, runs, args.steps)
        wait_completed(ids, args.timeout + runs)
        done += steps_of(ids)
        trace.append({"steps": done, **proc_memory_kb(pid)})
        log.info("  memory: %d steps, VmRSS %d kB", done, trace[-1]["VmRSS"])
    return trace


# -- Procrastinate ----------------------------------------------------------------------------


def procrastinate_ready() -> Any:
    """The Procrastinate app with its schema applied, or None (not installed)."""
    from throughput_baselines import procrastinate_app

    if procrastinate_app is None:
        return None
    import psycopg

    ensure_database(PROCRASTINATE_URL)
    with psycopg.connect(autocommit=True, **pg_params(PROCRASTINATE_URL)) as conn:
        exists = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0]
        if exists:
            conn.execute("TRUNCATE procrastinate_jobs CASCADE")
    if not exists:
        with procrastinate_app.open():
            procrastinate_app.schema_manager.apply_schema()
    return procrastinate_app


def procrastinate_events(after_id: int) -> tuple[float, list[float]]:
    """The last success (epoch s) and each job's deferred->started latency (ms)."""
    import psycopg

    with psycopg.connect(autocommit=True, **pg_params(PROCRASTINATE_URL)) as conn:
        end = conn.execute(
            "SELECT extract(epoch FROM max(at)) FROM procrastinate_events "
            "WHERE type = 'succeeded' AND job_id > %s",
            (after_id,),
        ).fetchone()[0]
        lat = [
            float(ms)
            for (ms,) in conn.execute(
                "SELECT extract(epoch FROM s.at - d.at) * 1000 FROM procrastinate_events d "
                "JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started' "
                "WHERE d.type = 'deferred' AND d.job_id > %s",
                (after_id,),
            )
        ]
    return float(end), lat


def procrastinate_counts(after_id: int) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(autocommit=True, **pg_params(PROCRASTINATE_URL)) as conn:
        done, failed = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
            "count(*) FILTER (WHERE status NOT IN ('todo', 'doing', 'succeeded')) "
            "FROM procrastinate_jobs WHERE id > %s",
            (after_id,),
        ).fetchone()
    return int(done), int(failed)


def max_job_id() -> int:
    import psycopg

    with psycopg.connect(autocommit=True, **pg_params(PROCRASTINATE_URL)) as conn:
        return int(
            conn.execute("SELECT coalesce(max(id), 0) FROM procrastinate_jobs").fetchone()[0]
        )


def wait_jobs(after_id: int, jobs: int, timeout: float, every: float = 0.05) -> int:
    """Wait until ``jobs`` jobs after ``after_id`` succeeded; how many polls that took."""
    polls = 0

    def done() -> bool:
        nonlocal polls
        polls += 1
        ok, failed = procrastinate_counts(after_id)
        if failed:
            raise BenchError(f"{failed} Procrastinate jobs failed")
        return ok >= jobs

    wait_for(done, timeout, f"{jobs} Procrastinate jobs", every=every)
    return polls


def measure_procrastinate(
    app: Any, procs: Processes, n: int, args: argparse.Namespace, *, latency: bool
) -> dict[str, Any]:
    names = [f"procrastinate-{n}p-{i}" for i in range(n)]
    for name in names:
        procs.start(
            name,
            [
                *(sys.executable, "-m", "procrastinate"),
                *("--app=throughput_baselines.procrastinate_app", "--log-level", "warning"),
                *("worker", "--concurrency", str(args.concurrency)),
            ],
        )

    def ready() -> bool:
        procs.check_alive(*names)
        return listening_sessions(PROCRASTINATE_URL, "procrastinate") >= n

    wait_for(ready, args.timeout, f"{n} Procrastinate workers to listen", every=0.1)
    task = app.tasks["bench_noop"]
    jobs = args.runs * args.steps
    try:
        with app.open():
            before = server_transactions(PROCRASTINATE_URL) if latency else 0
            after = max_job_id()
            task.batch_defer(*({} for _ in range(jobs)))
            started = time.time()
            polls = wait_jobs(after, jobs, args.timeout)
            end, lat = procrastinate_events(after)
            out: dict[str, Any] = {
                "jobs": jobs,
                "seconds": round(end - started, 3),
                "jobs_per_s": round(jobs / (end - started), 1),
                **latency_summary(lat),
            }
            if latency:
                time.sleep(1.2)  # the server publishes its counters at most a second late
                # Less this script's own: the counts, the job id, the polls, the events.
                spent = server_transactions(PROCRASTINATE_URL) - before - polls - 5
                out["server_transactions_per_job"] = round(spent / jobs, 2)
            if latency:
                one: list[float] = []
                for _ in range(args.latency_runs * args.steps):
                    after = max_job_id()
                    task.defer()
                    wait_jobs(after, 1, args.timeout, every=0.002)
                    one += procrastinate_events(after)[1]
                out["one_at_a_time"] = {"jobs": len(one), **latency_summary(one)}
    finally:
        stop_group(procs, f"procrastinate-{n}p-")
    return out


# -- DBOS ----------------------------------------------------------------------------------------


def dbos_available() -> bool:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return False
    ensure_database(DBOS_URL)
    code = subprocess.call(
        [sys.executable, str(BENCH_DIR / "throughput_baselines.py"), "dbos-init"],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
    )
    if code:
        raise BenchError(f"DBOS would not launch (exit {code})")
    return True


def read_line(proc: subprocess.Popen[bytes], timeout: float, what: str) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline().decode()
            if not line:
                raise BenchError(f"{what}: the DBOS process exited ({proc.poll()})")
            return line.strip()
    raise BenchError(f"timed out after {timeout:g}s waiting for {what}")


def measure_dbos(procs: Processes, n: int, args: argparse.Namespace) -> dict[str, Any]:
    names = [f"dbos-{n}p-{i}" for i in range(n)]
    shares = [args.runs // n + (1 if i < args.runs % n else 0) for i in range(n)]
    try:
        for name, share in zip(names, shares, strict=True):
            procs.start(
                name,
                [
                    *(sys.executable, str(BENCH_DIR / "throughput_baselines.py"), "dbos"),
                    *("--workflows", str(share), "--steps", str(args.steps)),
                    *("--threads", str(args.concurrency)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        for name in names:
            line = ""
            while line != "ready":  # skip what the worker prints before it is ready
                line = read_line(procs.procs[name], args.timeout, f"{name} to launch")
        before = server_transactions(DBOS_URL)
        started = time.time()
        for name in names:
            stdin = procs.procs[name].stdin
            assert stdin is not None
            stdin.write(b"go\n")
            stdin.flush()
        ends = [
            json.loads(read_line(procs.procs[name], args.timeout, f"{name} to finish"))["end"]
            for name in names
        ]
        time.sleep(1.2)  # the server publishes its counters at most a second late
        spent = server_transactions(DBOS_URL) - before - 2
    finally:
        stop_group(procs, f"dbos-{n}p-")
    steps = args.runs * args.steps
    elapsed = max(ends) - started
    return {
        "steps": steps,
        "seconds": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed, 1),
        "server_transactions_per_step": round(spent / steps, 2),
    }


# -- the run -------------------------------------------------------------------------------------


def best(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The repeat with the median ``key`` (the only one when not repeated)."""
    ordered = sorted(results, key=lambda r: r[key])
    return {**ordered[len(ordered) // 2], "repeats": [r[key] for r in results]}


def run(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    server = reset_pikku_database()
    app = procrastinate_ready() if not args.no_baselines else None
    has_dbos = dbos_available() if not args.no_baselines else False
    if not args.no_baselines and app is None:
        log.warning("procrastinate is not installed: no Procrastinate baseline")
    if not args.no_baselines and not has_dbos:
        log.warning("dbos is not installed: no DBOS baseline")
    report: dict[str, Any] = {"server": server, "by_processes": {}}
    report["autovacuum"] = vacuum(WORKFLOWS_URL)
    if report["autovacuum"] != "on":
        log.warning(
            "autovacuum is %s on this server: each phase starts with VACUUM ANALYZE",
            report["autovacuum"],
        )
    warmup = max(0, args.warmup)
    for n in args.processes:
        log.info("%d worker process(es), %d threads each", n, args.concurrency)
        figures: dict[str, Any] = {}
        vacuum(WORKFLOWS_URL)
        pids = start_pikku_workers(procs, n, args)
        try:
            if warmup:
                ids, _ = start_runs(QUEUED, warmup, args.steps)
                wait_completed(ids, args.timeout)
            memory_start = proc_memory_kb(pids[0]) if n == 1 else None
            done = 0
            queued, inline = [], []
            for r in range(args.repeat):
                queued.append(measure_pikku(QUEUED, args, count_transactions=r == 0))
                log.info("  pikku queued: %.1f steps/s", queued[-1]["steps_per_s"])
                inline.append(measure_pikku(INLINE, args, count_transactions=r == 0))
                log.info("  pikku inline: %.1f steps/s", inline[-1]["steps_per_s"])
                done += 2 * args.runs * args.steps
            figures["pikku_queued"] = best(queued, "steps_per_s")
            figures["pikku_inline"] = best(inline, "steps_per_s")
            if n == 1 and args.profile:
                # Not among the figures: py-spy slows the worker it samples.
                args.profile.mkdir(parents=True, exist_ok=True)
                for workflow, kind in ((QUEUED, "queued"), (INLINE, "inline")):
                    profiler = start_profiler(pids[0], args.profile / f"worker-{kind}.raw")
                    time.sleep(1.0)  # py-spy attaches
                    profiled = measure_pikku(workflow, args)
                    stop_profiler(profiler)
                    done += args.runs * args.steps
                    log.info("  pikku %s under py-spy: %.1f steps/s", kind, profiled["steps_per_s"])
            if n == 1 and args.latency_runs:
                one = measure_pikku_latency_one_at_a_time(args)
                figures["pikku_queued"]["one_at_a_time"] = one
                done += one["steps"]
                log.info("  pikku one run at a time: p50 %.2f ms", one["claim_latency_p50_ms"])
            if n == 1 and args.memory_steps:
                trace = top_up_memory(pids[0], done, args)
                end = proc_memory_kb(pids[0])
                assert memory_start is not None
                report["memory"] = {
                    "worker_concurrency": args.concurrency,
                    "steps": trace[-1]["steps"] if trace else done,
                    "top_up_workflow": QUEUED if args.memory_workflow == "queued" else INLINE,
                    "rss_start_kb": memory_start["VmRSS"],
                    "rss_end_kb": end["VmRSS"],
                    "growth_kb": end["VmRSS"] - memory_start["VmRSS"],
                    "peak_rss_kb": end["VmHWM"],
                    "trace": trace,
                }
        finally:
            stop_group(procs, f"pikku-{n}p-")
        if app is not None:
            vacuum(PROCRASTINATE_URL)
            proc_results = [
                measure_procrastinate(app, procs, n, args, latency=n == 1 and r == 0)
                for r in range(args.repeat)
            ]
            figures["procrastinate"] = best(proc_results, "jobs_per_s")
            if "one_at_a_time" in proc_results[0]:
                figures["procrastinate"]["one_at_a_time"] = proc_results[0]["one_at_a_time"]
            log.info("  procrastinate: %.1f jobs/s", figures["procrastinate"]["jobs_per_s"])
        if has_dbos:
            vacuum(DBOS_URL)
            figures["dbos"] = best(
                [measure_dbos(procs, n, args) for _ in range(args.repeat)], "steps_per_s"
            )
            log.info("  dbos: %.1f steps/s", figures["dbos"]["steps_per_s"])
        report["by_processes"][str(n)] = figures
    return report


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """Each target, met or not, per process count."""
    targets: dict[str, Any] = {}
    for n, f in report["by_processes"].items():
        queued, inline = f["pikku_queued"], f["pikku_inline"]
        t: dict[str, Any] = {
            "claim_latency_p50_under_10ms": queued["claim_latency_p50_ms"] < 10,
        }
        if "procrastinate" in f:
            t["queued_ge_procrastinate"] = queued["steps_per_s"] >= f["procrastinate"]["jobs_per_s"]
            t["queued_vs_procrastinate"] = round(
                queued["steps_per_s"] / f["procrastinate"]["jobs_per_s"], 3
            )
        if "dbos" in f:
            t["inline_ge_1_5x_dbos"] = inline["steps_per_s"] >= 1.5 * f["dbos"]["steps_per_s"]
            t["inline_vs_dbos"] = round(inline["steps_per_s"] / f["dbos"]["steps_per_s"], 3)
        if "one_at_a_time" in queued:
            t["one_at_a_time_claim_latency_p50_under_10ms"] = (
                queued["one_at_a_time"]["claim_latency_p50_ms"] < 10
            )
        targets[n] = t
    if "memory" in report:
        targets["memory_growth_le_10MB"] = report["memory"]["growth_kb"] <= 10 * MB
    return targets


def table(report: dict[str, Any], targets: dict[str, Any], args: argparse.Namespace) -> str:
    header = (
        "processes",
        "pikku queued steps/s",
        "claim p50 / p95",
        "step to step p50 / p95",
        "Procrastinate jobs/s",
        "its claim p50 / p95",
        "pikku inline steps/s",
        "DBOS steps/s",
    )
    rows = []
    for n, f in report["by_processes"].items():
        q, i = f["pikku_queued"], f["pikku_inline"]
        p, d = f.get("procrastinate"), f.get("dbos")
        rows.append(
            (
                n,
                f"{q['steps_per_s']:.1f}",
                f"{q['claim_latency_p50_ms']:.1f} / {q['claim_latency_p95_ms']:.1f} ms",
                f"{q['step_gap_p50_ms']:.1f} / {q['step_gap_p95_ms']:.1f} ms"
                if "step_gap_p50_ms" in q
                else "-",
                f"{p['jobs_per_s']:.1f}" if p else "-",
                f"{p['claim_latency_p50_ms']:.1f} / {p['claim_latency_p95_ms']:.1f} ms"
                if p
                else "-",
                f"{i['steps_per_s']:.1f}",
                f"{d['steps_per_s']:.1f}" if d else "-",
            )
        )
    out = [format_table(header, rows), ""]
    one = report["by_processes"].get("1", {})
    if "one_at_a_time" in one.get("pikku_queued", {}):
        a = one["pikku_queued"]["one_at_a_time"]
        line = (
            f"claim latency one run at a time (1 idle worker, {a['steps']} steps): pikku p50 "
            f"{a['claim_latency_p50_ms']:.2f} ms, p95 {a['claim_latency_p95_ms']:.2f} ms"
        )
        if "step_gap_p50_ms" in a:
            line += (
                f" (step to step p50 {a['step_gap_p50_ms']:.2f} ms, "
                f"p95 {a['step_gap_p95_ms']:.2f} ms)"
            )
        if "one_at_a_time" in one.get("procrastinate", {}):
            b = one["procrastinate"]["one_at_a_time"]
            line += (
                f"; Procrastinate p50 {b['claim_latency_p50_ms']:.2f} ms, "
                f"p95 {b['claim_latency_p95_ms']:.2f} ms"
            )
        out.append(line)
    counts = [
        f"{what} {one[kind][key]:.1f}"
        for kind, key, what in (
            ("pikku_queued", "server_transactions_per_step", "pikku queued"),
            ("procrastinate", "server_transactions_per_job", "Procrastinate (per job)"),
            ("pikku_inline", "server_transactions_per_step", "pikku inline"),
            ("dbos", "server_transactions_per_step", "DBOS"),
        )
        if key in one.get(kind, {})
    ]
    if counts:
        out.append("server transactions per step, 1 process: " + ", ".join(counts))
    if "memory" in report:
        m = report["memory"]
        out.append(
            f"worker memory over {m['steps']} steps ({args.concurrency} threads): VmRSS "
            f"{m['rss_start_kb'] / MB:.1f} MB -> {m['rss_end_kb'] / MB:.1f} MB "
            f"(growth {m['growth_kb'] / MB:+.1f} MB), peak {m['peak_rss_kb'] / MB:.1f} MB"
        )
    out.append(
        f"{args.runs} runs x {args.steps} steps per measurement; {args.concurrency} threads "
        f"(--concurrency) per process for pikku_worker, Procrastinate and DBOS; "
        f"median of {args.repeat} repeat(s)"
    )
    yes = {True: "met", False: "MISSED"}
    for n, t in targets.items():
        if n == "memory_growth_le_10MB":
            out.append(f"target memory growth <= 10 MB: {yes[t]}")
            continue
        parts = [f"p50 claim latency < 10 ms: {yes[t['claim_latency_p50_under_10ms']]}"]
        if "one_at_a_time_claim_latency_p50_under_10ms" in t:
            parts.append(f"(one at a time: {yes[t['one_at_a_time_claim_latency_p50_under_10ms']]})")
        if "queued_ge_procrastinate" in t:
            parts.append(
                f"queued >= Procrastinate: {yes[t['queued_ge_procrastinate']]} "
                f"({t['queued_vs_procrastinate']:.2f}x)"
            )
        if "inline_ge_1_5x_dbos" in t:
            parts.append(
                f"inline >= 1.5x DBOS: {yes[t['inline_ge_1_5x_dbos']]} ({t['inline_vs_dbos']:.2f}x)"
            )
        out.append(f"targets, {n} process(es): " + "; ".join(parts))
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per measurement (100)")
    parser.add_argument("--steps", type=int, default=10, help="steps per run (10)")
    parser.add_argument(
        "--processes", default="1,2,4", help="worker process counts, comma-separated (1,2,4)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="threads per process (4)")
    parser.add_argument("--repeat", type=int, default=1, help="measurements each; median (1)")
    parser.add_argument("--warmup", type=int, default=10, help="runs before measuring (10)")
    parser.add_argument(
        "--latency-runs", type=int, default=20, help="runs timed one at a time (20)"
    )
    parser.add_argument(
        "--memory-steps", type=int, default=20_000, help="steps the memory worker does (20000)"
    )
    parser.add_argument("--memory-workflow", choices=("inline", "queued"), default="inline")
    parser.add_argument("--no-baselines", action="store_true", help="pikku only")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output directory")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per wait (300)")
    args = parser.parse_args(argv)
    try:
        args.processes = [int(p) for p in args.processes.split(",") if p.strip()]
    except ValueError:
        parser.error("--processes is a comma-separated list of integers")
    if (
        min([args.runs, args.steps, args.concurrency, args.repeat, *args.processes]) < 1
        or args.latency_runs < 0
        or args.memory_steps < 0
    ):
        parser.error("counts must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[bench] %(message)s")
    logging.getLogger("procrastinate").setLevel(logging.WARNING)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    env = django_env(
        SETTINGS,
        {
            "PIKKU_BENCH_WORKFLOWS_URL": WORKFLOWS_URL,
            "PIKKU_BENCH_PROCRASTINATE_URL": PROCRASTINATE_URL,
            "PIKKU_BENCH_DBOS_URL": DBOS_URL,
        },
    )
    os.environ.update(env)
    try:
        ensure_database(WORKFLOWS_URL)
        import django

        django.setup()
    except Exception as exc:
        log.error("PostgreSQL set-up failed (%s: %s)", type(exc).__name__, exc)
        return 2
    logging.getLogger("pikku_django").setLevel(logging.WARNING)

    tmp = Path(tempfile.mkdtemp(prefix="pikku-bench-throughput-"))
    procs = Processes(tmp, env)
    began = time.perf_counter()
    try:
        report = run(args, procs)
    except BenchError as exc:
        log.error("%s", exc)
        for name in procs.procs:
            log.error("--- %s (pid %d):\n%s", name, procs.procs[name].pid, procs.tail(name))
        return 1
    except KeyboardInterrupt:
        log.error("interrupted: stopping the workers")
        return 130
    finally:
        procs.stop_all()
        from django.db import connections

        connections.close_all()
        shutil.rmtree(tmp, ignore_errors=True)
    took = time.perf_counter() - began
    log.info("done in %.0f s", took)
    for kind in ("queued", "inline"):
        raw = args.profile / f"worker-{kind}.raw" if args.profile else None
        if raw is not None and raw.exists():
            log.info("profile, pikku %s steps: %s", kind, summarise_profile(raw))

    targets = judge(report)
    print(table(report, targets, args))
    print(
        json.dumps(
            {
                "benchmark": "pikku_django workflow throughput, claim latency and worker memory",
                "settings": {
                    "runs": args.runs,
                    "steps_per_run": args.steps,
                    "processes": args.processes,
                    "concurrency_per_process": args.concurrency,
                    "repeat": args.repeat,
                    "warmup_runs": args.warmup,
                    "latency_runs": args.latency_runs,
                    "memory_steps": args.memory_steps,
                    "pikku_settings": "bench_settings: PIKKU defaults, CONN_MAX_AGE 60",
                    "vacuum_analyze_before_each_phase": True,
                    "server_autovacuum": report.pop("autovacuum"),
                },
                "machine": machine(report.pop("server"), "procrastinate", "dbos"),
                "seconds": round(took, 1),
                **report,
                "targets": targets,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
