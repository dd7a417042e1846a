"""Crash recovery: how long a step waits after its worker is SIGKILLed mid-step.

It measures, on PostgreSQL with real ``pikku_worker`` processes, the time from
SIGKILL of the worker running a step to that step's completion by another
worker, next to the step lease (``PIKKU["STEP_LEASE_MS"]``, 5 s by default).
Target: at most lease + 1 s.

Each trial:

1. starts a run of a one-step workflow (``benchmarks/recovery_app``) whose step
   blocks on its first attempt and returns at once on any later one (a marker
   file tells them apart);
2. starts worker A (``python -m django pikku_worker --concurrency 1 --queue
   bench-recovery``, the step's queue) and waits until the step's first attempt
   has started in it;
3. after a random delay of up to one worker poll interval (so the lease lapse
   falls at a random point between two of B's polls), starts worker B and
   waits until it has logged its start line, plus ``--settle`` seconds, so B's
   start-up is not counted;
4. with ``--kill-at renewal`` (the default) waits until A's lease renewal lands
   in the database, so the whole lease is left at the kill: the worst case.
   A renews every half lease, so a kill at a random moment would leave between
   half and all of the lease; ``--kill-at ready`` kills at once instead;
5. SIGKILLs A and polls the database every ``--poll-db`` seconds (20 ms) until
   the step has succeeded and the run has completed; then SIGTERMs B.

Reported per trial: kill -> step succeeded and kill -> run completed (both from
the polling, so up to one database poll late), the step's attempt number (must
be 2, by B), the lease left at the kill, and a breakdown from the rows' own
timestamps: lease lapse -> attempt 2 claimed, claimed -> step succeeded,
step succeeded -> run completed. (The lease is judged on PostgreSQL's clock and
the attempt and run stamps on the workers' clock: the same clock when the
server runs on this host.) "met" compares the worst trial with the target.

Run it from the repository root, once ``make test`` (or ``make bench``) has
made ``.venv``:

    .venv/bin/python benchmarks/recovery.py
    .venv/bin/python benchmarks/recovery.py --trials 10 --lease-ms 2000

Options: ``--trials 5``, ``--lease-ms 5000``, ``--worker-poll 0.1`` (the workers'
``PIKKU["WORKER_POLL_INTERVAL"]``, seconds), ``--kill-at renewal|ready``,
``--settle 1.0``, ``--poll-db 0.02``, ``--timeout 60`` (per wait). A default run
takes about 45 s. The database comes from ``PIKKU_BENCH_POSTGRES_URL`` (default
postgres://postgres@127.0.0.1:5432/pikku_bench); it is created when missing and
pikku_django is migrated into it. Runs this benchmark left behind earlier are
deleted first. Progress goes to stderr; stdout gets the table and, as its last
line, one JSON object with every figure and the machine, Python, Django and
PostgreSQL versions. Worker processes are stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import dj_database_url
from benchlib import terminate

log = logging.getLogger("pikku.bench.recovery")

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
SETTINGS = "recovery_settings"
WORKFLOW = "bench_recovery.blocked"
QUEUE = "bench-recovery"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pikku_bench"
URL = os.environ.get("PIKKU_BENCH_POSTGRES_URL", DEFAULT_URL)
START_LINE = "thread(s), queues"  # pikku_worker's "up and serving" log line
MARGIN_S = 1.0  # the target is the lease plus this


class TrialError(RuntimeError):
    """A trial did not reach the state it waited for."""


# -- worker processes ---------------------------------------------------------------------


class Workers:
    """The pikku_worker processes this script started, each logging to its own file."""

    def __init__(self, logdir: Path, env: dict[str, str]) -> None:
        self.logdir = logdir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> subprocess.Popen[bytes]:
        logfile = self.log_path(name)
        with logfile.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "django",
                    "pikku_worker",
                    "--concurrency",
                    "1",
                    "--queue",
                    QUEUE,
                ],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own session: a Ctrl-C on the terminal reaches this script only,
                # which then stops the workers itself.
                start_new_session=True,
            )
        self.procs[name] = proc
        log.info("  started worker %s (pid %d)", name, proc.pid)
        return proc

    def log_path(self, name: str) -> Path:
        return self.logdir / f"worker-{name}.log"

    def output(self, name: str) -> str:
        try:
            return self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, name: str, lines: int = 15) -> str:
        return "\n".join(self.output(name).splitlines()[-lines:])

    def stop(self, name: str, timeout: float = 10.0) -> int | None:
        """SIGTERM (then again, which hands work back, then SIGKILL); its exit code."""
        proc = self.procs.get(name)
        if proc is None:
            return None
        return terminate(proc, f"worker {name}", timeout)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name, timeout=5.0)


# -- one trial --------------------------------------------------------------------------------


@dataclass
class Trial:
    trial: int
    kill_to_step_succeeded_s: float
    kill_to_run_completed_s: float
    attempt: int
    completed_by_worker_b: bool
    lease_left_at_kill_s: float
    lapse_to_claim_s: float
    claim_to_step_succeeded_s: float
    step_succeeded_to_run_completed_s: float
    worker_b_exit_code: int | None


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TrialError(f"timed out after {timeout:g}s waiting for {what}")


def epoch_ms(dt: Any) -> float:
    return dt.timestamp() * 1000.0


def run_trial(index: int, args: argparse.Namespace, workers: Workers, tmp: Path) -> Trial:
    from pikku_django.dbclock import store_now_ms
    from pikku_django.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
    from pikku_django.workflows import WorkflowEngine

    engine = WorkflowEngine("default")
    marker = tmp / f"started-{index}"
    run = engine.start(WORKFLOW, {"started": str(marker), "block": 600})
    a_name, b_name = f"A{index}", f"B{index}"

    def alive(name: str) -> None:
        proc = workers.procs[name]
        if proc.poll() is not None:
            raise TrialError(f"worker {name} exited with {proc.returncode}:\n{workers.tail(name)}")

    a = workers.start(a_name)

    def a_started() -> bool:
        alive(a_name)
        return marker.exists() and marker.read_text().strip() != ""

    wait_for(a_started, args.timeout, "worker A to start the step's first attempt")
    if int(marker.read_text()) != a.pid:
        raise TrialError(f"the first attempt ran in pid {marker.read_text()}, not in A ({a.pid})")
    step = WorkflowStep.objects.get(run_id=run.id, name="work")
    log.info("  step started in A (attempt %d)", step.attempt)

    # B's polls keep the phase its start gives them; a random delay makes where the
    # lease lapse falls between two of B's polls random too, rather than fixed by
    # this script's timings.
    time.sleep(random.uniform(0, args.worker_poll))
    b = workers.start(b_name)

    def b_up() -> bool:
        alive(b_name)
        return START_LINE in workers.output(b_name)

    wait_for(b_up, args.timeout, "worker B's start line")
    time.sleep(args.settle)
    alive(b_name)
    alive(a_name)

    def lease() -> int:
        return WorkflowStep.objects.filter(id=step.id).values_list("lease_expires_at", flat=True)[0]

    if args.kill_at == "renewal":
        before = lease()
        wait_for(
            lambda: lease() > before,
            args.lease_ms / 1000 + args.timeout,
            "A to renew the step lease",
            every=0.002,
        )
    expires_at = lease()
    os.kill(a.pid, signal.SIGKILL)
    killed = time.monotonic()
    killed_db_ms = store_now_ms("default")
    a.wait()
    log.info("  SIGKILLed A; lease left %.3f s; waiting for B", (expires_at - killed_db_ms) / 1000)

    step_done: float | None = None
    run_done: float | None = None
    deadline = killed + args.lease_ms / 1000 + args.timeout
    while run_done is None:
        now = time.monotonic()
        if now > deadline:
            raise TrialError(
                f"the run did not complete within {deadline - killed:.0f}s of the kill:\n"
                + workers.tail(b_name)
            )
        status, run_status = WorkflowStep.objects.filter(id=step.id).values_list(
            "status", "run__status"
        )[0]
        seen = time.monotonic()
        if step_done is None and status == StepStatus.SUCCEEDED:
            step_done = seen - killed
        if run_status == RunStatus.COMPLETED:
            run_done = seen - killed
            if step_done is None:
                step_done = run_done
        elif run_status != RunStatus.RUNNING:
            raise TrialError(f"the run ended {run_status}:\n{workers.tail(b_name)}")
        time.sleep(max(0.0, args.poll_db - (time.monotonic() - now)))

    b_code = workers.stop(b_name)
    step.refresh_from_db()
    run_row = WorkflowRun.objects.get(id=run.id)
    second = step.attempts.filter(attempt=step.attempt).get()
    claimed_ms = epoch_ms(second.started_at)
    finished_ms = epoch_ms(second.finished_at)
    trial = Trial(
        trial=index,
        kill_to_step_succeeded_s=round(step_done, 4),
        kill_to_run_completed_s=round(run_done, 4),
        attempt=step.attempt,
        completed_by_worker_b=(step.result or {}).get("pid") == b.pid,
        lease_left_at_kill_s=round((expires_at - killed_db_ms) / 1000, 4),
        lapse_to_claim_s=round((claimed_ms - expires_at) / 1000, 4),
        claim_to_step_succeeded_s=round((finished_ms - claimed_ms) / 1000, 4),
        step_succeeded_to_run_completed_s=round(
            (epoch_ms(run_row.updated_at) - finished_ms) / 1000, 4
        ),
        worker_b_exit_code=b_code,
    )
    log.info(
        "  step succeeded %.3f s and run completed %.3f s after the kill (attempt %d)",
        trial.kill_to_step_succeeded_s,
        trial.kill_to_run_completed_s,
        trial.attempt,
    )
    return trial


# -- set-up -----------------------------------------------------------------------------------


def ensure_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    db = dj_database_url.parse(url)
    params: dict[str, Any] = {
        key: db[field]
        for key, field in (("host", "HOST"), ("port", "PORT"), ("user", "USER"))
        if db.get(field)
    }
    if db.get("PASSWORD"):
        params["password"] = db["PASSWORD"]
    with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5, **params) as admin:
        found = admin.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (db["NAME"],)
        ).fetchone()
        if found is None:
            log.info("creating database %s", db["NAME"])
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))


def setup_django() -> str:
    """Configure Django from recovery_settings, migrate, clear old runs; the server version."""
    import django
    from django.core.management import call_command
    from django.db import connection

    django.setup()
    logging.getLogger("pikku_django").setLevel(logging.WARNING)
    call_command("migrate", "pikku_django", verbosity=0)

    from pikku_django.models import RunStatus, WorkflowRun

    deleted, _ = WorkflowRun.objects.filter(workflow=WORKFLOW).delete()
    if deleted:
        log.info("deleted %d rows this benchmark left behind earlier", deleted)
    others = WorkflowRun.objects.filter(status=RunStatus.RUNNING).count()
    if others:
        log.warning(
            "%d other running run(s) in this database: the workers will give them passes too",
            others,
        )
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return str(cursor.fetchone()[0])


def versions(server: str) -> dict[str, Any]:
    import django

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "django": django.get_version(),
        "postgresql": server,
    }
    for dist in ("pikku-django", "psycopg"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    return info


# -- report -----------------------------------------------------------------------------------


def format_table(trials: list[Trial], summary: dict[str, Any], args: argparse.Namespace) -> str:
    header = (
        "trial",
        "kill->step succeeded",
        "kill->run completed",
        "attempt",
        "lease left at kill",
        "lapse->claim",
        "claim->succeeded",
        "succeeded->completed",
    )
    rows = [header]
    for t in trials:
        rows.append(
            (
                str(t.trial),
                f"{t.kill_to_step_succeeded_s:.3f} s",
                f"{t.kill_to_run_completed_s:.3f} s",
                str(t.attempt) + ("" if t.completed_by_worker_b else " (not by B)"),
                f"{t.lease_left_at_kill_s:.3f} s",
                f"{t.lapse_to_claim_s:.3f} s",
                f"{t.claim_to_step_succeeded_s:.3f} s",
                f"{t.step_succeeded_to_run_completed_s:.3f} s",
            )
        )
    for label in ("median", "max"):
        rows.append(
            (
                label,
                f"{summary[f'{label}_kill_to_step_succeeded_s']:.3f} s",
                f"{summary[f'{label}_kill_to_run_completed_s']:.3f} s",
                "",
                "",
                f"{summary[f'{label}_lapse_to_claim_s']:.3f} s",
                "",
                "",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    out = [line(header), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in rows[1 : len(trials) + 1]]
    out.append("  ".join("-" * w for w in widths))
    out += [line(row) for row in rows[len(trials) + 1 :]]
    lease_s = args.lease_ms / 1000
    yes = {True: "yes", False: "NO"}
    out += [
        "",
        f"step lease {lease_s:g} s (STEP_LEASE_MS={args.lease_ms}), worker poll interval "
        f"{args.worker_poll:g} s (WORKER_POLL_INTERVAL), kill at: {args.kill_at}, "
        f"database polled every {args.poll_db * 1000:g} ms",
        f"target: kill->step succeeded <= lease + {MARGIN_S:g} s = {summary['target_s']:g} s "
        f"in every trial, attempt 2",
        f"met: {yes[summary['met']]} (max {summary['max_kill_to_step_succeeded_s']:.3f} s, "
        f"median {summary['median_kill_to_step_succeeded_s']:.3f} s; "
        f"run completed max {summary['max_kill_to_run_completed_s']:.3f} s: "
        f"{'within' if summary['run_completed_within_target'] else 'OVER'} the target)",
    ]
    return "\n".join(out)


def summarise(trials: list[Trial], args: argparse.Namespace) -> dict[str, Any]:
    target = args.lease_ms / 1000 + MARGIN_S
    out: dict[str, Any] = {"lease_s": args.lease_ms / 1000, "target_s": target}
    for field in ("kill_to_step_succeeded_s", "kill_to_run_completed_s", "lapse_to_claim_s"):
        values = [getattr(t, field) for t in trials]
        out[f"median_{field}"] = round(statistics.median(values), 4)
        out[f"max_{field}"] = round(max(values), 4)
    out["all_attempt_2_by_b"] = all(t.attempt == 2 and t.completed_by_worker_b for t in trials)
    out["met"] = out["max_kill_to_step_succeeded_s"] <= target and out["all_attempt_2_by_b"]
    out["run_completed_within_target"] = out["max_kill_to_run_completed_s"] <= target
    return out


# -- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trials", type=int, default=5, help="kills to time (default 5)")
    parser.add_argument(
        "--lease-ms", type=int, default=5000, help="PIKKU STEP_LEASE_MS (default 5000)"
    )
    parser.add_argument(
        "--worker-poll",
        type=float,
        default=0.1,
        help="the workers' PIKKU WORKER_POLL_INTERVAL in seconds (default 0.1)",
    )
    parser.add_argument(
        "--kill-at",
        choices=("renewal", "ready"),
        default="renewal",
        help="kill A right after its lease renewal lands (default: the whole lease is left), "
        "or as soon as B is ready",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="seconds to let B idle after its start line (default 1)",
    )
    parser.add_argument(
        "--poll-db",
        type=float,
        default=0.02,
        help="seconds between this script's database polls after the kill (default 0.02)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds for each wait (default 60)"
    )
    args = parser.parse_args(argv)
    if args.trials < 1 or args.lease_ms < 1 or args.worker_poll <= 0 or args.poll_db <= 0:
        parser.error("--trials and --lease-ms must be >= 1, --worker-poll and --poll-db > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[bench] %(message)s")

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)

    # The settings module and the benchmark app live next to this file.
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ["PIKKU_BENCH_POSTGRES_URL"] = URL
    os.environ["PIKKU_BENCH_STEP_LEASE_MS"] = str(args.lease_ms)
    os.environ["PIKKU_BENCH_POLL"] = repr(args.worker_poll)
    pythonpath = [str(BENCH_DIR), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        pythonpath.append(os.environ["PYTHONPATH"])
    worker_env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}

    log.info("PostgreSQL at %s", URL)
    try:
        ensure_database(URL)
        server = setup_django()
    except Exception as exc:
        log.error(
            "PostgreSQL set-up failed (%s: %s); set PIKKU_BENCH_POSTGRES_URL",
            type(exc).__name__,
            exc,
        )
        return 2

    tmp = Path(tempfile.mkdtemp(prefix="pikku-bench-recovery-"))
    workers = Workers(tmp, worker_env)
    trials: list[Trial] = []
    began = time.perf_counter()
    try:
        for index in range(1, args.trials + 1):
            log.info("trial %d/%d", index, args.trials)
            trials.append(run_trial(index, args, workers, tmp))
            workers.stop_all()
    except TrialError as exc:
        log.error("trial %d failed: %s", len(trials) + 1, exc)
        return 1
    except KeyboardInterrupt:
        log.error("interrupted: stopping the workers")
        return 130
    finally:
        workers.stop_all()
        from django.db import connections

        connections.close_all()
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("done in %.0f s", time.perf_counter() - began)

    summary = summarise(trials, args)
    print(format_table(trials, summary, args))
    report = {
        "benchmark": "pikku_django crash recovery: SIGKILL mid-step -> step completed elsewhere",
        "settings": {
            "trials": args.trials,
            "step_lease_ms": args.lease_ms,
            "worker_poll_interval_s": args.worker_poll,
            "worker_concurrency": 1,
            "worker_notify": True,
            "kill_at": args.kill_at,
            "settle_s": args.settle,
            "db_poll_s": args.poll_db,
            "target": f"kill->step succeeded <= lease + {MARGIN_S:g} s",
        },
        "machine": versions(server),
        "summary": summary,
        "trials": [asdict(t) for t in trials],
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
