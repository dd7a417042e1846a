"""The peers of ``benchmarks/throughput.py``: Procrastinate and DBOS Transact, each set
up as its documentation recommends (PgQueuer and django-absurd, which need Python >=
3.12, are in ``throughput_pgqueuer.py``, ``throughput_absurd.py`` and
``throughput_peers.py``).

Procrastinate (``procrastinate_app``): two tasks, ``bench_noop`` (a single job) and
``bench_chain`` (a job that, while ``remaining`` is above 1, defers the next job of
its chain with one less: a chain of 10 jobs is the peer of a pikku run of 10 queued
steps). The benchmark runs ``python -m procrastinate
--app=throughput_baselines.procrastinate_app worker --concurrency N``; the app's
connection pool holds ``PIKKU_BENCH_PROCRASTINATE_POOL`` connections (the
benchmark sets concurrency + 1: one per concurrent job, one for LISTEN/NOTIFY),
where psycopg_pool would otherwise open 4. Its database is
``PIKKU_BENCH_PROCRASTINATE_URL``; with ``PIKKU_BENCH_PROCRASTINATE_PREPARE=0`` its
connections prepare no statements (``prepare_threshold=None``, for a transaction pooler:
``throughput.py --pooler``).

DBOS: ``python benchmarks/throughput_baselines.py dbos --concurrency N`` is one DBOS
process with the same 10-step workflow of no-op ``@DBOS.step()`` steps, and a DBOS
queue (``DBOS.register_queue('bench', worker_concurrency=N)``) it dequeues from. It prints
``ready`` once launched, then reads commands on stdin: ``direct W S`` calls W
workflows of S steps directly on N threads (DBOS's fastest path, no queue) and
prints one JSON line with the start and end (epoch seconds); ``quit`` (or end of
input) stops it. Queued workflows are enqueued by the benchmark itself with a
``DBOSClient``. ``... dbos-init`` launches DBOS once, so the processes that follow
find the system database migrated. Its system database is ``PIKKU_BENCH_DBOS_URL``.

Both are benchmark-only dependencies: ``pip install -e ".[bench]"``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

PROCRASTINATE_URL = os.environ.get(
    "PIKKU_BENCH_PROCRASTINATE_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_procrastinate"
)
DBOS_URL = os.environ.get(
    "PIKKU_BENCH_DBOS_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_dbos"
)
PROCRASTINATE_NOOP = "bench_noop"
PROCRASTINATE_CHAIN = "bench_chain"
DBOS_QUEUE = "bench"
DBOS_WORKFLOW = "bench_steps"

#: Where each peer's documentation says how to run it for throughput: the settings
#: above follow these pages.
DOCS = {
    "procrastinate": [
        # The pool must hold a connection per concurrent job, and one for LISTEN/NOTIFY.
        "https://procrastinate.readthedocs.io/en/stable/howto/connections.html",
        "https://procrastinate.readthedocs.io/en/stable/howto/basics/connector.html",
        # --concurrency: jobs one worker runs at once (async tasks share its event loop).
        "https://procrastinate.readthedocs.io/en/stable/howto/production/concurrency.html",
        "https://procrastinate.readthedocs.io/en/stable/howto/basics/worker.html",
        # Behind a transaction pooler (throughput.py --pooler): no LISTEN/NOTIFY, the
        # worker polls (worker --no-listen-notify, --fetch-job-polling-interval), and
        # psycopg prepares nothing (prepare_threshold=None).
        "https://procrastinate.readthedocs.io/en/stable/howto/connections.html",
        "https://www.psycopg.org/psycopg3/docs/advanced/prepare.html#using-prepared-statements-with-pgbouncer",
    ],
    "dbos": [
        # Queue(worker_concurrency=...) limits the workflows one process runs at once;
        # each process needs its own executor_id.
        "https://docs.dbos.dev/python/tutorials/queue-tutorial",
        "https://docs.dbos.dev/python/reference/queues",
    ],
    "pgqueuer": [
        # asyncpg driver (about twice psycopg's throughput); batch_size up for short jobs;
        # max_concurrent_tasks at least twice batch_size; LISTEN/NOTIFY wakes the worker.
        "https://pgqueuer.readthedocs.io/en/latest/guides/performance-tuning.html",
        "https://github.com/janbjorge/pgqueuer/blob/main/docs/development/benchmark.md",
    ],
    "absurd": [
        # absurd_worker --concurrency N; --batch-size defaults to it, --poll-interval 0.25 s.
        "https://lincolnloop.github.io/django-absurd/",
        "https://github.com/lincolnloop/django-absurd/blob/main/AGENTS.md",
    ],
    "django": [
        # CONN_MAX_AGE: 0 closes the connection after every request or unit of work.
        "https://docs.djangoproject.com/en/5.2/ref/databases/#persistent-connections",
    ],
}


def _make_procrastinate_app() -> Any:
    try:
        import procrastinate
    except ImportError:  # the benchmark reports the missing peer itself
        return None
    size = int(os.environ.get("PIKKU_BENCH_PROCRASTINATE_POOL", "5"))
    # Behind a transaction pooler psycopg must prepare nothing (PgBouncer before 1.21
    # keeps no prepared statements): its connections' prepare_threshold is None.
    prepare = os.environ.get("PIKKU_BENCH_PROCRASTINATE_PREPARE", "1") == "1"
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=PROCRASTINATE_URL,
            min_size=size,
            max_size=size,
            **({} if prepare else {"kwargs": {"prepare_threshold": None}}),
        )
    )

    @app.task(name=PROCRASTINATE_NOOP)
    async def bench_noop() -> None:
        return None

    @app.task(name=PROCRASTINATE_CHAIN)
    async def bench_chain(remaining: int) -> None:
        if remaining > 1:
            await bench_chain.defer_async(remaining=remaining - 1)

    return app


# Not in a DBOS process (this file run as a script), which has no use for it.
procrastinate_app = _make_procrastinate_app() if __name__ != "__main__" else None


# -- DBOS ----------------------------------------------------------------------------------


def dbos_url(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


#: Seconds between a DBOS process's looks at its queue. Each look starts at most
#: worker_concurrency workflows, so at DBOS's default of 1 s the queue runs at most
#: worker_concurrency workflows a second whatever the hardware; the benchmark looks
#: 10 times a second (PIKKU_BENCH_DBOS_POLL), which DBOS's Queue reference allows.
DBOS_POLL = float(os.environ.get("PIKKU_BENCH_DBOS_POLL", "0.1"))


def _launch_dbos(concurrency: int) -> Any:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "pikku-bench",
        "system_database_url": dbos_url(DBOS_URL),
        "log_level": "WARNING",
        # One executor id per process, as worker_concurrency asks.
        "executor_id": f"pikku-bench-{os.getpid()}",
        # A pool that does not make the queue's threads wait for a connection.
        "sys_db_pool_size": max(20, 2 * concurrency + 4),
    }
    DBOS(config=config)

    @DBOS.step()
    def noop() -> None:
        return None

    @DBOS.workflow(name=DBOS_WORKFLOW)
    def steps_workflow(steps: int) -> int:
        for _ in range(steps):
            noop()
        return steps

    DBOS.launch()
    # The queue's configuration lives in the system database: this run's concurrency
    # replaces the last run's.
    DBOS.register_queue(
        DBOS_QUEUE,
        worker_concurrency=concurrency,
        polling_interval_sec=DBOS_POLL,
        on_conflict="always_update",
    )
    return steps_workflow


def dbos_main(args: argparse.Namespace) -> int:
    from dbos import DBOS

    workflow = _launch_dbos(args.concurrency)
    if args.command == "dbos-init":
        workflow(1)
        DBOS.destroy()
        return 0
    print("ready", flush=True)
    with ThreadPoolExecutor(args.concurrency) as pool:
        for line in sys.stdin:
            words = line.split()
            if not words or words[0] == "quit":
                break
            if words[0] == "direct":
                count, steps = int(words[1]), int(words[2])
                start = time.time()
                for result in pool.map(workflow, [steps] * count):
                    assert result == steps
                end = time.time()
                print(json.dumps({"start": start, "end": end}), flush=True)
    DBOS.destroy()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A DBOS process of benchmarks/throughput.py")
    parser.add_argument("command", choices=("dbos", "dbos-init"))
    parser.add_argument("--concurrency", type=int, default=4)
    return dbos_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
