"""A worker process SIGKILLed holding a batch of claims it has not started (PostgreSQL,
MariaDB): another worker claims each unit once its lease lapses, as its next attempt,
and runs it; the dead worker's attempts are closed as replaced.

The worker kills itself as soon as one claim took two units or more, before it hands
them to its threads (tests/testapp/kills.py). SQLite allows one worker process: a
claim whose worker never started it, there too: tests/test_batched_claims.py.
"""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pikku_django.models import AttemptStatus, RunStatus, StepAttempt, StepStatus, WorkflowStep
from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

#: Worker processes killed, frozen or racing: their subject does not depend on Django's
#: version (the in-process tests of the same code run in both jobs), so the newest-Django
#: job leaves them out.
pytestmark = [pytest.mark.once, pytest.mark.long]

ENV = {"PIKKU_TEST_STEP_LEASE_MS": "2000", "PIKKU_TEST_RUN_LEASE_MS": "2000"}


@on_databases("postgres", "mariadb")
def test_a_batch_its_worker_died_holding_is_claimed_by_another_once_its_leases_lapse(
    vendor: str, tmp_path: Path
) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    runs = [
        engine.start("testapp.slow_one", {"started": str(tmp_path / f"s{n}"), "seconds": 0}).id
        for n in range(3)
    ]
    # Each run's first pass stores its step, ready for the worker's claim of steps.
    while due := engine.claim_due_runs(10):
        for run_id in due:
            engine.orchestrate(run_id)
    marker = tmp_path / "killed"
    doomed = worker_process(
        alias, "--concurrency", "3", PIKKU_TEST_KILL_AFTER_BATCH=str(marker), **ENV
    )
    wait_for(marker.exists, 60, "the worker to claim a batch and die")
    doomed.communicate(timeout=30)
    assert doomed.returncode == -signal.SIGKILL
    note = json.loads(marker.read_text())
    steps = WorkflowStep.objects.using(alias).filter(run_id__in=runs)
    # One claim took the three steps, each as its first attempt, for its three threads.
    assert sorted(note["steps"]) == sorted([s.id, 1] for s in steps)
    leases = dict(steps.values_list("id", "lease_expires_at"))
    assert not any(tmp_path.glob("s*")), "a step of the batch was started"
    survivor = worker_process(alias, "--until-idle", "--concurrency", "3", **ENV)
    code, out = finish(survivor, timeout=180)
    assert code == 0, out
    for run_id in runs:
        assert engine.get_run(run_id).status == RunStatus.COMPLETED, out
    for step in steps.all():  # read again, after the survivor
        assert step.status == StepStatus.SUCCEEDED
        assert step.result["pid"] == survivor.pid
        attempts = {a.attempt: a for a in StepAttempt.objects.using(alias).filter(step=step)}
        assert attempts[1].status == AttemptStatus.SUPERSEDED
        assert attempts[2].status == AttemptStatus.SUCCEEDED
        # Taken over once the dead worker's lease had lapsed, not before.
        lapsed = datetime.fromtimestamp(leases[step.id] / 1000, tz=UTC)
        assert attempts[2].started_at >= lapsed, (attempts, lapsed)
