"""Async steps in a pikku_worker process: many at once on its event loop, a SIGKILLed
worker's async step reclaimed and finished once, retries."""

from __future__ import annotations

import signal
from datetime import datetime
from pathlib import Path

from pikku_django.models import RunStatus, StepAttempt, WorkflowStep
from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

ALL = ("sqlite", "postgres", "mariadb")
#: Async steps that all await at once in a worker of four threads.
STEPS = 40
THREADS = 4


@on_databases(*ALL)
def test_forty_async_steps_await_together_in_one_process(vendor: str, tmp_path: Path) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    # Each step awaits until every one of them has started: only a worker that has
    # them all in flight at once completes them (one per thread would leave each
    # waiting for the others until it gives up and fails).
    data = {"dir": str(tmp_path), "together": STEPS}
    runs = [engine.start("testapp.async_gathers", {**data, "n": n}) for n in range(STEPS)]
    code, out = finish(
        worker_process(alias, "--until-idle", "--idle-grace", "0.5", "--concurrency", str(THREADS)),
        timeout=180,
    )
    assert code == 0, out
    for n, run in enumerate(runs):
        run.refresh_from_db(using=alias)
        assert run.status == RunStatus.COMPLETED, (run.error, out[-3000:])
        assert (run.output["n"], run.output["seen"]) == (n, STEPS)
    assert len({run.output["pid"] for run in runs}) == 1
    spans = list(StepAttempt.objects.using(alias).values_list("started_at", "finished_at"))
    assert len(spans) == STEPS
    # The history says so too: every attempt was open at one moment, far more than
    # the process has worker threads (plain steps never are).
    assert most_at_once(spans) == STEPS > 2 * THREADS, out[-3000:]


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most of these (start, end) intervals open at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = running = 0
    for _, change in events:  # an end sorts before a start at the same instant
        running += change
        most = max(most, running)
    return most


@on_databases("postgres", "mariadb")
def test_an_async_step_killed_mid_await_is_reclaimed_and_completes_once(
    vendor: str, tmp_path: Path
) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    calls, done = tmp_path / "calls", tmp_path / "done"
    run = engine.start(
        "testapp.async_step",
        {"step": "testapp.async_block_first", "calls": str(calls), "done": str(done)},
    )
    env = {"PIKKU_TEST_STEP_LEASE_MS": "2000", "PIKKU_TEST_RUN_LEASE_MS": "2000"}
    doomed = worker_process(alias, **env)
    try:
        # Its note written, not only its file made: a kill between the two would
        # leave the next attempt counting itself the first.
        wait_for(
            lambda: calls.exists() and bool(calls.read_text()),
            60,
            "the first attempt to start awaiting",
        )
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.communicate()
    survivor = worker_process(alias, "--until-idle", **env)
    code, out = finish(survivor, timeout=120)
    assert code == 0, out
    run.refresh_from_db(using=alias)
    assert run.status == RunStatus.COMPLETED, (run.error, out)
    assert run.output["calls"] == 2
    # The killed attempt never finished; the second did, once.
    assert len(calls.read_text().splitlines()) == 2
    assert done.read_text().splitlines() == [f"done {survivor.pid}"]
    step = WorkflowStep.objects.using(alias).get(run_id=run.id)
    assert step.attempt == 2
    attempts = StepAttempt.objects.using(alias).filter(step=step).order_by("attempt")
    # The killed attempt is closed as superseded in the history; the second succeeded.
    assert [a.status for a in attempts] == ["superseded", "succeeded"]


@on_databases(*ALL)
def test_a_failing_async_step_is_retried_by_the_worker(vendor: str, tmp_path: Path) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    calls = tmp_path / "calls"
    run = engine.start(
        "testapp.async_step", {"step": "testapp.async_flaky", "calls": str(calls), "fail": 2}
    )
    code, out = finish(worker_process(alias, "--until-idle"), timeout=120)
    assert code == 0, out
    run.refresh_from_db(using=alias)
    steps = list(WorkflowStep.objects.using(alias).filter(run_id=run.id).values())
    assert run.status == RunStatus.COMPLETED, (run.error, run.wake_at, steps, out)
    assert run.output == {"calls": 3}
    history = StepAttempt.objects.using(alias).filter(step__run_id=run.id).order_by("attempt")
    assert [a.status for a in history] == ["failed", "failed", "succeeded"]
    assert "attempt 1 fails" in history[0].error["message"]


@on_databases("postgres")
def test_sigterm_lets_the_async_steps_in_flight_finish(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    runs = [engine.start("testapp.async_naps", {"n": n, "seconds": 3.0}) for n in range(5)]
    proc = worker_process(alias)
    try:
        attempts = StepAttempt.objects.using(alias)
        wait_for(lambda: attempts.count() == 5, 60, "the five async steps to start")
    finally:
        proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, 60)
    assert code == 0, out
    # Each step finished its await and was recorded before the worker exited.
    for step_row in WorkflowStep.objects.using(alias).filter(run__in=[r.id for r in runs]):
        assert (step_row.status, step_row.attempt) == ("succeeded", 1), out[-2000:]
    assert [a.status for a in attempts] == ["succeeded"] * 5
