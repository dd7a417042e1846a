"""A paused queue against real pikku_worker processes (SQLite, PostgreSQL, MariaDB).

Pausing a busy queue: once pause_queue() has returned, no attempt of the queue's steps
is ever added (the attempt rows then are all there will be until the resume), the
steps it had running finish, another queue's runs complete meanwhile, and after the
resume every run completes. The pause is a row: a worker started afresh finds it.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import WorkflowEngine, pause_queue, paused_queues, resume_queue
from pikku_django.workflows.control._pause_conditions import paused_look
from pikku_django.workflows.store import store_for
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

#: Worker processes killed, frozen or racing: their subject does not depend on Django's
#: version (the in-process tests of the same code run in both jobs), so the newest-Django
#: job leaves them out.
pytestmark = pytest.mark.once

ALL = ("sqlite", "postgres", "mariadb")


@pytest.fixture(autouse=True)
def _fresh_look() -> object:
    """Each test's pauses are its own: the look of this process is read afresh."""
    paused_look.forget()
    yield
    paused_look.forget()


def _attempts(alias: str, queue: str) -> dict[int, tuple[int, str]]:
    """The attempt rows of ``queue``'s steps: id -> (step id, status)."""
    rows = StepAttempt.objects.using(alias).filter(step__queue=queue)
    return {pk: (step, status) for pk, step, status in rows.values_list("id", "step_id", "status")}


def _completed(alias: str, runs: list[WorkflowRun]) -> bool:
    ids = [run.id for run in runs]
    done = WorkflowRun.objects.using(alias).filter(id__in=ids, status=RunStatus.COMPLETED)
    return done.count() == len(ids)


def _stop(workers: list[subprocess.Popen[str]]) -> list[str]:
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    outs = []
    for proc in workers:
        code, out = finish(proc, 60)
        assert code == 0, out
        outs.append(out)
    return outs


def _processes(vendor: str) -> list[tuple[str, ...]]:
    """Two worker processes of two threads (SQLite allows one process: four threads)."""
    if vendor == "sqlite":
        return [("--concurrency", "4")]
    return [("--concurrency", "2"), ("--concurrency", "2")]


@on_databases(*ALL)
def test_a_paused_busy_queue_claims_nothing_more_until_resumed(vendor: str, tmp_path: Path) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    held = [
        engine.start(
            "testapp.slow_twice", {"started": str(tmp_path / f"h{n}"), "seconds": 0.4}, queue="held"
        )
        for n in range(10)
    ]
    workers = [worker_process(alias, *args) for args in _processes(vendor)]
    try:
        wait_for(lambda: len(list(tmp_path.iterdir())) >= 2, 90, "steps of the queue to start")
        result = pause_queue("held", reason="partner API down", paused_by="ops", using=alias)
        assert result.change == "paused"
        if not result.settled:
            # On a busy machine a claim begun before the pause may outlast the pause's
            # own wait (SETTLE_SECONDS); it must still end, before the snapshot below.
            assert store_for(alias).await_open_transactions(120)
        # Every claim of the queue made before the pause: nothing is added to these.
        at_pause = _attempts(alias, "held")
        assert at_pause
        # Another queue's runs, started after the pause, complete meanwhile.
        free = [
            engine.start(
                "testapp.slow_one",
                {"started": str(tmp_path / f"f{n}"), "seconds": 0.05},
                queue="free",
            )
            for n in range(4)
        ]
        wait_for(lambda: _completed(alias, free), 90, "the other queue's runs")
        # The steps running at the pause finish and settle as usual.
        wait_for(
            lambda: all(s != StepStatus.RUNNING for _, s in _attempts(alias, "held").values()),
            90,
            "the paused queue's running steps to finish",
        )
        after = _attempts(alias, "held")
        assert after.keys() == at_pause.keys()
        assert {status for _, status in after.values()} == {StepStatus.SUCCEEDED}
        assert not _completed(alias, held)  # some of the queue's work waits
        assert (
            WorkflowStep.objects.using(alias)
            .filter(queue="held", status=StepStatus.SCHEDULED)
            .exists()
        )

        assert resume_queue("held", using=alias).change == "resumed"
        wait_for(lambda: _completed(alias, held), 120, "the queue's runs after the resume")
    finally:
        outs = _stop(workers)
    assert len(_attempts(alias, "held")) == 20, outs  # each step once: nothing retried


@on_databases(*ALL)
def test_a_pause_holds_for_a_worker_started_afresh(vendor: str, tmp_path: Path) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    pause_queue("held", reason="deploy half done", using=alias)
    held = [
        engine.start(
            "testapp.slow_one", {"started": str(tmp_path / f"h{n}"), "seconds": 0}, queue="held"
        )
        for n in range(3)
    ]

    def other_runs(tag: str) -> list[WorkflowRun]:
        return [
            engine.start("testapp.slow_one", {"started": str(tmp_path / f"{tag}{n}"), "seconds": 0})
            for n in range(2)
        ]

    for tag in ("a", "b"):  # a worker, stopped; then another, started afresh
        others = other_runs(tag)
        proc = worker_process(alias, "--concurrency", "2")
        try:
            wait_for(lambda o=others: _completed(alias, o), 90, "the worker to run other queues")
        finally:
            _stop([proc])
        assert not _attempts(alias, "held")
        assert [p.queue for p in paused_queues(alias)] == ["held"]
    proc = worker_process(alias, "--concurrency", "2")
    try:
        resume_queue("held", using=alias)
        wait_for(lambda: _completed(alias, held), 90, "the queue's runs after the resume")
    finally:
        _stop([proc])
    assert len(_attempts(alias, "held")) == 3
