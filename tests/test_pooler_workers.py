"""Real ``pikku_worker`` processes through PgBouncer, in transaction and session mode.

Workers complete runs, each step once, within queue concurrency and rate limits; a
task whose worker is SIGKILLed mid-call completes as attempt 2, once; a transactional
step whose worker is frozen (SIGSTOP) past its lease is taken over and completed by
another worker, and the frozen attempt, once resumed, is refused (superseded) and its
write rolled back, so the step's effect is there once; each cron tick
starts one run; webhook intake stores each delivery once and its runs complete. The
workers reach the database only through the pooler, with ``WORKER_NOTIFY`` off (no
``LISTEN``: idle workers poll).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from pikku_django.models import (
    AttemptStatus,
    RunStatus,
    StepAttempt,
    StepStatus,
    WebhookReceipt,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.schedules import tick_key
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.webhooks.dispatch import DISPATCH_WORKFLOW
from pikku_django.workflows import WorkflowEngine, get_engine, start_waiting_runs, start_workflow
from tests import test_tasks_defs as defs
from tests import webhook_defs
from tests.pgbouncer import Pooler, pooled_mark, pooled_worker
from tests.test_crash_recovery import run_state, up
from tests.test_limits_workers import STAMP_SLACK, _attempts, _intervals
from tests.test_schedules_workers import NAME, _env, _runs, _tick_of
from tests.test_webhook_store import enabled, post  # noqa: F401 (enabled: a fixture)
from tests.test_worker import finish, wait_for
from tests.testapp.models import Effect

# Many worker processes: the main job runs them, the newest-Django job leaves them out.
pytestmark = [pooled_mark(), pytest.mark.once, pytest.mark.long]

LEASE_MS = 3_000


def stop(*procs: subprocess.Popen[str]) -> list[str]:
    """SIGTERM each worker still alive (resumed first, if frozen); what each printed
    (once: nothing the second time)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
    return [
        "" if proc.stdout is None or proc.stdout.closed else finish(proc, 60)[1] for proc in procs
    ]


def wait_showing(
    predicate: Any, timeout: float, what: str, *procs: subprocess.Popen[str] | None
) -> None:
    """:func:`wait_for`, failing with what the workers printed (a loaded machine may take
    a while to start them)."""
    try:
        wait_for(predicate, timeout, what)
    except pytest.fail.Exception:
        outputs = stop(*(p for p in procs if p is not None))
        pytest.fail(f"timed out after {timeout}s waiting for {what}:\n" + "\n".join(outputs))


def test_a_task_whose_worker_is_sigkilled_completes_as_attempt_two_once(
    pooled: Pooler, tmp_path: Path
) -> None:
    """The ``django.tasks`` contract's crash case, through the pooler."""
    alias = pooled.alias
    env = {"PIKKU_TEST_STEP_LEASE_MS": str(LEASE_MS), "PIKKU_TEST_POLL": "0.2"}
    started, tag = tmp_path / "started", uuid.uuid4().hex
    result = defs.block_until_killed.enqueue(str(started), alias, tag)
    first = pooled_worker(pooled, "--concurrency", "1", **env)
    second = None
    try:
        wait_showing(started.exists, 180, "attempt 1 of the task to start", first)
        assert int(started.read_text()) == first.pid
        second = pooled_worker(pooled, "--concurrency", "1", **env)
        wait_showing(lambda: up(alias, second), 180, "the second worker to be up", first, second)
        os.kill(first.pid, signal.SIGKILL)

        def done() -> bool:
            result.refresh()
            return result.is_finished

        wait_showing(done, LEASE_MS / 1000 + 90, "the task to finish on the other worker", second)
    finally:
        outputs = stop(*(p for p in (first, second) if p is not None))
    assert result.status == TaskResultStatus.SUCCESSFUL, (result.errors, outputs)
    assert result.return_value == second.pid
    assert result.attempts == 2
    attempts = StepAttempt.objects.using(alias).filter(step__run_id=result.id)
    assert attempts.filter(status=StepStatus.SUCCEEDED).count() == 1
    assert list(attempts.values_list("attempt", flat=True).order_by("attempt")) == [1, 2]
    effects = Effect.objects.using(alias).filter(run_id=tag)
    assert sorted(effects.values_list("attempt_pid", flat=True)) == sorted([first.pid, second.pid])


