"""The systems ``benchmarks/throughput.py`` compares, behind one interface.

Each ``System`` starts its worker processes at a given concurrency, takes the same
untimed warm-up, and then measures:

- ``batch(kind, units, steps)``: ``units`` units of work stored at once (pikku runs in
  one transaction, Procrastinate jobs in one ``batch_defer``, DBOS workflows enqueued
  one by one with its client), timed from the moment the last is stored to the last
  one's completion as the database recorded it;
- ``one(steps)``: one unit at a time on an idle worker: the latency from the unit's
  row (a pikku run's ``created_at``, a Procrastinate job's ``deferred`` event, a DBOS
  workflow's ``created_at``: each written in the transaction that stores the unit) to
  its first step's start, and each gap between a step's end and the next step's start.

The kinds: ``Kind.CHAIN``, ``steps`` steps that each go through the system's queue
(pikku queued steps, a Procrastinate chain whose jobs each defer the next, a DBOS
workflow started on a ``Queue``); ``Kind.SINGLE``, one queued step (pikku) or one job
(Procrastinate); ``Kind.INLINE``, steps run where the workflow runs (pikku inline
steps, DBOS workflows called directly).
"""

from __future__ import annotations

import abc
import enum
import itertools
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from benchlib import BENCH_DIR, BenchError, Processes, pg_params, wait_for

QUEUED, INLINE = "bench.queued", "bench.inline"


class Kind(enum.Enum):
    CHAIN = "chain"
    SINGLE = "single"
    INLINE = "inline"


@dataclass
class Batch:
    """One timed batch: how many steps (or jobs) in how many seconds."""

    steps: int
    seconds: float
    #: CPU this process spent storing the batch, in µs a unit (run, chain or job); None
    #: where nothing is stored ahead (DBOS workflows called directly).
    store_us: float | None = None

    @property
    def per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Latency:
    """Per unit run alone: stored to first step (ms), and the gaps between steps (ms)."""

    first_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)

    def add(self, other: Latency) -> None:
        self.first_ms += other.first_ms
        self.gaps_ms += other.gaps_ms


class System(abc.ABC):
    """One configuration of one system, in worker processes this benchmark starts."""

    family: str
    kinds: tuple[Kind, ...]

    def __init__(self, key: str, label: str, procs: Processes, timeout: float) -> None:
        self.key, self.label, self.procs, self.timeout = key, label, procs, timeout
        self.names: list[str] = []

    def unavailable(self) -> str | None:
        """Why this system cannot run here, or None."""
        return None

    def database_url(self) -> str:
        """The database its work runs in."""
        return str(getattr(self, "url", None) or os.environ["PIKKU_BENCH_WORKFLOWS_URL"])

    def settings(self) -> dict[str, Any]:
        """How it is configured (for the report)."""
        return {}

    @abc.abstractmethod
    def start(self, concurrency: int, processes: int) -> None: ...

    @abc.abstractmethod
    def batch(self, kind: Kind, units: int, steps: int) -> Batch: ...

    @abc.abstractmethod
    def one(self, steps: int) -> Latency: ...

    def stop(self) -> None:
        for name in self.names:
            self.procs.stop(name)
        self.names = []

    def check_alive(self) -> None:
        self.procs.check_alive(*self.names)


# -- pikku ---------------------------------------------------------------------------------


