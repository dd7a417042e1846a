"""Real worker processes SIGKILLed with default settings, on each database, mid-pass:
the run falls due again once the dead worker's run lease (and a margin) lapses, and
another worker carries it on then: no five-minute sweep in the way. How soon, on a
quiet machine: benchmarks/recovery.py. Killed between a step's settle and the pass
after it: tests/test_crash_recovery_settle.py (a file of its own, so that the two
spread over the test processes).

When a check fails, the failure says where the time went (a timeline in seconds from
the kill).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from pikku_django.conf import DEFAULTS
from pikku_django.models import (
    Lease,
    RunStatus,
    StepAttempt,
    WorkerHeartbeat,
    WorkflowStep,
)
from pikku_django.workflows import WorkflowEngine
from pikku_django.workflows.engine import run_lease_key
from pikku_django.workflows.steps._claims import PASS_RECOVERY_MARGIN
from tests.conftest import database_alias, on_databases
from tests.test_crash_recovery import run_state, stop
from tests.test_worker import finish, wait_for, worker_process

#: Recovery on the run lease is the package's own timing, the same on every Django: the
#: newest-Django job leaves these out (it runs tests/test_crash_recovery.py's kills).
pytestmark = [pytest.mark.once, pytest.mark.long]

VENDORS = ("sqlite", "postgres", "mariadb")
#: The default settings, given to the worker processes as they are.
DEFAULT_ENV = {
    "PIKKU_TEST_STEP_LEASE_MS": str(DEFAULTS["STEP_LEASE_MS"]),
    "PIKKU_TEST_RUN_LEASE_MS": str(DEFAULTS["RUN_LEASE_MS"]),
    "PIKKU_TEST_POLL": str(DEFAULTS["WORKER_POLL_INTERVAL"]),
}
RUN_LEASE = DEFAULTS["RUN_LEASE_MS"] / 1000
#: How long a test waits for the run to complete after the kill before it fails: time
#: for the run lease to lapse and a hang guard, well short of a sweep minutes later.
GUARD = RUN_LEASE + 60
REFUSED = "Another pikku_worker is already running"


@dataclass
class Timeline:
    """What happened when, in seconds from the kill: said when a bound is missed."""

    killed_at: datetime
    events: list[tuple[datetime, str]] = field(default_factory=list)

    def add(self, what: str, at: datetime | None) -> None:
        if at is not None:
            self.events.append((at, what))

    def since_kill(self, at: datetime) -> float:
        return (at - self.killed_at).total_seconds()

    def __str__(self) -> str:
        rows = sorted([*self.events, (self.killed_at, "the worker is killed")])
        return "\n".join(f"{self.since_kill(at):+9.3f}s  {what}" for at, what in rows)


def from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def worker(alias: str, **env: str) -> subprocess.Popen[str]:
    return worker_process(alias, "--concurrency", "1", **DEFAULT_ENV, **env)


def up_since(alias: str, proc: subprocess.Popen[str]) -> datetime | None:
    """When ``proc`` recorded its first heartbeat (up, about to look for work)."""
    started: datetime | None = (
        WorkerHeartbeat.objects.using(alias)
        .filter(pid=proc.pid)
        .values_list("started_at", flat=True)
        .first()
    )
    return started


def started_or_refused(alias: str, proc: subprocess.Popen[str]) -> datetime | None:
    """When ``proc`` came up; None when it exited first (its output says why)."""
    wait_for(
        lambda: up_since(alias, proc) is not None or proc.poll() is not None,
        60,
        f"worker {proc.pid} to start or exit",
    )
    return up_since(alias, proc)


def started(alias: str, proc: subprocess.Popen[str]) -> datetime:
    at = started_or_refused(alias, proc)
    if at is None:
        pytest.fail(f"worker {proc.pid} exited:\n{finish(proc, 30)[1]}")
    return at


def sqlite_worker_lease(alias: str) -> Lease | None:
    """The lease that lets one worker process at a time run on a SQLite database."""
    return Lease.objects.using(alias).filter(key__startswith="pikku-worker:sqlite:").first()


def live(lease: Lease | None) -> bool:
    return lease is not None and lease.is_live


def successor(alias: str, timeline: Timeline) -> subprocess.Popen[str]:
    """A worker started after the kill to carry the run on, once it is up.

    SQLite allows one worker process per database file: a worker exits with an error
    while another one's worker lease (30 s ttl, renewed every 10 s) is live, and the
    killed worker's lease lapses only up to 30 s after the kill. So a refused worker
    is started again once that lease has lapsed, until one is accepted. That lease
    lapses no later than the run lease does, so the bound is the same as with a
    worker that was up before the kill.
    """
    deadline = time.monotonic() + RUN_LEASE + 30
    while True:
        proc = worker(alias)
        up = started_or_refused(alias, proc)
        if up is not None:
            timeline.add(f"worker {proc.pid} is up", up)
            return proc
        _, out = finish(proc, 30)
        assert REFUSED in out, out
        timeline.add(f"worker {proc.pid} refused to start (the killed one's lease)", timezone.now())
        assert time.monotonic() < deadline, f"no worker was accepted:\n{timeline}"
        wait_for(
            lambda: not live(sqlite_worker_lease(alias)),
            RUN_LEASE + 5,
            "the killed worker's SQLite worker lease to lapse",
        )


def note_leases(alias: str, run_id: Any, timeline: Timeline) -> None:
    """When the killed worker's run lease (and its SQLite worker lease) lapse."""
    run_lease = Lease.objects.using(alias).filter(key__endswith=run_lease_key(run_id)).first()
    if run_lease is not None and run_lease.expires_at:
        timeline.add(
            "the killed worker's run lease lapses", from_epoch(run_lease.expires_at / 1000)
        )
    worker_lease = sqlite_worker_lease(alias)
    if worker_lease is not None and worker_lease.expires_at:
        timeline.add(
            "the killed worker's SQLite worker lease lapses",
            from_epoch(worker_lease.expires_at / 1000),
        )


