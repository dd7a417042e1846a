"""A queue's concurrency limit held across worker processes (PostgreSQL, MariaDB).

Two pikku_worker processes of four threads each run steps of a queue limited to
three: at no moment are more than three of its attempts running, by the attempt
history. A worker SIGKILLed while it holds slots frees them once its claims lapse,
and the other worker finishes every run.
"""

from __future__ import annotations

import json
import signal
from datetime import datetime
from pathlib import Path

import pytest

from pikku_django.models import RunStatus, StepAttempt, WorkflowRun
from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

#: Worker processes killed, frozen or racing: their subject does not depend on Django's
#: version (the in-process tests of the same code run in both jobs), so the newest-Django
#: job leaves them out.
pytestmark = pytest.mark.once

LIMIT = 3
QUEUES = json.dumps({"tight": {"concurrency": LIMIT}})


def _most_at_once(alias: str, until: datetime | None = None, dead: int | None = None) -> int:
    """The most attempts of the queue "tight" running at one moment (an attempt
    without an end counts as running until ``until``; so does one of the worker
    process ``dead``, SIGKILLed then, which a successor closes only when it
    supersedes it, after its lease lapsed and freed its slot)."""
    events: list[tuple[datetime, int]] = []
    for started, finished, worker in (
        StepAttempt.objects.using(alias)
        .filter(step__queue="tight")
        .values_list("started_at", "finished_at", "worker")
    ):
        end = finished or until
        if dead is not None and f":{dead}:" in worker and until is not None:
            end = until if end is None else min(end, until)
        assert end is not None, "an attempt never finished"
        events += [(started, 1), (end, -1)]
    most = running = 0
    for _, change in sorted(events):  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


@on_databases("postgres", "mariadb")
def test_two_worker_processes_never_exceed_a_queues_limit(vendor: str, tmp_path: Path) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    runs = [
        engine.start(
            "testapp.slow_one",
            # Enough work that a worker process which starts a second or two after
            # the other still finds steps left to claim.
            {"started": str(tmp_path / f"s{n}"), "seconds": 0.6},
            queue="tight",
        )
        for n in range(24)
    ]
    # Two threads each: together more than the limit, alone fewer, so the limit is
    # held across processes and both of them claim.
    workers = [
        worker_process(alias, "--until-idle", "--concurrency", "2", PIKKU_TEST_QUEUES=QUEUES)
        for _ in range(2)
    ]
    outs = [finish(w, timeout=180) for w in workers]
    for code, out in outs:
        assert code == 0, out
    for run in runs:
        run.refresh_from_db(using=alias)
        assert run.status == RunStatus.COMPLETED, (run.error, outs)
    most = _most_at_once(alias)
    assert most <= LIMIT
    # Both processes claimed from the queue.
    pids = {
        w.split(":")[1] for w in StepAttempt.objects.using(alias).values_list("worker", flat=True)
    }
    assert len(pids) == 2, pids


@on_databases("postgres", "mariadb")
def test_a_killed_workers_slots_are_freed_when_its_claims_lapse(
    vendor: str, tmp_path: Path
) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    runs = [
        engine.start(
            "testapp.slow_one",
            {"started": str(tmp_path / f"s{n}"), "seconds": 1.0},
            queue="tight",
        )
        for n in range(8)
    ]
    env = {
        "PIKKU_TEST_QUEUES": QUEUES,
        "PIKKU_TEST_STEP_LEASE_MS": "2000",
        "PIKKU_TEST_RUN_LEASE_MS": "2000",
    }
    doomed = worker_process(alias, "--concurrency", "4", **env)
    wait_for(lambda: any(tmp_path.iterdir()), 60, "the first worker to start a step")
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate()
    killed_at = datetime.now().astimezone()
    survivor = worker_process(alias, "--until-idle", "--concurrency", "4", **env)
    code, out = finish(survivor, timeout=180)
    assert code == 0, out
    for run in runs:
        run.refresh_from_db(using=alias)
        assert run.status == RunStatus.COMPLETED, (run.error, out)
    # The killed worker's attempts, counted as running until it died, and the
    # survivor's never add up to more than the limit.
    assert _most_at_once(alias, until=killed_at, dead=doomed.pid) <= LIMIT
    assert WorkflowRun.objects.using(alias).count() == 8
