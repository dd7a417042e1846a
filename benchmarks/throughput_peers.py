"""PgQueuer beside the other systems of ``benchmarks/throughput.py``, and the pairings
that only it has: its batch enqueue of many jobs in one call against pikku starting
runs one by one (the bulk pairing), and one enqueue call against one
``start_workflow`` call from the same client.

PgQueuer runs in processes of a Python >= 3.12 (``throughput_pgqueuer.py`` says how
to install it); this module drives them from the benchmark's process.
"""

from __future__ import annotations

import glob
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchlib import BENCH_DIR, BenchError, Processes, ensure_database, pg_params, wait_for
from throughput_systems import Batch, Kind, Latency, System

PGQUEUER_URL = os.environ.get(
    "PIKKU_BENCH_PGQUEUER_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_pgqueuer"
)
SCRIPT = str(BENCH_DIR / "throughput_pgqueuer.py")
CANDIDATES = (
    "python3.13",
    "python3.12",
    *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[3-9]*/bin/python")), reverse=True),
    *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python")), reverse=True),
)


def python_latest() -> tuple[str | None, str]:
    """A Python >= 3.12 that imports pgqueuer and asyncpg, or None and why not."""
    given = os.environ.get("PIKKU_BENCH_PYTHON_LATEST")
    for candidate in [given] if given else CANDIDATES:
        path = shutil.which(candidate) or candidate
        try:
            ok = subprocess.run(
                [path, "-c", "import sys, pgqueuer, asyncpg; sys.exit(sys.version_info < (3, 12))"],
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if ok.returncode == 0:
            return path, ""
    return None, (
        "needs a Python >= 3.12 with pgqueuer and asyncpg: set PIKKU_BENCH_PYTHON_LATEST "
        '(e.g. python3.13 -m venv /tmp/pgq && /tmp/pgq/bin/pip install "pgqueuer>=1.6" asyncpg)'
    )


def worker_cpu_s(procs: Processes, names: list[str]) -> float:
    """User and system CPU seconds the named worker processes have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for name in names:
        proc = procs.procs.get(name)
        if proc is None:
            continue
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


class PgQueuer(System):
    family = "pgqueuer"
    kinds = (Kind.CHAIN, Kind.SINGLE)

    def __init__(self, key: str, label: str, procs: Processes, timeout: float, url: str) -> None:
        super().__init__(key, label, procs, timeout)
        self.url = url
        self.python, self.why = python_latest()
        self.client_name = ""
        #: The client's answer for the last batch (its start, calls and commit).
        self.last: dict[str, Any] = {}

    def unavailable(self) -> str | None:
        return None if self.python else self.why

    def settings(self) -> dict[str, Any]:
        return {
            "driver": "asyncpg (one connection per process)",
            "run": "max_concurrent_tasks=concurrency, batch_size=concurrency // 2 "
            "(the largest PgQueuer allows), dequeue_timeout=30 s",
            "listen_notify": True,
            "task": "async no-op; a chain's job enqueues the next",
            "python": self.python,
        }

    def install(self) -> None:
        assert self.python
        ensure_database(self.url)
        env = {**os.environ, "PIKKU_BENCH_PGQUEUER_URL": self.url}
        if subprocess.call([self.python, SCRIPT, "install"], env=env):
            raise BenchError("PgQueuer would not install its tables")

    def clear(self) -> None:
        import psycopg

        with psycopg.connect(autocommit=True, **pg_params(self.url)) as conn:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def start(self, concurrency: int, processes: int) -> None:
        assert self.python
        env = {"PIKKU_BENCH_PGQUEUER_URL": self.url}
        for i in range(processes):
            name = f"{self.key}-c{concurrency}-{i}"
            self.procs.start(
                name,
                [self.python, SCRIPT, "worker", "--concurrency", str(concurrency)],
                env=env,
                stdout=subprocess.PIPE,
            )
            self.names.append(name)
            self._read(name, f"{name} to start")
        self.client_name = f"{self.key}-client-c{concurrency}"
        self.procs.start(
            self.client_name,
            [self.python, SCRIPT, "client"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._read(self.client_name, "the PgQueuer client to start")

    def stop(self) -> None:
        if self.client_name:
            self._command("quit", expect=False)
            self.procs.stop(self.client_name)
            self.client_name = ""
        super().stop()

    def _read(self, name: str, what: str) -> str:
        proc = self.procs.procs[name]
        assert proc.stdout is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline().decode()
                if not line:
                    raise BenchError(f"{what}: it exited ({proc.poll()}):\n{self.procs.tail(name)}")
                return line.strip()
        raise BenchError(f"timed out after {self.timeout:g}s waiting for {what}")

    def _command(self, line: str, expect: bool = True) -> dict[str, Any]:
        proc = self.procs.procs.get(self.client_name)
        if proc is None or proc.stdin is None or proc.poll() is not None:
            if expect:
                raise BenchError("the PgQueuer client is not running")
            return {}
        try:
            proc.stdin.write(f"{line}\n".encode())
            proc.stdin.flush()
        except BrokenPipeError:
            if expect:
                raise
            return {}
        return json.loads(self._read(self.client_name, line)) if expect else {}

    def _sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(autocommit=True, **pg_params(self.url)) as conn:
            return conn.execute(query, params).fetchall()

    def _wait(self, after: int, jobs: int, every: float = 0.05) -> float:
        """Wait for ``jobs`` successful jobs with ids above ``after``; the last one's end."""

        def done() -> bool:
            self.check_alive()
            ok, failed = self._sql(
                "SELECT count(*) FILTER (WHERE status = 'successful'), "
                "count(*) FILTER (WHERE status IN ('exception', 'canceled')) "
                "FROM pgqueuer_log WHERE job_id > %s",
                (after,),
            )[0]
            if failed:
                raise BenchError(f"{failed} PgQueuer jobs failed")
            return ok >= jobs

        wait_for(done, self.timeout, f"{self.label}: {jobs} jobs", every=every)
        end = self._sql(
            "SELECT extract(epoch FROM max(created)) FROM pgqueuer_log "
            "WHERE status = 'successful' AND job_id > %s",
            (after,),
        )[0][0]
        return float(end)

    def batch(self, kind: Kind, units: int, steps: int) -> Batch:
        out = self.last = self._command(f"batch {kind.value} {units} {steps}")
        jobs = units * (steps if kind is Kind.CHAIN else 1)
        end = self._wait(out["after"], jobs)
        return Batch(jobs, end - out["committed"], out["store_us"])

    def one_by_one(self, units: int) -> tuple[Batch, float]:
        """``units`` single jobs, one enqueue call each; the batch and µs a call."""
        out = self.last = self._command(f"each {units}")
        end = self._wait(out["after"], units)
        return Batch(units, end - out["committed"], out["store_us"]), out["call_us"]

    def one(self, steps: int) -> Latency:
        out = self._command(f"batch chain 1 {steps}")
        self._wait(out["after"], steps, every=0.005)
        rows = self._sql(
            "SELECT job_id, status::text, extract(epoch FROM created) FROM pgqueuer_log "
            "WHERE job_id > %s ORDER BY job_id, created",
            (out["after"],),
        )
        by_job: dict[int, dict[str, float]] = {}
        for job_id, status, at in rows:
            by_job.setdefault(job_id, {})[status] = float(at)
        jobs = [by_job[j] for j in sorted(by_job)]
        # From each job's queued row to its pick (PgQueuer logs no start of its own).
        lat = Latency(first_ms=[(jobs[0]["picked"] - jobs[0]["queued"]) * 1000])
        lat.gaps_ms = [(j["picked"] - j["queued"]) * 1000 for j in jobs[1:] if "picked" in j]
        return lat
