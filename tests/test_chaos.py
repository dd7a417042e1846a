"""A short chaos run on PostgreSQL: one worker SIGKILLed mid-step, another SIGSTOPped
mid-step past its lease, while 20 runs of 5 steps (3 transactional, 2 plain) go on.

Every run must complete; every stored result must come from the attempt that the
StepAttempt history says succeeded (each execution records its pid, thread and
start on a connection of its own, and returns a nonce that names that record);
every transactional step's database effect must have happened exactly once.
``benchmarks/chaos.py`` is the long version.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

from pikku_django.models import (
    AttemptStatus,
    RunStatus,
    StepAttempt,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows import WorkflowEngine
from tests.chaosapp.models import ChaosEffect, ChaosExecution
from tests.chaosapp.workflows import chaos_function
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

#: Worker processes killed, frozen or racing: their subject does not depend on Django's
#: version (the in-process tests of the same code run in both jobs), so the newest-Django
#: job leaves them out.
pytestmark = [pytest.mark.once, pytest.mark.long]

LEASE_MS = 3_000
RUNS = 20
SLACK = timedelta(milliseconds=5)


def start_worker(alias: str) -> subprocess.Popen[str]:
    return worker_process(
        alias,
        "--concurrency",
        "3",
        DJANGO_SETTINGS_MODULE="tests.chaosapp.worker_settings",
        PIKKU_TEST_STEP_LEASE_MS=str(LEASE_MS),
        PIKKU_TEST_POLL="0.2",
    )


def running_in(alias: str, pid: int) -> bool:
    """Whether the worker process ``pid`` has a step attempt in flight."""
    return (
        StepAttempt.objects.using(alias)
        .filter(status=StepStatus.RUNNING, worker__contains=f":{pid}:", step__kind="queued")
        .exists()
    )


def listening(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query ILIKE 'LISTEN pikku_work%%'"
        )
        return int(cursor.fetchone()[0])


def problems_in(alias: str, run_ids: list[Any]) -> list[str]:
    """What breaks the guarantees, step by step; empty when all hold."""
    problems = []
    keys = [str(r) for r in run_ids]
    executions = {e.nonce: e for e in ChaosExecution.objects.using(alias).filter(run_id__in=keys)}
    effects = defaultdict(list)
    for effect in ChaosEffect.objects.using(alias).filter(run_id__in=keys):
        effects[(effect.run_id, effect.step)].append(effect.nonce)
    for run in WorkflowRun.objects.using(alias).filter(id__in=run_ids):
        steps = list(WorkflowStep.objects.using(alias).filter(run_id=run.id).order_by("id"))
        if run.status != RunStatus.COMPLETED:
            problems.append(f"run {run.id} is {run.status}: {run.error or run.suspend_reason}")
            continue
        if run.output != [s.result for s in steps] or len(steps) != 5:
            problems.append(f"run {run.id}: its output is not its steps' results")
        for step in steps:
            key = (str(run.id), step.name)
            won = list(step.attempts.using(alias).filter(status=StepStatus.SUCCEEDED))
            if len(won) != 1 or won[0].attempt != step.attempt:
                problems.append(f"{key}: succeeded attempts {[a.attempt for a in won]}")
                continue
            execution = executions.get((step.result or {}).get("nonce"))
            # The attempt names the worker thread that claimed it; a claim's batch is run
            # by the claiming process's free threads, so its process is what must match.
            _, pid, thread = won[0].worker.rsplit(":", 2)
            if execution is None:
                problems.append(f"{key}: its result {step.result} names no execution")
            elif execution.pid != int(pid):
                problems.append(
                    f"{key}: result by {execution.pid}:{execution.thread}, but the attempt "
                    f"that succeeded was claimed in {pid}:{thread}"
                )
            elif not (
                won[0].started_at - SLACK <= execution.started_at <= won[0].finished_at + SLACK
            ):
                problems.append(f"{key}: the result's execution started outside its attempt")
            if step.function == chaos_function(0) and effects[key] != [step.result["nonce"]]:
                problems.append(f"{key}: effects {effects[key]}, result {step.result['nonce']}")
    return problems


def kill_mid_step(alias: str, workers: list[subprocess.Popen[str]]) -> int:
    """SIGKILL the last worker while it runs a step (retrying with a fresh worker if it was
    between steps), start a replacement; the killed pid."""
    for _ in range(5):
        victim = workers[-1]
        wait_for(lambda v=victim: running_in(alias, v.pid), 30, "the worker to run a step")
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        workers.append(start_worker(alias))
        if running_in(alias, victim.pid):  # its attempt in flight, cut short
            return victim.pid
    raise AssertionError("the worker was never killed in the middle of a step")


def stop_mid_step(alias: str, worker: subprocess.Popen[str]) -> None:
    """SIGSTOP ``worker`` while it runs a step, past the step lease; then SIGCONT."""
    for _ in range(5):
        wait_for(lambda: running_in(alias, worker.pid), 30, "the worker to run a step")
        os.kill(worker.pid, signal.SIGSTOP)
        if running_in(alias, worker.pid):
            # Past the lease, and the time a busy worker may take to come back to the
            # queue (the run it carries on, and that run's step in flight).
            time.sleep(LEASE_MS / 1000 + 3)
            os.kill(worker.pid, signal.SIGCONT)
            return
        os.kill(worker.pid, signal.SIGCONT)  # caught between two steps: again
    raise AssertionError("the worker was never stopped in the middle of a step")


@on_databases("postgres")
def test_runs_survive_a_kill_and_a_stop_with_every_guarantee(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    rng = random.Random(7)
    stopped = start_worker(alias)
    workers = [stopped, start_worker(alias)]
    try:
        wait_for(lambda: listening(alias) >= 2, 60, "both workers to listen")
        run_ids = [
            engine.start(
                "chaosapp.chaos", {"db": alias, "ms": [rng.randint(100, 400) for _ in range(5)]}
            ).id
            for _ in range(RUNS)
        ]
        # One worker dies in the middle of a step: that attempt never finishes.
        killed = kill_mid_step(alias, workers)
        # The other freezes in the middle of a step, past its lease, once the killed
        # one's replacement is at work: the replacement takes the step over, and the
        # frozen attempt's outcome, once it wakes, must be refused.
        wait_for(lambda: running_in(alias, workers[-1].pid), 30, "the replacement to work")
        stop_mid_step(alias, stopped)
        wait_for(
            lambda: (
                not WorkflowRun.objects.using(alias)
                .filter(id__in=run_ids, status=RunStatus.RUNNING)
                .exists()
            ),
            60,
            "every run to end",
        )
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        outputs = [finish(proc, 60)[1] for proc in workers]
    assert problems_in(alias, run_ids) == [], outputs
    attempts = StepAttempt.objects.using(alias).filter(step__run_id__in=run_ids)
    # The chaos reached steps: the killed attempt and the frozen one were taken over.
    for pid in (killed, stopped.pid):
        cut = attempts.filter(worker__contains=f":{pid}:", status=AttemptStatus.SUPERSEDED)
        assert cut.exists(), f"no attempt of {pid} was cut short:\n{outputs}"
        assert all(c.step.status == StepStatus.SUCCEEDED for c in cut)
        assert all(c.step.attempt > c.attempt for c in cut)