def test_a_frozen_workers_transactional_step_is_taken_over_and_its_late_settle_refused(
    pooled: Pooler, tmp_path: Path
) -> None:
    """tests/test_crash_recovery.py's paused worker, through the pooler, with a
    transactional step: its write, still uncommitted in the frozen worker's transaction
    (a server session the pooler keeps for it), is rolled back once it is refused."""
    alias = pooled.alias
    env = {"PIKKU_TEST_STEP_LEASE_MS": str(LEASE_MS), "PIKKU_TEST_POLL": "0.2"}
    started, tag = tmp_path / "started", uuid.uuid4().hex
    run = WorkflowEngine(alias).start(
        "testapp.blocked",
        {
            "started": str(started),
            "step": "testapp.tx_block_first",
            "db": alias,
            "run": tag,
            "block": 2 * LEASE_MS / 1000,
        },
    )
    first = pooled_worker(pooled, "--concurrency", "1", **env)
    second = None
    try:
        wait_showing(started.exists, 180, "attempt 1 of the step to write and block", first)
        assert int(started.read_text()) == first.pid
        os.kill(first.pid, signal.SIGSTOP)
        second = pooled_worker(pooled, "--concurrency", "1", **env)
        wait_showing(
            lambda: run_state(alias, run.id).status == RunStatus.COMPLETED,
            LEASE_MS / 1000 + 180,
            "the second worker to take the step over and finish it",
            first,
            second,
        )
        # Resumed, the frozen attempt's function returns and its settle (and any lease
        # renewal) must be refused: the SIGTERM in stop() lets that step in flight finish
        # before the worker exits.
        os.kill(first.pid, signal.SIGCONT)
    finally:
        outputs = stop(*(p for p in (first, second) if p is not None))
    assert "superseded" in outputs[0], outputs[0]
    step = WorkflowStep.objects.using(alias).get(run_id=run.id, name="work")
    assert step.status == StepStatus.SUCCEEDED
    assert step.attempt == 2
    assert step.result["pid"] == second.pid
    assert run_state(alias, run.id).output["pid"] == second.pid
    history = list(step.attempts.using(alias).order_by("attempt").values_list("status", flat=True))
    assert history == [AttemptStatus.SUPERSEDED, StepStatus.SUCCEEDED]
    stale = step.attempts.using(alias).get(attempt=1)
    assert stale.result is None
    # The transactional effect is there once, the second worker's: the frozen attempt's
    # write was rolled back with its refused settle.
    effects = list(
        Effect.objects.using(alias).filter(run_id=tag).values_list("attempt_pid", flat=True)
    )
    assert effects == [second.pid], outputs


def test_workers_complete_every_run_once_within_the_queue_limits(
    pooled: Pooler, tmp_path: Path
) -> None:
    alias = pooled.alias
    concurrency, rate, period, runs = 2, 3, 2.0, 6
    engine = get_engine()
    for n in range(4):
        start_workflow("testapp.three_records", {"db": alias, "run": f"r{n}"})
    for n in range(runs):
        engine.start(
            "testapp.slow_one", {"started": str(tmp_path / f"t{n}"), "seconds": 0.3}, queue="tight"
        )
        engine.start(
            "testapp.slow_one", {"started": str(tmp_path / f"r{n}"), "seconds": 0}, queue="rated"
        )
    env = {
        "PIKKU_TEST_QUEUES": json.dumps(
            {"tight": {"concurrency": concurrency}, "rated": {"rate": f"{rate}/{period:g}s"}}
        ),
        "PIKKU_TEST_POLL": "0.1",
    }
    workers = [pooled_worker(pooled, "--until-idle", "--concurrency", "4", **env) for _ in "ab"]
    for code, out in [finish(w, 240) for w in workers]:
        assert code == 0, out
    statuses = set(WorkflowRun.objects.using(alias).values_list("status", flat=True))
    assert statuses == {RunStatus.COMPLETED}
    effects = sorted(Effect.objects.using(alias).values_list("run_id", "step"))
    assert effects == sorted((f"r{n}", s) for n in range(4) for s in "abc")  # each step once
    until = datetime.now(UTC)
    assert _intervals(_attempts(alias, step__queue="tight"), until) <= concurrency
    starts = [s for s, _ in _attempts(alias, step__queue="rated")]
    assert len(starts) == runs
    for first, later in zip(starts, starts[rate:], strict=False):
        assert later - first >= timedelta(seconds=period) - STAMP_SLACK, starts


def test_each_cron_tick_starts_one_run(pooled: Pooler, tmp_path: Path) -> None:
    alias = pooled.alias
    env = _env(alias, tmp_path)
    workers = [pooled_worker(pooled, "--concurrency", "2", **env) for _ in "ab"]
    try:
        wait_showing(lambda: len(_runs(alias)) >= 4, 180, "four ticks started", *workers)
        time.sleep(1)  # both workers look for the next tick too
    finally:
        outputs = stop(*workers)
    keys = _runs(alias)
    ticks = sorted(_tick_of(key) for key in keys)
    assert len(ticks) == len(set(ticks)), outputs  # one run a tick
    expected = [ticks[0] + timedelta(seconds=n) for n in range(len(ticks))]
    assert ticks == expected  # none missing between the first and the last
    assert sorted(keys) == sorted(tick_key(NAME, tick) for tick in expected)


@pytest.mark.usefixtures("enabled")
def test_webhook_deliveries_are_stored_once_and_run(pooled: Pooler, client: Client) -> None:
    alias = pooled.alias
    webhook_defs.handled.clear()
    # Through the transaction pooler each request's statements run on other server sessions.
    answers = [post(client, b'{"ref": "main"}', delivery="v-1").json() for _ in range(3)]
    assert answers == [{"received": 1}, {"received": 0}, {"received": 0}]
    assert post(client, b'{"number": 3}', event="issues", delivery="v-2").json() == {"received": 1}
    assert WebhookReceipt.objects.using(alias).count() == 2
    assert start_waiting_runs(get_engine()) == 2
    get_engine().run_until_idle()
    runs = {r.workflow: r for r in WorkflowRun.objects.using(alias)}
    assert runs["wh.deploy"].status == RunStatus.COMPLETED
    assert runs["wh.deploy"].output == {"deployed": "main", "delivery": "v-1"}
    assert runs[DISPATCH_WORKFLOW].status == RunStatus.COMPLETED
    assert [e["data"] for e in webhook_defs.handled] == [{"number": 3}]
