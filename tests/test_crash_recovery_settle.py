"""A real worker process SIGKILLed with default settings, on each database, between a
step's settle and the pass after it: the step is not run again, and another worker
carries the run on once the dead worker's run lease would have lapsed. Killed mid-pass,
and the helpers: tests/test_crash_recovery_bounds.py.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowStep
from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases
from tests.test_crash_recovery import run_state, stop
from tests.test_crash_recovery_bounds import (
    GUARD,
    RUN_LEASE,
    VENDORS,
    Timeline,
    completed_at,
    from_epoch,
    note_leases,
    note_steps,
    started,
    successor,
    worker,
)
from tests.test_worker import wait_for

#: As tests/test_crash_recovery_bounds.py: the newest-Django job leaves these out.
pytestmark = [pytest.mark.once, pytest.mark.long]

#: Steps of the settle_then_pass run: its worker dies after the first whose settle
#: leaves the run for that worker's own next pass.
STEPS = 8


@on_databases(*VENDORS)
def test_worker_sigkilled_between_a_settle_and_its_pass(vendor: str, tmp_path: Path) -> None:
    """A step's success is committed and its worker dies before the pass it owed the
    run: the step is not run again, and another worker passes the run once the dead
    worker's run lease would have lapsed."""
    alias = database_alias(vendor)
    marker = tmp_path / "killed"
    # Every worker started now carries the kill (tests/testapp/kills.py): whichever one
    # owes the run a pass first dies. On SQLite there is one.
    env = {"PIKKU_TEST_KILL_AFTER_SETTLE": str(marker)}
    procs = [worker(alias, **env) for _ in range(1 if vendor == "sqlite" else 2)]
    try:
        ups = [started(alias, p) for p in procs]
        run = WorkflowEngine(alias).start("testapp.settle_then_pass", {"steps": STEPS})
        wait_for(
            lambda: marker.exists() or run_state(alias, run.id).status != RunStatus.RUNNING,
            60,
            "a worker to kill itself after a step's settle",
        )
        # Each settle woke the run for any worker when its thread's carrying ran out of
        # time before the step (CHAIN_SECONDS): no worker owed the run a pass.
        assert marker.exists(), "no step's settle left its run for its own worker's pass"
        note = json.loads(marker.read_text())
        [killed] = [p for p in procs if p.pid == note["pid"]]
        killed.wait(30)
        timeline = Timeline(from_epoch(note["at"]))
        for proc, up in zip(procs, ups, strict=True):
            timeline.add(f"worker {proc.pid} is up", up)
        wake_at = run_state(alias, run.id).wake_at
        timeline.add("the run falls due again", wake_at)
        note_leases(alias, run.id, timeline)
        if vendor == "sqlite":
            survivor = successor(alias, timeline)
            procs.append(survivor)
        else:
            [survivor] = [p for p in procs if p is not killed]
        done = completed_at(alias, run.id, GUARD)
    finally:
        stop(*procs)
    note_steps(alias, run.id, timeline)
    assert done is not None, f"the run did not complete:\n{timeline}"
    timeline.add("the run is seen completed", done)
    assert killed.returncode == -signal.SIGKILL
    steps = list(
        WorkflowStep.objects.using(alias).filter(run_id=run.id, kind="queued").order_by("id")
    )
    dead = next(s for s in steps if s.name == note["step"])
    settled = StepAttempt.objects.using(alias).get(step=dead, attempt=1).finished_at
    # The settle left the run for its own worker's pass: due once that worker's run
    # lease would have lapsed, not at once.
    assert wake_at is not None
    assert settled is not None
    woke_in = (wake_at - settled).total_seconds()
    assert woke_in >= RUN_LEASE, f"the settle woke the run in {woke_in}s:\n{timeline}"
    # The step whose success was committed is not run again.
    assert (dead.status, dead.attempt, dead.result["pid"]) == (
        StepStatus.SUCCEEDED,
        1,
        killed.pid,
    )
    assert StepAttempt.objects.using(alias).filter(step=dead).count() == 1
    assert [(s.name, s.attempt) for s in steps] == [(f"s{i}", 1) for i in range(STEPS)]
    after = steps[steps.index(dead) + 1 :]
    assert all(s.result["pid"] == survivor.pid for s in after), [s.result for s in steps]
    run = run_state(alias, run.id)
    assert run.output == [s.result for s in steps]
    assert [r["i"] for r in run.output] == list(range(STEPS))
    # The survivor carried the run on once it had fallen due, not before.
    assert run.updated_at >= wake_at, str(timeline)
    if after:
        first_after = StepAttempt.objects.using(alias).get(step=after[0], attempt=1)
        assert first_after.started_at >= wake_at, str(timeline)