class Pikku(System):
    family = "pikku"

    def __init__(
        self,
        key: str,
        label: str,
        procs: Processes,
        timeout: float,
        *,
        conn_max_age: int,
        carry: bool,
        carry_setting: str | None,
        poll: float,
        kinds: tuple[Kind, ...],
        integrations: bool = False,
    ) -> None:
        super().__init__(key, label, procs, timeout)
        self.conn_max_age, self.carry, self.carry_setting = conn_max_age, carry, carry_setting
        self.poll, self.kinds, self.integrations = poll, kinds, integrations

    def unavailable(self) -> str | None:
        if not self.carry and self.carry_setting is None:
            return "not available in this build (pikku_django.conf.DEFAULTS has no carry setting)"
        return None

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "CONN_MAX_AGE": self.conn_max_age,
            "WORKER_POLL_INTERVAL": self.poll,
            "other PIKKU keys": "documented defaults (benchmarks/bench_settings.py)",
        }
        if not self.carry and self.carry_setting is not None:
            out[f"PIKKU[{self.carry_setting!r}]"] = False
        if self.integrations:
            out["PIKKU['PROMETHEUS_METRICS']"] = out["PIKKU['SENTRY']"] = True
            out["PROMETHEUS_MULTIPROC_DIR"] = "a fresh directory per start"
            out["sentry_sdk.init"] = "default integrations, a transport that drops events"
        return out

    def start(self, concurrency: int, processes: int) -> None:
        env = {
            "PIKKU_BENCH_CONN_MAX_AGE": str(self.conn_max_age),
            "PIKKU_BENCH_CARRY": "1" if self.carry else "0",
            "PIKKU_BENCH_POLL": repr(self.poll),
        }
        if self.integrations:
            shared = self.procs.logdir / f"prometheus-{self.key}-c{concurrency}"
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir(parents=True)
            env |= {"PIKKU_BENCH_INTEGRATIONS": "1", "PROMETHEUS_MULTIPROC_DIR": str(shared)}
        for i in range(processes):
            name = f"{self.key}-c{concurrency}-{i}"
            self.procs.start(
                name,
                [
                    *(sys.executable, "-m", "django", "pikku_worker"),
                    *("--concurrency", str(concurrency)),
                ],
                env=env,
            )
            self.names.append(name)

    def batch(self, kind: Kind, units: int, steps: int) -> Batch:
        workflow = INLINE if kind is Kind.INLINE else QUEUED
        cpu = time.thread_time()
        ids, committed = start_runs(workflow, units, 1 if kind is Kind.SINGLE else steps)
        store_us = (time.thread_time() - cpu) * 1e6 / units
        self.wait(ids)
        n = units * (1 if kind is Kind.SINGLE else steps)
        return Batch(n, pikku_end(ids) - committed, store_us)

    def one(self, steps: int) -> Latency:
        ids, _ = start_runs(QUEUED, 1, steps)
        self.wait(ids, every=0.005)
        return pikku_latency(ids)

    def wait(self, ids: list[Any], every: float = 0.05) -> None:
        from pikku_django.models import RunStatus, WorkflowRun

        def done() -> bool:
            self.check_alive()
            counts = Counter(
                WorkflowRun.objects.filter(id__in=ids).values_list("status", flat=True).iterator()
            )
            bad = {
                s: n for s, n in counts.items() if s not in (RunStatus.RUNNING, RunStatus.COMPLETED)
            }
            if bad:
                raise BenchError(f"{self.label}: runs ended {bad}")
            return counts[RunStatus.COMPLETED] == len(ids)

        wait_for(done, self.timeout, f"{self.label}: {len(ids)} runs", every=every)


def start_runs(workflow: str, runs: int, steps: int) -> tuple[list[Any], float]:
    """Create ``runs`` runs in one transaction; their ids and the commit's epoch time."""
    return start_runs_with(workflow, runs, {"steps": steps})


def start_runs_with(workflow: str, runs: int, input: dict[str, Any]) -> tuple[list[Any], float]:
    from django.db import transaction

    from pikku_django.workflows import WorkflowEngine

    engine = WorkflowEngine()
    with transaction.atomic():
        ids = [engine.start(workflow, input).id for _ in range(runs)]
    return ids, time.time()


def pikku_end(ids: list[Any]) -> float:
    from django.db.models import Max

    from pikku_django.models import WorkflowRun

    end = WorkflowRun.objects.filter(id__in=ids).aggregate(end=Max("updated_at"))["end"]
    return end.timestamp()


