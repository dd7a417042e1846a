"""Workflow throughput and latency: pikku_django next to Procrastinate and DBOS, like
for like, each at its best, on PostgreSQL; pikku alone on MariaDB and SQLite.

The pairings, each measured in the same run on the same server:

- 10 queued steps: pikku runs of ``--steps`` (10) queued no-op steps, with a worker
  thread carrying a run from step to step (the default) and, where this build has
  the setting, with carrying off (every step claimed from the queue); Procrastinate
  chains of 10 jobs, each job deferring the next; DBOS workflows of 10
  ``@DBOS.step()`` no-ops started on a DBOS ``Queue``;
- 1 step: pikku runs of one queued step against single Procrastinate jobs;
- inline: pikku runs whose 10 steps run inline in the orchestration pass, against
  DBOS workflows called directly (no queue);
- PgQueuer (10-job chains, single jobs) and django-absurd (10-step and 1-step tasks),
  run by a Python >= 3.12 (``PIKKU_BENCH_PYTHON_LATEST``; ``throughput_pgqueuer.py``
  says how to install them), and the bulk pairing (``--bulk`` units, 200 with
  ``--quick``: ``throughput_bulk.py``). Worker CPU a unit is printed for every system.

pikku runs with ``CONN_MAX_AGE`` 0 (Django's default) and 60. Every system gets the
same untimed warm-up (``--warmup`` units of each kind it is measured on) in fresh
processes at each concurrency of the sweep (``--concurrency 4,8,16`` threads, or
concurrent jobs, per process; ``--processes 1``), and each is configured as its
documentation recommends (``throughput_baselines.DOCS``, also in the JSON):
Procrastinate's pool holds concurrency + 1 connections, DBOS's queue has
``worker_concurrency`` and an executor id per process.

Each figure is measured ``--repeat`` (5) times; in each repeat the systems run in an
order rotated by one place from the last. Every figure is printed as its median with
its range; each system's best concurrency (highest median) is the one compared, as a
ratio of medians. Latency is measured one unit at a time on an idle worker
(``--latency-runs`` per repeat, at the sweep's first concurrency): from the moment the
unit is stored to its first step's start, and from each step's end to the next
step's start. The worker memory phase runs ``--memory-steps`` (100,000) steps of
``bench.payload`` (nine queued steps in ten, 1 KB in and out of each) through one
long-lived worker and judges the slope of its resident memory over the last half.

With ``--integrations``, pikku also runs 10-step and 1-step runs with
``PIKKU["PROMETHEUS_METRICS"]`` and ``PIKKU["SENTRY"]`` on (``PROMETHEUS_MULTIPROC_DIR``
set, ``sentry_sdk.init()`` with a transport that drops events), next to the same
configuration with them off.

With ``--pooler`` (PostgreSQL), 10-step and 1-step runs also go through a PgBouncer in
transaction mode (Debian's ``pgbouncer``, started by the benchmark on a free port of
127.0.0.1 with ``default_pool_size`` 20, and stopped after): pikku polling (0.1 s,
``WORKER_NOTIFY`` off), pikku with a direct ``LISTEN`` alias (``LISTEN_DATABASES``),
and Procrastinate as its documentation advises there (no LISTEN/NOTIFY, 0.1 s polling,
nothing prepared), each next to the same system on the direct connection; and pikku
direct with its statements not prepared, as behind the pooler
(``throughput_pooler.py``). The runs are stored on the direct connection either way.

Targets (medians, each system at its best concurrency, pikku with CONN_MAX_AGE 60):
10-step runs >= 3x Procrastinate chains, >= 2x django-absurd 10-step tasks and >= 1.5x
DBOS queued workflows; 1-step runs >= 1.0x PgQueuer jobs and >= 2.0x Procrastinate
jobs; bulk start >= 1.0x PgQueuer's batch enqueue; one ``start_workflow`` call no slower
than one PgQueuer enqueue; inline >= 2x DBOS direct; memory slope < 50 bytes a step;
with ``--integrations``, on >= 0.95x off for 10-step and 1-step runs; with
``--pooler``, pikku through the pooler (polling, and with a direct LISTEN) >= 0.8x
direct for 10-step and 1-step runs.

Run it from the repository root on a quiet machine:

    .venv/bin/pip install -e ".[dev,bench]"
    .venv/bin/python benchmarks/throughput.py --databases postgres       # the peers, memory
    .venv/bin/python benchmarks/throughput.py --databases mariadb,sqlite # pikku alone
    .venv/bin/python benchmarks/throughput.py --quick      # about a minute, to check it runs

(each full run takes tens of minutes: every system starts afresh at every concurrency of
every repeat).

Databases: ``PIKKU_BENCH_THROUGHPUT_URL`` (postgres://postgres@127.0.0.1:5432/
pikku_bench_throughput), ``PIKKU_BENCH_PROCRASTINATE_URL`` (.../pikku_bench_procrastinate),
``PIKKU_BENCH_DBOS_URL`` (.../pikku_bench_dbos), ``PIKKU_BENCH_THROUGHPUT_MARIADB_URL``
(mysql://root@127.0.0.1:3306/pikku_bench_throughput) and a temporary SQLite file; they
are created when missing and emptied between repeats, so they must be this benchmark's
alone. The servers' fsync,
synchronous_commit, autovacuum, shared_buffers and max_connections go into the JSON;
where the server runs with autovacuum off, every database gets the same VACUUM
ANALYZE between repeats (``--vacuum``). Progress goes to stderr; stdout gets the
tables and, as its last line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from benchlib import BENCH_DIR, Processes, django_env, machine
from throughput_pooler import pooled_systems, pooler_pairings, pooler_version, start_pooler
from throughput_report import judge, render
from throughput_run import DATABASES, run_database

log = logging.getLogger("pikku.bench.throughput")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        epilog="Full figures need a quiet machine; --quick is for checking that it runs.",
    )
    add = parser.add_argument
    add("--runs", type=int, default=100, help="units per measured batch (100)")
    add("--steps", type=int, default=10, help="steps per run or chain (10)")
    add("--concurrency", default="4,8,16", help="threads per process, the sweep (4,8,16)")
    add("--processes", type=int, default=1, help="worker processes per system (1)")
    add("--repeat", type=int, default=5, help="repeats of every figure, interleaved (5)")
    add("--warmup", type=int, default=10, help="untimed units of each kind per start (10)")
    add("--latency-runs", type=int, default=10, help="units timed alone per repeat (10)")
    add("--memory-steps", type=int, default=100_000, help="steps of the memory phase (100000)")
    add("--conn-max-age", default="0,60", help="pikku workers' CONN_MAX_AGE values (0,60)")
    add("--databases", default=",".join(DATABASES), help="postgres,mariadb,sqlite (all)")
    add("--no-peers", action="store_true", help="pikku only")
    add(
        "--systems",
        default="",
        help="only these systems, by key prefix: pikku_carried_cma60, pikku_claimed, "
        "procrastinate, dbos, ... (all)",
    )
    add("--kinds", default="", help="only these kinds: chain, single, inline (all)")
    add(
        "--vacuum",
        choices=("auto", "always", "never"),
        default="auto",
        help="VACUUM ANALYZE between repeats: auto = only where autovacuum is off (auto)",
    )
    add("--quick", action="store_true", help="small counts, one concurrency, one repeat")
    add("--profile", type=Path, metavar="DIR", help="py-spy a pikku worker afterwards, into DIR")
    add("--timeout", type=float, default=300.0, help="seconds per wait (300)")
    add(
        "--transactions",
        action="store_true",
        help="count server transactions per unit on PostgreSQL (about 25 s more a batch)",
    )
    add(
        "--integrations",
        action="store_true",
        help="also pikku (carried, CONN_MAX_AGE 60) with the Prometheus and Sentry "
        "integrations on, 10-step and 1-step runs, as a ratio to them off",
    )
    add(
        "--pooler",
        action="store_true",
        help="also pikku (carried, CONN_MAX_AGE 60; polling, and with a direct LISTEN alias) "
        "and Procrastinate with their workers behind a PgBouncer in transaction mode, and "
        "pikku direct with its statements not prepared, 10-step and 1-step runs, as ratios "
        "to the direct connection",
    )
    add("--bulk", type=int, default=10_000, help="units of the bulk pairing, 0 for none (10000)")
    add("--child", choices=DATABASES, help=argparse.SUPPRESS)
    if parser.parse_known_args(argv)[0].quick:  # smaller defaults; options given still win
        parser.set_defaults(
            runs=10,
            warmup=2,
            latency_runs=2,
            concurrency="4",
            repeat=1,
            memory_steps=1_000,
            bulk=200,
        )
    args = parser.parse_args(argv)
    try:
        args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
        args.conn_max_age = [int(c) for c in str(args.conn_max_age).split(",") if c.strip()]
    except ValueError:
        parser.error("--concurrency and --conn-max-age are comma-separated integers")
    args.systems = [k.strip() for k in args.systems.split(",") if k.strip()]
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if set(args.kinds) - {"chain", "single", "inline"}:
        parser.error("--kinds takes chain, single and inline")
    args.databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    unknown = sorted(set(args.databases) - set(DATABASES))
    if unknown:
        parser.error(f"unknown databases {unknown}; choose from {', '.join(DATABASES)}")
    counts = [args.runs, args.steps, args.processes, args.repeat, *args.concurrency]
    if not args.concurrency or not args.conn_max_age or min(counts) < 1:
        parser.error("counts must be positive")
    if min(args.warmup, args.latency_runs, args.memory_steps, *args.conn_max_age) < 0:
        parser.error("--warmup, --latency-runs, --memory-steps, --conn-max-age must be >= 0")
    return args


def child_argv(args: argparse.Namespace, database: str) -> list[str]:
    argv = [
        *(sys.executable, str(Path(__file__).resolve()), "--child", database),
        *("--runs", str(args.runs), "--steps", str(args.steps)),
        *("--concurrency", ",".join(map(str, args.concurrency))),
        *("--processes", str(args.processes), "--repeat", str(args.repeat)),
        *("--warmup", str(args.warmup), "--latency-runs", str(args.latency_runs)),
        *("--memory-steps", str(args.memory_steps), "--vacuum", args.vacuum),
        *("--conn-max-age", ",".join(map(str, args.conn_max_age))),
        *("--timeout", str(args.timeout), "--bulk", str(args.bulk)),
        *(["--transactions"] if args.transactions else []),
        *(["--integrations"] if args.integrations else []),
        *(["--pooler"] if args.pooler else []),
        *(["--systems", ",".join(args.systems)] if args.systems else []),
        *(["--kinds", ",".join(args.kinds)] if args.kinds else []),
    ]
    if args.profile:
        argv += ["--profile", str(args.profile)]
    return [*argv, "--no-peers"] if args.no_peers else argv


def child_main(args: argparse.Namespace) -> int:
    """One database, in a process of its own (Django is configured once per process)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"pikku-bench-throughput-{args.child}-"))
    procs = Processes(tmp, dict(os.environ))
    pooler = None
    try:
        if args.pooler and args.child == "postgres":
            pooler = start_pooler()
            args.more_systems = [pooled_systems(pooler)]
        result = run_database(args.child, args, procs, tmp)
        if pooler is not None:
            result["pooler"] = {"pgbouncer": pooler_version(), "pool_mode": pooler.mode}
    except Exception as exc:  # reported in the JSON, with the workers' last lines
        log.exception("%s failed", args.child)
        for name in procs.procs:
            log.error("--- %s:\n%s", name, procs.tail(name))
        result = {"database": args.child, "skipped": f"failed: {type(exc).__name__}: {exc}"}
    finally:
        procs.stop_all()
        if pooler is not None:
            pooler.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="[bench] %(asctime)s %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("procrastinate", "dbos", "pikku_django"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    if args.child:
        return child_main(args)

    began = time.perf_counter()
    load_start = os.getloadavg()
    results: dict[str, Any] = {}
    for database in args.databases:
        log.info("%s: starting", database)
        env = django_env("bench_settings")
        child = subprocess.Popen(
            child_argv(args, database), env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            stdout, _ = child.communicate()
        except KeyboardInterrupt:
            # The child stops its own workers on SIGTERM before it exits.
            log.error("interrupted: stopping the %s process and its workers", database)
            child.terminate()
            child.wait(60)
            return 130
        done = subprocess.CompletedProcess(child.args, child.returncode, stdout)
        lines = done.stdout.strip().splitlines()
        results[database] = (
            json.loads(lines[-1])
            if done.returncode == 0 and lines
            else {"database": database, "skipped": f"its process failed (exit {done.returncode})"}
        )
    took = time.perf_counter() - began
    targets = judge(results)
    targets["pairings"] += pooler_pairings(results)
    print(render(results, targets, args))
    from throughput_baselines import DOCS

    print(
        json.dumps(
            {
                "benchmark": "pikku_django workflow throughput, latency and worker memory, "
                "next to Procrastinate and DBOS",
                "settings": {
                    "runs_per_batch": args.runs,
                    "steps_per_run": args.steps,
                    "concurrency_sweep": args.concurrency,
                    "processes": args.processes,
                    "repeat": args.repeat,
                    "order": "rotated by one system each repeat",
                    "warmup_units_per_kind": args.warmup,
                    "latency_runs_per_repeat": args.latency_runs,
                    "memory_steps": args.memory_steps,
                    "pikku_conn_max_age": args.conn_max_age,
                    "vacuum": args.vacuum,
                    "quick": args.quick,
                    "systems": args.systems or "all",
                    "kinds": args.kinds or "all",
                    "integrations": args.integrations,
                    "pooler": args.pooler,
                },
                "docs": DOCS,
                "machine": machine(
                    results.get("postgres", {}).get("server", {}).get("server_version", "-"),
                    *("procrastinate", "dbos", "psycopg-pool", "mysqlclient"),
                )
                | {"load_average_1m_at_start": round(load_start[0], 2)},
                "seconds": round(took, 1),
                "databases": results,
                "targets": targets,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
