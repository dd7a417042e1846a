"""Real worker processes killed or paused mid-step, on PostgreSQL.

A worker that is SIGKILLed mid-step has its step reclaimed as the next attempt once
the step lease lapses; a worker that was paused past its lease cannot overwrite the
attempt that replaced it; a transactional step killed mid-transaction leaves no
partial writes. Workers killed mid-pass, or between a step's settle and the pass
after it, with default settings on each database: tests/test_crash_recovery_bounds.py
and tests/test_crash_recovery_settle.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pikku_django.models import (
    AttemptStatus,
    Lease,
    RunStatus,
    StepAttempt,
    StepStatus,
    WorkerHeartbeat,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows import WorkflowEngine
from pikku_django.workflows.engine import run_lease_key
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process
from tests.testapp.models import Effect

#: Worker processes killed, frozen or racing: their subject does not depend on Django's
#: version (the in-process tests of the same code run in both jobs), so the newest-Django
#: job leaves them out.
pytestmark = [pytest.mark.once, pytest.mark.long]

LEASE_MS = 3_000
POLL = 0.2


def run_state(alias: str, run_id: object) -> WorkflowRun:
    return WorkflowRun.objects.using(alias).get(id=run_id)


def workers(alias: str, n: int, run_lease_ms: int = 30_000) -> list[subprocess.Popen[str]]:
    env = {
        "PIKKU_TEST_STEP_LEASE_MS": str(LEASE_MS),
        "PIKKU_TEST_RUN_LEASE_MS": str(run_lease_ms),
        "PIKKU_TEST_POLL": str(POLL),
    }
    return [worker_process(alias, "--concurrency", "1", **env) for _ in range(n)]


def stop(*procs: subprocess.Popen[str]) -> list[str]:
    """SIGTERM each worker that is still alive; what each printed."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
    return [finish(proc, 60)[1] for proc in procs]


# A run lease longer than the step lease is given back before the step runs; a shorter
# one is held across it (a worker carries its run on): either way the dead worker's
# run lease is no longer in the way once its step can be taken over.
@pytest.mark.parametrize("run_lease_ms", [30_000, 2_000], ids=["released", "held"])
@on_databases("postgres")
def test_sigkilled_worker_step_completes_as_attempt_two(
    vendor: str, tmp_path: Path, run_lease_ms: int
) -> None:
    alias = database_alias(vendor)
    started = tmp_path / "started"
    run = WorkflowEngine(alias).start("testapp.blocked", {"started": str(started)})
    first, second = workers(alias, 1, run_lease_ms)[0], None
    try:
        wait_for(started.exists, 60, "the first attempt to start")
        killed_pid = int(started.read_text())
        assert killed_pid == first.pid
        (second,) = workers(alias, 1, run_lease_ms)
        wait_for(lambda: up(alias, second), 60, "the second worker to be up before the kill")
        killed_ms = time.time() * 1000
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
        # What the dead worker left: its step's lease, and its run lease, if it held one.
        # Nothing renews them now; the second worker changes them only once it takes
        # the step over (attempt 2), after the step lease has lapsed.
        step_lease = (
            WorkflowStep.objects.using(alias)
            .filter(run_id=run.id, name="work", attempt=1)
            .values_list("lease_expires_at", flat=True)
            .first()
        )
        run_lease = Lease.objects.using(alias).filter(key__endswith=run_lease_key(run.id)).first()
        wait_for(
            lambda: run_state(alias, run.id).status == RunStatus.COMPLETED,
            120,
            "the run to complete after the kill",
        )
    finally:
        stop(*(p for p in (first, second) if p is not None))
    step = WorkflowStep.objects.using(alias).get(run_id=run.id, name="work")
    assert step.status == StepStatus.SUCCEEDED
    assert step.attempt == 2
    assert step.result["pid"] == second.pid
    assert run_state(alias, run.id).output == step.result
    attempts = {a.attempt: a for a in StepAttempt.objects.using(alias).filter(step=step)}
    assert step_lease is not None, "the second worker took the step over before it was read"
    # Taken over once the dead worker's step lease had lapsed, not before.
    assert attempts[2].started_at >= from_epoch_ms(step_lease), (attempts, step_lease)
    # The dead worker's run lease was not in the way: given back before the step ran
    # when longer than the step lease; held across it when shorter, so that it lapses
    # with the step lease, not a run lease later.
    if run_lease_ms > LEASE_MS:
        assert run_lease is None or run_lease.expires_at <= killed_ms, run_lease
    else:
        assert run_lease is not None, "the run lease was not held across the step"
        assert run_lease.expires_at > killed_ms, "the run lease was not held across the step"


def up(alias: str, proc: subprocess.Popen[str]) -> bool:
    """Whether worker ``proc`` has recorded its first heartbeat (up, looking for work)."""
    return WorkerHeartbeat.objects.using(alias).filter(pid=proc.pid).exists()


def from_epoch_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@on_databases("postgres")
def test_paused_worker_cannot_overwrite_its_successor(vendor: str, tmp_path: Path) -> None:
    alias = database_alias(vendor)
    started = tmp_path / "started"
    run = WorkflowEngine(alias).start(
        "testapp.blocked", {"started": str(started), "block": 2 * LEASE_MS / 1000}
    )
    (first,) = workers(alias, 1)
    second = None
    try:
        wait_for(started.exists, 60, "the first attempt to start")
        os.kill(first.pid, signal.SIGSTOP)
        (second,) = workers(alias, 1)
        wait_for(
            lambda: run_state(alias, run.id).status == RunStatus.COMPLETED,
            LEASE_MS / 1000 + 30,
            "the second worker to finish the step",
        )
        os.kill(first.pid, signal.SIGCONT)
        # The first attempt's function now returns, and its write must be refused: the
        # SIGTERM below lets that step in flight finish before the worker exits.
    finally:
        outputs = stop(*(p for p in (first, second) if p is not None))
    assert "superseded" in outputs[0], outputs[0]
    step = WorkflowStep.objects.using(alias).get(run_id=run.id, name="work")
    assert step.attempt == 2
    assert step.result["pid"] == second.pid
    assert run_state(alias, run.id).output["pid"] == second.pid
    history = list(step.attempts.using(alias).order_by("attempt").values_list("status", flat=True))
    # The frozen attempt is closed as superseded when the step is taken from it.
    assert history == [AttemptStatus.SUPERSEDED, StepStatus.SUCCEEDED]
    stale = step.attempts.using(alias).get(attempt=1)
    assert stale.finished_at is not None
    assert stale.result is None


@on_databases("postgres")
def test_transactional_step_killed_mid_transaction_leaves_no_writes(
    vendor: str, tmp_path: Path
) -> None:
    alias = database_alias(vendor)
    started = tmp_path / "started"
    run = WorkflowEngine(alias).start(
        "testapp.blocked",
        {"started": str(started), "step": "testapp.tx_block_first", "db": alias, "run": "tx"},
    )
    (first,) = workers(alias, 1)
    second = None
    try:
        wait_for(started.exists, 60, "the first attempt to write and block")
        os.kill(first.pid, signal.SIGKILL)
        (second,) = workers(alias, 1)
        wait_for(
            lambda: run_state(alias, run.id).status == RunStatus.COMPLETED,
            LEASE_MS / 1000 + 30,
            "the run to complete after the kill",
        )
    finally:
        stop(*(p for p in (first, second) if p is not None))
    effects = list(Effect.objects.using(alias).filter(run_id="tx"))
    assert len(effects) == 1, "the killed attempt's write survived, or none landed"
    assert effects[0].attempt_pid == second.pid
