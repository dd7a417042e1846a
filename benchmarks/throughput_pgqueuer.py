"""PgQueuer, a peer of ``benchmarks/throughput.py``, in processes of a Python >= 3.12.

PgQueuer needs Python 3.12 or newer, so the benchmark (which may run on 3.11) runs
this file with ``PIKKU_BENCH_PYTHON_LATEST`` (or the first of python3.13, python3.12,
~/.pyenv/versions/3.1[23]*/bin/python that imports pgqueuer and asyncpg)::

    python3.13 -m venv /tmp/pgq && /tmp/pgq/bin/pip install "pgqueuer>=1.6" asyncpg
    PIKKU_BENCH_PYTHON_LATEST=/tmp/pgq/bin/python .venv/bin/python benchmarks/throughput.py

(or ``pip install -e ".[bench-latest]"`` into the Python 3.12+ ``.venv-latest``.)

Configured as PgQueuer's docs advise for short jobs: the asyncpg driver (about twice
psycopg's throughput in its own benchmark), LISTEN/NOTIFY wake-ups (its default),
``max_concurrent_tasks`` = the benchmark's concurrency, and the largest
``batch_size`` that allows (``max_concurrent_tasks`` must be at least twice it).

- ``worker --concurrency N``: one QueueManager with two entrypoints, ``bench_noop`` and
  ``bench_chain`` (while its payload ``remaining`` is above 1, enqueues the next job of
  its chain with one less: a chain of 10 jobs is the peer of a 10-step run).
- ``client``: reads commands on stdin and answers each with one JSON line:
  ``batch KIND UNITS STEPS`` enqueues UNITS jobs (KIND ``single`` or ``chain``) in one
  ``enqueue`` call; ``each UNITS`` enqueues them one call at a time; both print the
  last job id before them, the epoch times of the first call and of the last commit,
  the client's CPU in µs a unit and the wall time of the calls in µs a unit.
- ``install``: installs PgQueuer's tables (once, before the timed processes).

Its database is ``PIKKU_BENCH_PGQUEUER_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

URL = os.environ.get(
    "PIKKU_BENCH_PGQUEUER_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_pgqueuer"
)
NOOP, CHAIN = "bench_noop", "bench_chain"


def settings(concurrency: int) -> dict[str, Any]:
    """The worker's ``run`` arguments at ``concurrency``."""
    return {"max_concurrent_tasks": max(2, concurrency), "batch_size": max(1, concurrency // 2)}


async def _connect() -> Any:
    import asyncpg

    return await asyncpg.connect(URL)


async def worker(concurrency: int) -> None:
    from pgqueuer import AsyncpgDriver, Job, QueueManager
    from pgqueuer.queries import Queries

    conn = await _connect()
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(NOOP)
    async def bench_noop(job: Job) -> None:
        return None

    @qm.entrypoint(CHAIN)
    async def bench_chain(job: Job) -> None:
        remaining = int(job.payload or b"1")
        if remaining > 1:
            await qm.queries.enqueue(CHAIN, str(remaining - 1).encode())

    print("ready", flush=True)
    await qm.run(dequeue_timeout=timedelta(seconds=30), **settings(concurrency))


async def client() -> None:
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await _connect()
    queries = Queries(AsyncpgDriver(conn))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        words = line.split()
        if not words or words[0] == "quit":
            break
        after = int(
            await conn.fetchval(
                "SELECT greatest((SELECT max(job_id) FROM pgqueuer_log), "
                "(SELECT max(id) FROM pgqueuer), 0)"
            )
        )
        if words[0] == "batch":
            kind, units, steps = words[1], int(words[2]), int(words[3])
            name = CHAIN if kind == "chain" else NOOP
            payload = str(steps).encode() if kind == "chain" else None
            began = time.time()
            cpu, wall = time.thread_time(), time.perf_counter()
            await queries.enqueue([name] * units, [payload] * units, [0] * units)
        else:
            units = int(words[1])
            began = time.time()
            cpu, wall = time.thread_time(), time.perf_counter()
            for _ in range(units):
                await queries.enqueue(NOOP, None)
        wall = time.perf_counter() - wall
        cpu = time.thread_time() - cpu
        out = {
            "after": after,
            "began": began,
            "committed": time.time(),
            "store_us": cpu * 1e6 / units,
            "call_us": wall * 1e6 / units,
        }
        print(json.dumps(out), flush=True)
    await conn.close()


async def install() -> None:
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await _connect()
    queries = Queries(AsyncpgDriver(conn))
    if not await conn.fetchval("SELECT to_regclass('pgqueuer') IS NOT NULL"):
        await queries.install()
    await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A PgQueuer process of benchmarks/throughput.py")
    parser.add_argument("command", choices=("worker", "client", "install"))
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    if args.command == "worker":
        asyncio.run(worker(args.concurrency))
    elif args.command == "client":
        asyncio.run(client())
    else:
        asyncio.run(install())
    return 0


if __name__ == "__main__":
    sys.exit(main())
