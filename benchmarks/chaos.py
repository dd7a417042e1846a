"""A chaos run on PostgreSQL or MariaDB: workers SIGKILLed and SIGSTOPped, and their
database away for a while, while runs proceed.

``--runs`` runs (default 300) of the ``bench.chaos`` workflow (``benchmarks/bench_app``),
each of 5 steps that work for a random 50-500 ms (``--step-ms``); steps 0, 2 and 4
are transactional (they write a ``ChaosEffect`` row inside the step's transaction),
1 and 3 plain. Every execution of a step function records itself at its start in
``ChaosExecution`` (pid, thread, start, and a fresh nonce that the step also
returns) through a connection of its own in autocommit, so a rollback or a kill
does not lose it.

``--workers`` (3) ``pikku_worker`` processes with ``--concurrency`` (4) threads run
them, with a short step lease (``--lease-ms``, 3000). For ``--seconds`` (30), or
until every run has ended: worker A is SIGKILLed and restarted every
``--kill-every`` seconds on average (3; each wait drawn from 0.5x-1.5x), and worker
B is SIGSTOPped every ``--stop-every`` seconds (8) for ``--stop-for`` seconds
(lease + 1.5 s), past its step lease, then SIGCONTinued. The workers reach their
database through a fault-injecting proxy (``tests/faultproxy.py``): ``--outage-at``
seconds (10) into the chaos, every worker's connection is reset and new ones are
refused for ``--outage-for`` seconds (10; 0 for none), as when the database server
goes away; no kill or stop begins meanwhile. Then the script waits for every run to
end (the drain) and checks the rows:

1. runs completed: every run, none failed, suspended or still running;
2. results from a superseded attempt: 0. For each step, the StepAttempt history
   must hold exactly one succeeded attempt, the step's current one; the stored
   result's nonce must name an execution run by that attempt's worker (the pid
   and thread in ``StepAttempt.worker``) that started inside that attempt
   (between its ``started_at`` and ``finished_at``). A result written by an
   attempt that was replaced names another thread, or an earlier start;
3. transactional steps whose effect happened other than once: 0. Exactly one
   ``ChaosEffect`` row per transactional step, carrying the stored result's nonce;
4. each run's output is its steps' stored results.

It prints the time to drain (from the end of the chaos to the last run's end),
the kills and stops, the time from the end of the outage to the first step
completed after it, and how many steps ran more than once (allowed: plain steps
are at-least-once, and a transactional step's superseded execution rolls back),
then one JSON object. Exit status 1 if a check fails.

The workers run with ``RUN_LEASE_MS`` = the step lease, ``RUN_PASS_TIMEOUT`` 5 s,
``RECOVERY_INTERVAL`` 2 s and ``STALLED_RUN_AFTER`` 5 s (``--pass-timeout``,
``--recovery-interval``, ``--stalled-after``): with the defaults (30 s, 300 s, 30 s,
300 s) a pass cut short by a kill is retried only after 5 minutes, which would be
the drain time. Run it from the repository root:

    .venv/bin/python benchmarks/chaos.py
    .venv/bin/python benchmarks/chaos.py --database mariadb
    .venv/bin/python benchmarks/chaos.py --runs 1000 --seconds 120

``--database postgres`` (the default) is ``PIKKU_BENCH_WORKFLOWS_URL`` (default
postgres://postgres@127.0.0.1:5432/pikku_bench_workflows); ``--database mariadb`` is
``PIKKU_BENCH_MARIADB_URL`` (default mysql://root@127.0.0.1:3306/pikku_bench_workflows).
Either database is created if missing; chaos rows left by an earlier run are
deleted first. Progress goes to stderr; stdout gets the report
and, last, one JSON object. A default run takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
from benchlib import (
    BENCH_DIR,
    ROOT,
    BenchError,
    Processes,
    django_env,
    ensure_database,
    listening_sessions,
    machine,
    vacuum,
    wait_for,
)
from chaos_results import Chaos, check, passed, report_text

log = logging.getLogger("pikku.bench.chaos")

SETTINGS = "bench_settings"
WORKFLOW = "bench.chaos"
URLS = {
    "postgres": os.environ.get(
        "PIKKU_BENCH_WORKFLOWS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_workflows"
    ),
    "mariadb": os.environ.get(
        "PIKKU_BENCH_MARIADB_URL", "mysql://root@127.0.0.1:3306/pikku_bench_workflows"
    ),
}


# -- the database -------------------------------------------------------------------------------


def ensure_mariadb_database(url: str) -> None:
    """Create the MariaDB/MySQL database ``url`` names if it is missing."""
    import MySQLdb

    db = dj_database_url.parse(url)
    admin = MySQLdb.connect(
        host=db["HOST"] or "127.0.0.1",
        port=int(db["PORT"] or 3306),
        user=db["USER"] or "root",
        password=db["PASSWORD"] or "",
        connect_timeout=5,
    )
    try:
        admin.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{db['NAME']}` CHARACTER SET utf8mb4"
        )
    finally:
        admin.close()


def proxied(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the fault proxy's."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return parts._replace(netloc=netloc).geturl()


def workers_up(args: argparse.Namespace, procs: Processes, names: list[str]) -> bool:
    """Whether every worker is at work: listening (PostgreSQL), or past its start line."""
    if args.database == "postgres":
        return listening_sessions(URLS["postgres"], "pikku_work") >= len(names)
    return all("thread(s), queues" in procs.tail(name, 50) for name in names)


def first_step_after(ids: list[Any], since: datetime | None) -> float | None:
    """Seconds from ``since`` to the first step attempt of these runs that succeeded after it."""
    from django.db.models import Min

    from pikku_django.models import StepAttempt, StepStatus

    if since is None:
        return None
    first = StepAttempt.objects.filter(
        step__run_id__in=ids, status=StepStatus.SUCCEEDED, finished_at__gte=since
    ).aggregate(at=Min("finished_at"))["at"]
    return None if first is None else round((first - since).total_seconds(), 3)


# -- the run ---------------------------------------------------------------------------------------


def reset(database: str) -> str:
    from bench_app.models import ChaosEffect, ChaosExecution
    from django.core.management import call_command
    from django.db import connection

    from pikku_django.models import WorkflowRun

    call_command("migrate", verbosity=0)
    if database == "postgres":
        vacuum(URLS["postgres"])
    WorkflowRun.objects.filter(workflow=WORKFLOW).delete()
    ChaosEffect.objects.all().delete()
    ChaosExecution.objects.all().delete()
    others = WorkflowRun.objects.filter(status="running").count()
    if others:
        log.warning("%d other running run(s) in this database: the workers will run them", others)
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version" if database == "postgres" else "SELECT VERSION()")
        return f"{connection.display_name} {cursor.fetchone()[0]}"


def start_runs(args: argparse.Namespace) -> list[Any]:
    from django.db import transaction

    from pikku_django.workflows import WorkflowEngine

    rng = random.Random(args.seed)
    low, high = args.step_ms
    engine = WorkflowEngine()
    with transaction.atomic():
        return [
            engine.start(
                WORKFLOW, {"db": "default", "ms": [rng.randint(low, high) for _ in range(5)]}
            ).id
            for _ in range(args.runs)
        ]


def open_runs(ids: list[Any]) -> int:
    from pikku_django.models import RunStatus, WorkflowRun

    return WorkflowRun.objects.filter(id__in=ids, status=RunStatus.RUNNING).count()


def run_chaos(
    args: argparse.Namespace, procs: Processes, proxy: Any
) -> tuple[list[Any], Chaos, int]:
    """Start the workers and the runs, do the chaos (the outage through ``proxy``),
    drain; the run ids, what was done, and how many workers were started in all."""
    rng = random.Random(args.seed + 1)
    names = [f"worker-{i}" for i in range(args.workers)]
    killed_name, stopped_name = names[0], names[1 % len(names)]
    generation = 0

    def start(name: str) -> None:
        nonlocal generation
        generation += 1
        procs.start_pikku_worker(name, args.concurrency)

    for name in names:
        start(name)
    wait_for(lambda: workers_up(args, procs, names), 60, "the workers to start", every=0.1)
    chaos = Chaos()
    ids = start_runs(args)
    t0 = chaos.started = time.monotonic()
    log.info("started %d runs; chaos for %gs", len(ids), args.seconds)

    def draw(mean: float) -> float:
        return rng.uniform(0.5 * mean, 1.5 * mean)

    next_kill = t0 + draw(args.kill_every) if args.kill_every > 0 else float("inf")
    next_stop = t0 + draw(args.stop_every) if args.stop_every > 0 else float("inf")
    resume_at: float | None = None
    outage_at = t0 + args.outage_at if args.outage_for > 0 else float("inf")
    back_at = float("inf")
    last_poll = 0.0
    left = len(ids)
    while True:
        now = time.monotonic()
        outage_owed = outage_at < float("inf") and chaos.outage_ended_at is None
        if (now - t0 >= args.seconds or left == 0) and not outage_owed:
            break
        if now >= outage_at and chaos.outage is None:
            proxy.outage()
            chaos.outage = (round(now - t0, 3), -1.0)
            back_at = now + args.outage_for
            log.info("  %6.2fs database away for %gs", now - t0, args.outage_for)
        if now >= back_at:
            proxy.restore()
            chaos.outage_ended_at = datetime.now().astimezone()
            assert chaos.outage is not None
            chaos.outage = (chaos.outage[0], round(now - t0, 3))
            log.info("  %6.2fs database back", now - t0)
            back_at = float("inf")
        away = back_at < float("inf")
        if resume_at is not None and now >= resume_at:
            procs.signal(stopped_name, signal.SIGCONT)
            chaos.stops[-1] = (chaos.stops[-1][0], round(now - t0, 3))
            log.info("  %6.2fs SIGCONT %s", now - t0, stopped_name)
            resume_at = None
            next_stop = now + draw(args.stop_every)
        if now >= next_kill and not away:
            procs.signal(killed_name, signal.SIGKILL)
            procs.procs[killed_name].wait()
            procs.stop(killed_name)
            start(killed_name)
            chaos.kills.append(round(now - t0, 3))
            log.info("  %6.2fs SIGKILL %s, restarted", now - t0, killed_name)
            next_kill = now + draw(args.kill_every)
        if not away and resume_at is None and now >= next_stop and stopped_name != killed_name:
            procs.signal(stopped_name, signal.SIGSTOP)
            chaos.stops.append((round(now - t0, 3), -1.0))
            log.info("  %6.2fs SIGSTOP %s for %gs", now - t0, stopped_name, args.stop_for)
            resume_at = now + args.stop_for
            next_stop = float("inf")
        for name in names:
            if name != killed_name:
                procs.check_alive(name)
        if now - last_poll >= 0.25:
            last_poll = now
            left = open_runs(ids)
        time.sleep(0.02)
    if resume_at is not None:
        procs.signal(stopped_name, signal.SIGCONT)
        chaos.stops[-1] = (chaos.stops[-1][0], round(time.monotonic() - t0, 3))
    chaos.chaos_ended = time.monotonic() - t0
    log.info("chaos over at %.1fs; %d runs still running: draining", chaos.chaos_ended, left)
    wait_for(lambda: open_runs(ids) == 0, args.timeout, "every run to end", every=0.05)
    chaos.drained = time.monotonic() - t0
    log.info("drained at %.1fs", chaos.drained)
    return ids, chaos, generation


# -- main --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=300, help="workflow runs (300)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of chaos (30)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (3)")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker (4)")
    parser.add_argument("--lease-ms", type=int, default=3000, help="STEP_LEASE_MS (3000)")
    parser.add_argument("--kill-every", type=float, default=3.0, help="mean seconds (3)")
    parser.add_argument("--stop-every", type=float, default=8.0, help="mean seconds (8)")
    parser.add_argument(
        "--stop-for", type=float, default=None, help="seconds stopped (lease + 1.5 s)"
    )
    parser.add_argument("--step-ms", default="50,500", help="step work range in ms (50,500)")
    parser.add_argument("--pass-timeout", type=float, default=5.0, help="RUN_PASS_TIMEOUT (5)")
    parser.add_argument("--recovery-interval", type=float, default=2.0, help="(2)")
    parser.add_argument("--stalled-after", type=float, default=5.0, help="(5)")
    parser.add_argument(
        "--database", choices=sorted(URLS), default="postgres", help="database (postgres)"
    )
    parser.add_argument("--outage-at", type=float, default=10.0, help="seconds into the chaos (10)")
    parser.add_argument(
        "--outage-for", type=float, default=10.0, help="seconds the database is away (10; 0: none)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="drain timeout (300)")
    args = parser.parse_args(argv)
    try:
        low, high = (int(x) for x in args.step_ms.split(","))
    except ValueError:
        parser.error("--step-ms is LOW,HIGH in milliseconds")
    args.step_ms = (low, high)
    if args.stop_for is None:
        args.stop_for = args.lease_ms / 1000 + 1.5
    if args.runs < 1 or args.workers < 2 or args.concurrency < 1 or not 0 <= low <= high:
        parser.error("--runs >= 1, --workers >= 2, --concurrency >= 1, 0 <= LOW <= HIGH")
    if args.outage_at < 0 or args.outage_for < 0:
        parser.error("--outage-at and --outage-for are seconds, 0 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[chaos] %(message)s")

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    for path in (str(BENCH_DIR), str(ROOT)):  # ROOT: tests.faultproxy
        if path not in sys.path:
            sys.path.insert(0, path)
    from tests.faultproxy import FaultProxy

    url = URLS[args.database]
    env = django_env(
        SETTINGS,
        {
            "PIKKU_BENCH_WORKFLOWS_URL": url,
            "PIKKU_BENCH_STEP_LEASE_MS": str(args.lease_ms),
            "PIKKU_BENCH_RUN_LEASE_MS": str(args.lease_ms),
            "PIKKU_BENCH_RUN_PASS_TIMEOUT": repr(args.pass_timeout),
            "PIKKU_BENCH_RECOVERY_INTERVAL": repr(args.recovery_interval),
            "PIKKU_BENCH_STALLED_RUN_AFTER": repr(args.stalled_after),
            "PIKKU_BENCH_POLL": "0.2",
            "PIKKU_BENCH_LOG_LEVEL": "WARNING",
        },
    )
    os.environ.update(env)
    try:
        if args.database == "postgres":
            ensure_database(url)
        else:
            ensure_mariadb_database(url)
        import django

        django.setup()
        logging.getLogger("pikku_django").setLevel(logging.WARNING)
        server = reset(args.database)
    except Exception as exc:
        log.error("%s set-up failed (%s: %s)", args.database, type(exc).__name__, exc)
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="pikku-bench-chaos-"))
    parts = urlsplit(url)
    default_port = {"postgres": 5432, "mariadb": 3306}[args.database]
    proxy = FaultProxy(parts.hostname or "127.0.0.1", parts.port or default_port).start()
    # The workers reach the database through the proxy; this script goes straight there.
    procs = Processes(tmp, {**env, "PIKKU_BENCH_WORKFLOWS_URL": proxied(url, proxy.port)})
    try:
        ids, chaos, started = run_chaos(args, procs, proxy)
    except BenchError as exc:
        log.error("%s", exc)
        for name in procs.procs:
            log.error("--- %s:\n%s", name, procs.tail(name))
        return 1
    except KeyboardInterrupt:
        log.error("interrupted: stopping the workers")
        return 130
    finally:
        procs.stop_all()
        proxy.close()
        from django.db import connections

        connections.close_all()
    refused = sum(
        len(re.findall(r"not (?:be )?recorded", path.read_text(errors="replace")))
        for path in tmp.glob("*.log")
    )
    shutil.rmtree(tmp, ignore_errors=True)
    result = check(ids)
    first_after = first_step_after(ids, chaos.outage_ended_at)
    print(report_text(result, chaos, args, first_after))
    print(
        json.dumps(
            {
                "benchmark": (
                    "pikku_django chaos: SIGKILL and SIGSTOP of workers mid-run, "
                    "and a database outage"
                ),
                "settings": {
                    "database": args.database,
                    "runs": args.runs,
                    "steps_per_run": 5,
                    "workers": args.workers,
                    "concurrency": args.concurrency,
                    "step_lease_ms": args.lease_ms,
                    "run_lease_ms": args.lease_ms,
                    "run_pass_timeout_s": args.pass_timeout,
                    "recovery_interval_s": args.recovery_interval,
                    "stalled_run_after_s": args.stalled_after,
                    "seconds": args.seconds,
                    "kill_every_s": args.kill_every,
                    "stop_every_s": args.stop_every,
                    "stop_for_s": args.stop_for,
                    "step_ms": list(args.step_ms),
                    "outage_at_s": args.outage_at,
                    "outage_for_s": args.outage_for,
                    "seed": args.seed,
                },
                "machine": machine(server),
                "chaos": {
                    "kills_at_s": chaos.kills,
                    "stops_at_s": chaos.stops,
                    "chaos_seconds": round(chaos.chaos_ended, 3),
                    "outage_s": chaos.outage,
                    "first_step_after_outage_s": first_after,
                    "all_runs_ended_s": round(chaos.drained, 3),
                    "drain_s": round(chaos.drained - chaos.chaos_ended, 3),
                    "worker_processes_started": started,
                    "late_outcomes_refused_in_logs": refused,
                },
                "checks": {k: v for k, v in result.items() if k != "problems"},
                "problems": result["problems"],
                "passed": passed(result),
            }
        )
    )
    return 0 if passed(result) else 1


if __name__ == "__main__":
    sys.exit(main())