def pikku_latency(ids: list[Any]) -> Latency:
    """From each run's row (written in the transaction that stored it) to its first
    step's start, and from each step's end to the next one's start."""
    from pikku_django.models import StepAttempt

    rows = (
        StepAttempt.objects.filter(step__run_id__in=ids, step__kind="queued", attempt=1)
        .order_by("step__run_id", "started_at")
        .values_list("step__run_id", "started_at", "finished_at", "step__run__created_at")
    )
    out, last = Latency(), (None, None)
    for run_id, started, finished, created in rows.iterator():
        if run_id != last[0]:
            out.first_ms.append((started - created).total_seconds() * 1000)
        elif last[1] is not None:
            out.gaps_ms.append((started - last[1]).total_seconds() * 1000)
        last = (run_id, finished)
    return out


# -- Procrastinate -------------------------------------------------------------------------


class Procrastinate(System):
    family = "procrastinate"
    kinds = (Kind.CHAIN, Kind.SINGLE)

    def __init__(
        self,
        key: str,
        label: str,
        procs: Processes,
        timeout: float,
        url: str,
        *,
        worker_url: str | None = None,
        poll: float | None = None,
    ) -> None:
        """Jobs are deferred and read on ``url``; the workers connect through
        ``worker_url`` (``url`` unless given). With ``poll``, the workers do not LISTEN
        and look for jobs every ``poll`` seconds, and psycopg prepares nothing: what
        Procrastinate and psycopg advise behind a transaction pooler."""
        super().__init__(key, label, procs, timeout)
        self.url, self.worker_url, self.poll = url, worker_url or url, poll
        self.app: Any = None
        self.pool = 0

    def unavailable(self) -> str | None:
        try:
            import procrastinate  # noqa: F401
        except ImportError:
            return 'not installed (pip install -e ".[bench]")'
        return None

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pool_size": "concurrency + 1",
            "listen_notify": self.poll is None,
            "task": "async no-op",
        }
        if self.poll is not None:
            out |= {"fetch_job_polling_interval": self.poll, "prepare_threshold": None}
        return out

    def start(self, concurrency: int, processes: int) -> None:
        from throughput_baselines import procrastinate_app

        self.app = procrastinate_app
        self.pool = concurrency + 1
        for i in range(processes):
            name = f"{self.key}-c{concurrency}-{i}"
            self.procs.start(
                name,
                [
                    *(sys.executable, "-m", "procrastinate"),
                    *("--app=throughput_baselines.procrastinate_app", "--log-level", "warning"),
                    *("worker", "--concurrency", str(concurrency)),
                    *(
                        ()
                        if self.poll is None
                        else ("--no-listen-notify", "--fetch-job-polling-interval", str(self.poll))
                    ),
                ],
                env={
                    "PIKKU_BENCH_PROCRASTINATE_POOL": str(self.pool),
                    "PIKKU_BENCH_PROCRASTINATE_URL": self.worker_url,
                    "PIKKU_BENCH_PROCRASTINATE_PREPARE": "1" if self.poll is None else "0",
                },
            )
            self.names.append(name)

    def _sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(autocommit=True, **pg_params(self.url)) as conn:
            return conn.execute(query, params).fetchall()

    def _defer(self, kind: Kind, units: int, steps: int) -> tuple[int, int, float, float]:
        """Defer a batch: the last job id before it, the jobs it makes, the commit's
        epoch time, and the CPU of the defer call in µs a unit."""
        after = int(self._sql("SELECT coalesce(max(id), 0) FROM procrastinate_jobs")[0][0])
        with self.app.open():
            cpu = time.thread_time()
            if kind is Kind.CHAIN:
                self.app.tasks["bench_chain"].batch_defer(
                    *({"remaining": steps} for _ in range(units))
                )
                jobs = units * steps
            else:
                self.app.tasks["bench_noop"].batch_defer(*({} for _ in range(units)))
                jobs = units
            store_us = (time.thread_time() - cpu) * 1e6 / units
        return after, jobs, time.time(), store_us

    def _wait(self, after: int, jobs: int, every: float = 0.05) -> None:
        def done() -> bool:
            self.check_alive()
            ok, failed = self._sql(
                "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
                "count(*) FILTER (WHERE status NOT IN ('todo', 'doing', 'succeeded')) "
                "FROM procrastinate_jobs WHERE id > %s",
                (after,),
            )[0]
            if failed:
                raise BenchError(f"{failed} Procrastinate jobs failed")
            return ok >= jobs

        wait_for(done, self.timeout, f"{self.label}: {jobs} jobs", every=every)

    def batch(self, kind: Kind, units: int, steps: int) -> Batch:
        after, jobs, committed, store_us = self._defer(kind, units, steps)
        self._wait(after, jobs)
        end = self._sql(
            "SELECT extract(epoch FROM max(at)) FROM procrastinate_events "
            "WHERE type = 'succeeded' AND job_id > %s",
            (after,),
        )[0][0]
        return Batch(jobs, float(end) - committed, store_us)

    def one(self, steps: int) -> Latency:
        after, jobs, _, _ = self._defer(Kind.CHAIN, 1, steps)
        self._wait(after, jobs, every=0.005)
        rows = self._sql(
            "SELECT j.id, extract(epoch FROM s.at), extract(epoch FROM e.at), "
            "extract(epoch FROM d.at) FROM procrastinate_jobs j "
            "JOIN procrastinate_events d ON d.job_id = j.id AND d.type = 'deferred' "
            "JOIN procrastinate_events s ON s.job_id = j.id AND s.type = 'started' "
            "JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'succeeded' "
            "WHERE j.id > %s ORDER BY j.id",
            (after,),
        )
        # From the head job's deferred event (written as it was stored) to its start.
        out = Latency(first_ms=[(float(rows[0][1]) - float(rows[0][3])) * 1000])
        # A chain's next job is deferred as the last act of the job before it, which may
        # be recorded as succeeded only after the next one started: the gap is from the
        # next job's deferral to its start.
        for nxt in rows[1:]:
            out.gaps_ms.append((float(nxt[1]) - float(nxt[3])) * 1000)
        return out


