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


def python_latest(*modules: str) -> tuple[str | None, str]:
    """A Python >= 3.12 that imports ``modules`` (pgqueuer and asyncpg), or None and why."""
    modules = modules or ("pgqueuer", "asyncpg")
    given = os.environ.get("PIKKU_BENCH_PYTHON_LATEST")
    for candidate in [given] if given else CANDIDATES:
        path = shutil.which(candidate) or candidate
        try:
            ok = subprocess.run(
                [
                    path,
                    "-c",
                    f"import sys, {', '.join(modules)}; sys.exit(sys.version_info < (3, 12))",
                ],
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if ok.returncode == 0:
            return path, ""
    return None, (
        f"needs a Python >= 3.12 with {' and '.join(modules)}: set PIKKU_BENCH_PYTHON_LATEST "
        "(e.g. python3.13 -m venv /tmp/peers && /tmp/peers/bin/pip install "
        '"pgqueuer>=1.6" asyncpg "django-absurd>=1.0")'
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
    script = SCRIPT

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

    def env(self) -> dict[str, str]:
        return {"PIKKU_BENCH_PGQUEUER_URL": self.url}

    def install(self) -> None:
        assert self.python
        ensure_database(self.url)
        if subprocess.call([self.python, self.script, "install"], env={**os.environ, **self.env()}):
            raise BenchError("PgQueuer would not install its tables")

    def clear(self) -> None:
        import psycopg

        with psycopg.connect(autocommit=True, **pg_params(self.url)) as conn:
            conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def start(self, concurrency: int, processes: int) -> None:
        assert self.python
        env = self.env()
        for i in range(processes):
            name = f"{self.key}-c{concurrency}-{i}"
            self.procs.start(
                name,
                [self.python, self.script, "worker", "--concurrency", str(concurrency)],
                env=env,
                stdout=subprocess.PIPE if self.script == SCRIPT else None,
            )
            self.names.append(name)
            if self.script == SCRIPT:
                self._read(name, f"{name} to start")
        self.client_name = f"{self.key}-client-c{concurrency}"
        self.procs.start(
            self.client_name,
            [self.python, self.script, "client"],
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


ABSURD_URL = os.environ.get(
    "PIKKU_BENCH_ABSURD_URL", "postgres://postgres@127.0.0.1:5432/pikku_bench_absurd"
)
ABSURD_SCRIPT = str(BENCH_DIR / "throughput_absurd.py")


class DjangoAbsurd(PgQueuer):
    """django-absurd: 1-step tasks and tasks of ``steps`` ``context.step`` calls, in
    processes of a Python >= 3.12 with Django >= 6.0 (``throughput_absurd.py``)."""

    family = "absurd"
    script = ABSURD_SCRIPT

    def __init__(self, key: str, label: str, procs: Processes, timeout: float, url: str) -> None:
        super().__init__(key, label, procs, timeout, url)
        self.python, self.why = python_latest("django_absurd")

    def settings(self) -> dict[str, Any]:
        return {
            "worker": "manage.py absurd_worker --concurrency N (documented defaults: "
            "--batch-size N, --poll-interval 0.25 s; Absurd polls, no LISTEN/NOTIFY)",
            "tasks": "django.tasks @task; the 10-step kind is one task of 10 context.step calls",
            "enqueue": "one Task.enqueue per unit (django.tasks has no bulk), in one transaction",
            "python": self.python,
        }

    def env(self) -> dict[str, str]:
        return {"PIKKU_BENCH_ABSURD_URL": self.url}

    def install(self) -> None:
        assert self.python
        ensure_database(self.url)
        if subprocess.call([self.python, self.script, "migrate"], env={**os.environ, **self.env()}):
            raise BenchError("django-absurd would not migrate")

    def clear(self) -> None:
        import psycopg

        with psycopg.connect(autocommit=True, **pg_params(self.url)) as conn:
            conn.execute(
                "TRUNCATE absurd.t_default, absurd.r_default, absurd.c_default, "
                "absurd.e_default, absurd.w_default"
            )

    def _wait_ids(self, ids: list[str], every: float = 0.05) -> float:
        uuids = [i.rsplit(":", 1)[-1] for i in ids]

        def done() -> bool:
            self.check_alive()
            ok, failed = self._sql(
                "SELECT count(*) FILTER (WHERE state = 'completed'), "
                "count(*) FILTER (WHERE state IN ('failed', 'cancelled')) "
                "FROM absurd.t_default WHERE task_id = ANY(%s::uuid[])",
                (uuids,),
            )[0]
            if failed:
                raise BenchError(f"{failed} django-absurd tasks failed")
            return ok == len(uuids)

        wait_for(done, self.timeout, f"{self.label}: {len(ids)} tasks", every=every)
        end = self._sql(
            "SELECT extract(epoch FROM max(completed_at)) FROM absurd.r_default "
            "WHERE task_id = ANY(%s::uuid[])",
            (uuids,),
        )[0][0]
        return float(end)

    def batch(self, kind: Kind, units: int, steps: int) -> Batch:
        out = self.last = self._command(f"batch {kind.value} {units} {steps}")
        end = self._wait_ids(out["ids"])
        n = units * (steps if kind is Kind.CHAIN else 1)
        return Batch(n, end - out["committed"], out["store_us"])

    def one(self, steps: int) -> Latency:
        out = self._command(f"batch chain 1 {steps}")
        self._wait_ids(out["ids"], every=0.005)
        uuid = out["ids"][0].rsplit(":", 1)[-1]
        first = self._sql(
            "SELECT extract(epoch FROM min(r.started_at) - t.enqueue_at) FROM absurd.t_default t "
            "JOIN absurd.r_default r USING (task_id) WHERE t.task_id = %s::uuid "
            "GROUP BY t.enqueue_at",
            (uuid,),
        )[0][0]
        # Absurd's steps run inside the task, with no queue between them: no gaps.
        return Latency(first_ms=[float(first) * 1000])