def note_steps(alias: str, run_id: Any, timeline: Timeline) -> None:
    """When each attempt of the run's steps started and finished, and the run's last write."""
    attempts = StepAttempt.objects.using(alias).filter(step__run_id=run_id).select_related("step")
    for a in attempts:
        name = f"step {a.step.name} attempt {a.attempt}"
        timeline.add(f"{name} starts", a.started_at)
        timeline.add(f"{name} ends {a.status}", a.finished_at)
    run = run_state(alias, run_id)
    timeline.add(f"the run is last written ({run.status})", run.updated_at)


def completed_at(alias: str, run_id: Any, timeout: float) -> datetime | None:
    """When the run was seen completed; None if it was not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run_state(alias, run_id).status == RunStatus.COMPLETED:
            return timezone.now()
        time.sleep(0.05)
    return None


@on_databases(*VENDORS)
def test_worker_sigkilled_mid_pass(vendor: str, tmp_path: Path) -> None:
    """The run, claimed for the pass its worker died in, falls due again once the run
    lease (and a margin) has passed, and another worker passes it then."""
    alias = database_alias(vendor)
    marker = tmp_path / "started"
    run = WorkflowEngine(alias).start("testapp.blocked_pass", {"started": str(marker)})
    first = worker(alias)
    second = None
    try:
        wait_for(marker.exists, 60, "the first pass to start")
        assert int(marker.read_text()) == first.pid
        second_up = None
        if vendor != "sqlite":
            # Up and idle before the kill (on SQLite it could not start beside the first).
            second = worker(alias)
            second_up = started(alias, second)
        os.kill(first.pid, signal.SIGKILL)
        timeline = Timeline(timezone.now())
        first.wait(30)
        timeline.add("the pass starts (and blocks)", from_epoch(marker.stat().st_mtime))
        if second is not None:
            timeline.add(f"worker {second.pid} is up", second_up)
        wake_at = run_state(alias, run.id).wake_at
        timeline.add("the run falls due again", wake_at)
        note_leases(alias, run.id, timeline)
        if second is None:
            second = successor(alias, timeline)
        done = completed_at(alias, run.id, GUARD)
    finally:
        stop(*(p for p in (first, second) if p is not None))
    note_steps(alias, run.id, timeline)
    assert done is not None, f"the run did not complete:\n{timeline}"
    timeline.add("the run is seen completed", done)
    assert first.returncode == -signal.SIGKILL
    assert run_state(alias, run.id).output["pid"] == second.pid
    # The claim pushed the run back by the run lease and its margin, no more, before
    # the pass began: it fell due again then, not at a sweep minutes later.
    assert wake_at is not None
    pass_began = from_epoch(marker.stat().st_mtime)
    pushed_back = RUN_LEASE + PASS_RECOVERY_MARGIN
    assert (wake_at - pass_began).total_seconds() <= pushed_back, f"{pushed_back}s:\n{timeline}"
    # The other worker passed it once it had fallen due, not before.
    step = WorkflowStep.objects.using(alias).get(run_id=run.id, name="work")
    assert StepAttempt.objects.using(alias).get(step=step).started_at >= wake_at, str(timeline)