# -- DBOS ----------------------------------------------------------------------------------


class Dbos(System):
    family = "dbos"
    kinds = (Kind.CHAIN, Kind.INLINE)

    def __init__(self, key: str, label: str, procs: Processes, timeout: float, url: str) -> None:
        super().__init__(key, label, procs, timeout)
        self.url = url
        self.client: Any = None

    def unavailable(self) -> str | None:
        try:
            import dbos  # noqa: F401
        except ImportError:
            return 'not installed (pip install -e ".[bench]")'
        return None

    def settings(self) -> dict[str, Any]:
        from throughput_baselines import DBOS_POLL

        return {
            "queue": "DBOS.register_queue('bench', worker_concurrency=concurrency, "
            f"polling_interval_sec={DBOS_POLL})",
            "executor_id": "one per process",
            "direct": "workflows called on concurrency threads",
        }

    def start(self, concurrency: int, processes: int) -> None:
        from dbos import DBOSClient
        from throughput_baselines import dbos_url

        for i in range(processes):
            name = f"{self.key}-c{concurrency}-{i}"
            self.procs.start(
                name,
                [
                    *(sys.executable, str(BENCH_DIR / "throughput_baselines.py"), "dbos"),
                    *("--concurrency", str(concurrency)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            self.names.append(name)
        for name in self.names:
            while self._read(name, f"{name} to launch") != "ready":
                pass  # what it prints before it is ready
        if self.client is None:
            self.client = DBOSClient(system_database_url=dbos_url(self.url))

    def stop(self) -> None:
        for name in self.names:
            proc = self.procs.procs.get(name)
            if proc is not None and proc.stdin is not None and proc.poll() is None:
                try:
                    proc.stdin.write(b"quit\n")
                    proc.stdin.flush()
                    proc.wait(20)
                except (BrokenPipeError, subprocess.TimeoutExpired):
                    pass
        super().stop()

    def close(self) -> None:
        if self.client is not None:
            self.client.destroy()
            self.client = None

    def _read(self, name: str, what: str) -> str:
        proc = self.procs.procs[name]
        assert proc.stdout is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                line = proc.stdout.readline().decode()
                if not line:
                    raise BenchError(f"{what}: the DBOS process exited ({proc.poll()})")
                return line.strip()
        raise BenchError(f"timed out after {self.timeout:g}s waiting for {what}")

    def _sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(autocommit=True, **pg_params(self.url)) as conn:
            return conn.execute(query, params).fetchall()

    def _enqueue(self, units: int, steps: int) -> tuple[list[str], float]:
        from throughput_baselines import DBOS_QUEUE, DBOS_WORKFLOW

        options = {"queue_name": DBOS_QUEUE, "workflow_name": DBOS_WORKFLOW}
        ids = [self.client.enqueue(options, steps).workflow_id for _ in range(units)]
        return ids, time.time()

    def _wait(self, ids: list[str], every: float = 0.05) -> None:
        def done() -> bool:
            self.check_alive()
            ok, bad = self._sql(
                "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), "
                "count(*) FILTER (WHERE status NOT IN ('ENQUEUED', 'PENDING', 'SUCCESS')) "
                "FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)",
                (ids,),
            )[0]
            if bad:
                raise BenchError(f"{bad} DBOS workflows failed")
            return ok == len(ids)

        wait_for(done, self.timeout, f"{self.label}: {len(ids)} workflows", every=every)

    def batch(self, kind: Kind, units: int, steps: int) -> Batch:
        if kind is Kind.INLINE:
            return self._direct(units, steps)
        cpu = time.thread_time()
        ids, committed = self._enqueue(units, steps)
        store_us = (time.thread_time() - cpu) * 1e6 / units
        self._wait(ids)
        end = self._sql(
            "SELECT max(updated_at) FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)",
            (ids,),
        )[0][0]
        return Batch(units * steps, int(end) / 1000 - committed, store_us)

    def _direct(self, units: int, steps: int) -> Batch:
        n = len(self.names)
        shares = [units // n + (1 if i < units % n else 0) for i in range(n)]
        started = time.time()
        for name, share in zip(self.names, shares, strict=True):
            stdin = self.procs.procs[name].stdin
            assert stdin is not None
            stdin.write(f"direct {share} {steps}\n".encode())
            stdin.flush()
        ends = [json.loads(self._read(name, f"{name} to finish"))["end"] for name in self.names]
        return Batch(units * steps, max(ends) - started)

    def one(self, steps: int) -> Latency:
        ids, _ = self._enqueue(1, steps)
        self._wait(ids, every=0.005)
        rows = self._sql(
            "SELECT started_at_epoch_ms, completed_at_epoch_ms FROM dbos.operation_outputs "
            "WHERE workflow_uuid = %s ORDER BY function_id",
            (ids[0],),
        )
        created = self._sql(
            "SELECT created_at FROM dbos.workflow_status WHERE workflow_uuid = %s", (ids[0],)
        )[0][0]
        # From the workflow's row (written as it was enqueued) to its first step's start.
        out = Latency(first_ms=[float(rows[0][0]) - float(created)])
        for prev, nxt in itertools.pairwise(rows):
            out.gaps_ms.append(float(nxt[0]) - float(prev[1]))
        return out


def dbos_init(url: str) -> None:
    """Launch DBOS once so its system database is migrated before the timed processes."""
    code = subprocess.call(
        [sys.executable, str(BENCH_DIR / "throughput_baselines.py"), "dbos-init"],
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
    )
    if code:
        raise BenchError(f"DBOS would not launch (exit {code})")
