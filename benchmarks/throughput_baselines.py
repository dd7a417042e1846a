"""The baselines of ``benchmarks/throughput.py``: Procrastinate and DBOS Transact.

Procrastinate: ``procrastinate_app`` with one no-op task, ``bench_noop``; the
benchmark runs its own worker (``python -m procrastinate
--app=throughput_baselines.procrastinate_app worker``) on a database of its own
(``PIKKU_BENCH_PROCRASTINATE_URL``).

DBOS: ``python benchmarks/throughput_baselines.py dbos ...`` is one DBOS process
running the same 10-step workflow of no-op steps as pikku's benchmark, each step
a ``@DBOS.step()``, with its system database on the same PostgreSQL server
(``PIKKU_BENCH_DBOS_URL``). It launches DBOS, prints ``ready``, waits for a line
on stdin, runs its workflows on ``--threads`` threads (each workflow called
directly, DBOS's fastest way to run one: no queue in between), and prints one JSON
line with its start and end times (epoch seconds). ``... dbos-init`` launches DBOS
once, so the processes that follow find the system database migrated.

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
PROCRASTINATE_TASK = "bench_noop"


def _make_procrastinate_app() -> Any:
    try:
        import procrastinate
    except ImportError:  # the benchmark reports the missing baseline itself
        return None
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=PROCRASTINATE_URL))

    @app.task(name=PROCRASTINATE_TASK)
    async def bench_noop() -> None:
        return None

    return app


# Not in a DBOS process (this file run as a script), which has no use for it.
procrastinate_app = _make_procrastinate_app() if __name__ != "__main__" else None


# -- DBOS ----------------------------------------------------------------------------------


def _dbos_url(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


def _launch_dbos() -> Any:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "pikku-bench",
        "system_database_url": _dbos_url(DBOS_URL),
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def noop() -> None:
        return None

    @DBOS.workflow()
    def steps_workflow(steps: int) -> int:
        for _ in range(steps):
            noop()
        return steps

    DBOS.launch()
    return steps_workflow


def dbos_main(args: argparse.Namespace) -> int:
    from dbos import DBOS

    workflow = _launch_dbos()
    if args.command == "dbos-init":
        workflow(1)
        DBOS.destroy()
        return 0
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    with ThreadPoolExecutor(args.threads) as pool:
        for result in pool.map(lambda _: workflow(args.steps), range(args.workflows)):
            assert result == args.steps
    end = time.time()
    print(json.dumps({"start": start, "end": end, "pid": os.getpid()}), flush=True)
    DBOS.destroy()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A DBOS process of benchmarks/throughput.py")
    parser.add_argument("command", choices=("dbos", "dbos-init"))
    parser.add_argument("--workflows", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=4)
    return dbos_main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
