"""django.tasks throughput on PostgreSQL: pikku_django.tasks with ``pikku_worker``, next to
``django-tasks-db``'s ``db_worker`` and to Procrastinate, on one database in one run.

Each system gets ``--tasks`` no-op tasks (default 300), enqueued one by one from this
process as a web request would (``task.enqueue()``, or ``defer()`` for Procrastinate),
run by ``--processes`` worker processes (default 1) of its own kind. Two figures each:

- ``tasks_per_s``: enqueued while the workers wait, from the first enqueue to the last
  completion the database recorded (the enqueues, one process, are part of it:
  ``enqueues_per_s`` says how fast they alone went);
- ``drain_tasks_per_s``: the same number already queued when the workers start, from
  the first task's start to the last completion (the workers alone).

- pikku: ``TASKS["default"]`` is ``pikku_django.tasks.PikkuBackend``; each enqueue is
  a run of ``task:tasks.bench_noop`` with one queued step; ``pikku_worker
  --concurrency C`` (``--concurrency``, default 4) wakes on NOTIFY.
- django-tasks-db: ``TASKS["db"]`` is ``django_tasks_db.DatabaseBackend``; its own
  ``db_worker`` runs one task at a time per process (it has no threads), polling
  every ``--db-interval`` seconds (default 0.1; its own default is 1) when idle.
- Procrastinate: the async no-op task of ``throughput_baselines.py`` with
  ``--concurrency`` per worker process, each job deferred on its own.

Every figure is measured ``--repeat`` times (default 3), the systems taking turns in
an order rotated by one place each round, and reported as its median with its range;
each ratio is of two medians. The target is pikku >= 2x django-tasks-db and >= 1.0x
Procrastinate; the ratios are printed, not asserted. The last line printed is one
JSON object.

    .venv/bin/pip install -e ".[bench]"     # django-tasks-db, procrastinate
    .venv/bin/python benchmarks/tasks.py --tasks 300

The database is ``PIKKU_BENCH_TASKS_URL`` (default
postgres://postgres@127.0.0.1:5432/pikku_bench_tasks), created and migrated when
missing; what an earlier run left in it is deleted first. This file is also the
Django settings module of the benchmark and its workers (``DJANGO_SETTINGS_MODULE=tasks``
with ``benchmarks/`` on the path), and the module of its two tasks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dj_database_url

# -- settings (this module is DJANGO_SETTINGS_MODULE=tasks) ----------------------------------

TASKS_URL = os.environ.get(
    "PIKKU_BENCH_TASKS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_tasks"
)
SECRET_KEY = "pikku-bench-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["pikku_django", "django_tasks", "django_tasks_db"]
DATABASES = {"default": dj_database_url.parse(TASKS_URL, conn_max_age=60)}
TASKS = {
    "default": {"BACKEND": "pikku_django.tasks.PikkuBackend", "OPTIONS": {"retries": 0}},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
PIKKU = {"WORKER_POLL_INTERVAL": 1.0}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pikku_django": {"handlers": ["console"], "level": "WARNING"}},
}

# -- the tasks (made on first use: settings must be loaded before a task is declared) ----------


def _noop() -> None:
    return None


def __getattr__(name: str) -> Any:
    """``tasks.bench_noop`` (on the pikku backend) and ``tasks.bench_noop_db`` (django-tasks-db)."""
    if name not in ("bench_noop", "bench_noop_db"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pikku_django.tasks.compat import task

    def noop() -> None:
        return None

    noop.__name__ = noop.__qualname__ = name
    made = task(backend="db" if name.endswith("_db") else "default")(noop)
    globals()[name] = made
    return made


# -- the benchmark -------------------------------------------------------------------------------

log = logging.getLogger("pikku.bench.tasks")

#: Each system's figures, each reported as the median and spread of the repeats.
FIGURES = ("tasks_per_s", "enqueues_per_s", "drain_tasks_per_s")


@dataclass
class System:
    """One system under test: how to start its workers, enqueue, and read its progress."""

    key: str
    workers: list[list[str]]
    enqueue: Any
    done_sql: str
    first_start_sql: str
    last_end_sql: str
    ready: Any = None
    #: What the enqueues run inside (Procrastinate: its open app).
    session: Any = contextlib.nullcontext


def reset(app: Any) -> None:
    """Empty what an earlier run left: runs, django-tasks-db results, Procrastinate jobs.

    Each table is truncated and not vacuumed: its statistics are then unknown, not
    "empty". After VACUUM ANALYZE of an empty table the planner trusts that it is
    empty, and a worker session that caches its plans then (Procrastinate's
    ``procrastinate_fetch_job``) keeps plans for an empty table while a thousand
    jobs arrive: Procrastinate ran 1,000 enqueued-while-waiting jobs at 12 a second
    that way, against about 200 otherwise."""
    from django.db import connection
    from django_tasks_db.models import DBTaskResult

    from pikku_django.models import WorkflowRun

    tables = [WorkflowRun._meta.db_table, DBTaskResult._meta.db_table]
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('procrastinate_jobs')")
        exists = cursor.fetchone()[0]
        if exists:
            tables.append("procrastinate_jobs")
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
    if app is not None and not exists:
        with app.open():
            app.schema_manager.apply_schema()


def one_value(sql: str) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def start_workers(procs: Any, system: System, args: argparse.Namespace) -> list[str]:
    from benchlib import wait_for

    names = [f"{system.key}-{i}" for i in range(len(system.workers))]
    for name, argv in zip(names, system.workers, strict=True):
        procs.start(name, argv)

    def ready() -> bool:
        procs.check_alive(*names)
        return system.ready is None or system.ready()

    wait_for(ready, args.timeout, f"{system.key} workers to start", every=0.1)
    time.sleep(args.settle)
    procs.check_alive(*names)
    return names


def enqueue_all(system: System, n: int) -> tuple[float, float]:
    """Enqueue n tasks one by one; when the first began (epoch) and how long all took."""
    with system.session():
        started, t0 = time.time(), time.perf_counter()
        for _ in range(n):
            system.enqueue()
        took = time.perf_counter() - t0
    return started, took


def wait_done(system: System, n: int, args: argparse.Namespace) -> None:
    from benchlib import wait_for

    wait_for(
        lambda: one_value(system.done_sql) >= n,
        args.timeout,
        f"{n} {system.key} tasks to complete",
        every=0.05,
    )


def measure(system: System, procs: Any, args: argparse.Namespace, app: Any) -> dict[str, Any]:
    """Both figures of one system: enqueued while its workers wait, and a queue drained."""
    n = args.tasks
    reset(app)
    names = start_workers(procs, system, args)
    try:
        started, took = enqueue_all(system, n)
        wait_done(system, n, args)
        live = float(one_value(system.last_end_sql)) - started
    finally:
        for name in names:
            procs.stop(name)
    reset(app)
    enqueue_all(system, n)
    names = start_workers(procs, system, args)
    try:
        wait_done(system, n, args)
        drain = float(one_value(system.last_end_sql)) - float(one_value(system.first_start_sql))
    finally:
        for name in names:
            procs.stop(name)
    return {
        "tasks": n,
        "tasks_per_s": round(n / live, 1),
        "seconds": round(live, 3),
        "enqueues_per_s": round(n / took, 1),
        "drain_tasks_per_s": round(n / drain, 1),
        "drain_seconds": round(drain, 3),
    }


def systems(args: argparse.Namespace, app: Any) -> list[System]:
    import tasks as bench  # this file as the settings module, whose tasks the workers import
    from benchlib import listening_sessions
    from django_tasks_db.models import DBTaskResult

    python = [sys.executable, "-m"]
    table = DBTaskResult._meta.db_table
    found = [
        System(
            "pikku",
            [
                [*python, "django", "pikku_worker", "--concurrency", str(args.concurrency)]
                for _ in range(args.processes)
            ],
            bench.bench_noop.enqueue,
            "SELECT count(*) FROM pikku_workflow_run WHERE status = 'completed'",
            "SELECT extract(epoch FROM min(started_at)) FROM pikku_step_attempt",
            "SELECT extract(epoch FROM max(updated_at)) FROM pikku_workflow_run",
            lambda: listening_sessions(TASKS_URL, "pikku_work") >= args.processes,
        ),
        System(
            "django_tasks_db",
            [
                [
                    *(*python, "django", "db_worker", "--backend", "db", "--interval"),
                    *(str(args.db_interval), "--no-startup-delay", "--no-reload"),
                ]
                for _ in range(args.processes)
            ],
            bench.bench_noop_db.enqueue,
            f"SELECT count(*) FROM {table} WHERE status = 'SUCCESSFUL'",
            f"SELECT extract(epoch FROM min(started_at)) FROM {table}",
            f"SELECT extract(epoch FROM max(finished_at)) FROM {table}",
        ),
    ]
    if app is not None:
        task = app.tasks["bench_noop"]
        found.append(
            System(
                "procrastinate",
                [
                    [
                        *(*python, "procrastinate"),
                        *("--app=throughput_baselines.procrastinate_app", "--log-level"),
                        *("warning", "worker", "--concurrency", str(args.concurrency)),
                    ]
                    for _ in range(args.processes)
                ],
                task.defer,
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
                "SELECT extract(epoch FROM min(at)) FROM procrastinate_events "
                "WHERE type = 'started'",
                "SELECT extract(epoch FROM max(at)) FROM procrastinate_events "
                "WHERE type = 'succeeded'",
                lambda: listening_sessions(TASKS_URL, "procrastinate") >= args.processes,
                app.open,
            )
        )
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300, help="tasks per system (300)")
    parser.add_argument("--processes", type=int, default=1, help="worker processes each (1)")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="threads of pikku_worker / Procrastinate (4)"
    )
    parser.add_argument(
        "--db-interval", type=float, default=0.1, help="db_worker's idle poll, seconds (0.1)"
    )
    parser.add_argument("--settle", type=float, default=1.0, help="seconds idle before (1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per phase, seconds (300)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds, the systems' order rotated (3)"
    )
    parser.add_argument(
        "--systems",
        default="pikku,django_tasks_db,procrastinate",
        help="which systems, comma-separated (all three)",
    )
    args = parser.parse_args(argv)
    if min(args.tasks, args.processes, args.concurrency, args.repeat) < 1:
        parser.error("--tasks, --processes, --concurrency and --repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[bench] %(message)s")
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    bench_dir = Path(__file__).resolve().parent
    sys.path.insert(0, str(bench_dir))
    from benchlib import BenchError, Processes, django_env, ensure_database, machine
    from figures import Summary, rotations

    env = django_env("tasks", {"PIKKU_BENCH_PROCRASTINATE_URL": TASKS_URL})
    os.environ.update(env)
    try:
        ensure_database(TASKS_URL)
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0, interactive=False)
    except Exception as exc:
        log.error("PostgreSQL set-up failed (%s: %s)", type(exc).__name__, exc)
        return 2
    try:
        from throughput_baselines import procrastinate_app
    except ImportError:
        procrastinate_app = None
    if procrastinate_app is None:
        log.warning("procrastinate is not installed: no Procrastinate figures")

    tmp = Path(tempfile.mkdtemp(prefix="pikku-bench-tasks-"))
    procs = Processes(tmp, env)
    began = time.perf_counter()
    measured: dict[str, list[dict[str, Any]]] = {}
    try:
        chosen = [s for s in systems(args, procrastinate_app) if s.key in args.systems.split(",")]
        for r, order in rotations(chosen, args.repeat):
            for system in order:
                got = measure(system, procs, args, procrastinate_app)
                measured.setdefault(system.key, []).append(got)
                log.info(
                    "repeat %d/%d, %s: %.1f tasks/s enqueued and completed, %.1f tasks/s drained",
                    r + 1,
                    args.repeat,
                    system.key,
                    got["tasks_per_s"],
                    got["drain_tasks_per_s"],
                )
    except BenchError as exc:
        log.error("%s", exc)
        for name in procs.procs:
            log.error("--- %s:\n%s", name, procs.tail(name))
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    results: dict[str, Any] = {}
    for key, runs in measured.items():
        results[key] = {"tasks": args.tasks}
        for figure in FIGURES:
            summary = Summary.of([run[figure] for run in runs])
            results[key][figure] = summary.as_json(1)
            print(f"{key} {figure}: {summary.text()}")
    ratios: dict[str, float] = {}
    for other in ("django_tasks_db", "procrastinate"):
        if other in results and "pikku" in results:
            for figure in ("tasks_per_s", "drain_tasks_per_s"):
                ratio = results["pikku"][figure]["median"] / results[other][figure]["median"]
                ratios[f"pikku_vs_{other}_{figure.removesuffix('_per_s')}"] = round(ratio, 2)
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}x")
    from django.db import connection

    print(
        json.dumps(
            {
                "benchmark": "django.tasks: tasks enqueued and completed per second",
                "settings": {
                    "tasks": args.tasks,
                    "processes": args.processes,
                    "concurrency": args.concurrency,
                    "db_worker_interval": args.db_interval,
                    "enqueue": "one by one from one process",
                    "pikku_retries": 0,
                    "repeat": args.repeat,
                    "order": "rotated by one each repeat",
                    "reset": "TRUNCATE, statistics left unknown (see reset())",
                },
                "machine": machine(connection.pg_version, "django-tasks", "django-tasks-db"),
                "seconds": round(time.perf_counter() - began, 1),
                **results,
                "ratios": ratios,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
