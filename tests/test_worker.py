"""pikku_worker as users run it: a separate process on each database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from pikku_django.leases.database import close_database_lease_connections
from pikku_django.models import (
    Lease,
    RunStatus,
    StepStatus,
    WebhookReceipt,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.wakeups import WORK_CHANNEL as CHANNEL
from pikku_django.webhooks.sql import NewEvent, store_event
from pikku_django.workflows import WorkflowEngine
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases
from tests.testapp.models import Effect

ROOT = Path(__file__).resolve().parent.parent


on = on_databases


ALL = ("sqlite", "postgres", "mariadb")


def worker_process(alias: str, *args: str, **env: str) -> subprocess.Popen[str]:
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
        "PIKKU_TEST_ALIAS": alias,
        "PIKKU_TEST_DB_NAME": str(connections[alias].settings_dict["NAME"]),
        "PIKKU_TEST_DEFAULT_NAME": str(connections["default"].settings_dict["NAME"]),
        **env,
    }
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "django", "pikku_worker", *args],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"pikku_worker did not finish in {timeout}s:\n{out}")
    return proc.returncode, out


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def listening(alias: str) -> bool:
    """Whether a session on ``alias``'s database LISTENs for new work."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = %s",
            [f"LISTEN {CHANNEL}"],
        )
        return int(cursor.fetchone()[0]) > 0


@on(*ALL)
def test_worker_process_runs_every_step_once(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    runs = [engine.start("testapp.three_records", {"db": alias, "run": f"r{i}"}) for i in range(10)]
    code, out = finish(worker_process(alias, "--until-idle", "--concurrency", "3"))
    assert code == 0, out
    assert "Idle after" in out
    for run in runs:
        run.refresh_from_db(using=alias)
        assert run.status == RunStatus.COMPLETED, (run.error, out)
        assert [r["step"] for r in run.output] == ["a", "b", "c"]
    effects = Effect.objects.using(alias)
    assert effects.count() == 30
    assert len(set(effects.values_list("run_id", "step"))) == 30


@on(*ALL)
def test_sigterm_finishes_the_step_in_flight_and_exits_0(vendor: str, tmp_path: Path) -> None:
    alias = database_alias(vendor)
    started = tmp_path / "started"
    run = WorkflowEngine(alias).start("testapp.slow_one", {"started": str(started), "seconds": 1.5})
    proc = worker_process(alias)
    wait_for(started.exists, 60, "the slow step to start")
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, 60)
    assert code == 0, out
    step = WorkflowStep.objects.using(alias).get(run_id=run.id, name="slow")
    assert step.status == StepStatus.SUCCEEDED, out
    assert step.attempt == 1


@on("sqlite")
def test_sqlite_allows_one_worker_process(vendor: str) -> None:
    first = worker_process("default")
    try:
        held = Lease.objects.using("default").filter(key__startswith="pikku-worker:sqlite:")
        wait_for(held.exists, 60, "the first worker to take the worker lease")
        second = worker_process("default", "--until-idle")
        code, out = finish(second, 60)
        assert code != 0
        assert "Another pikku_worker is already running" in out
    finally:
        first.send_signal(signal.SIGTERM)
        code, out = finish(first, 60)
        assert code == 0, out


@on("postgres")
def test_notification_wakes_an_idle_worker_before_its_poll(vendor: str) -> None:
    alias = database_alias(vendor)
    proc = worker_process(alias, PIKKU_TEST_POLL="60")
    try:
        wait_for(lambda: listening(alias), 60, "the worker to LISTEN")
        time.sleep(1)  # its threads past their first look for work: idle, listening
        run = WorkflowEngine(alias).start("testapp.three_records", {"db": alias, "run": "n"})
        wait_for(
            lambda: WorkflowRun.objects.using(alias).get(id=run.id).status == RunStatus.COMPLETED,
            30,
            "the notified worker to finish the run (it polls only every 60s)",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, 60)
    assert code == 0, out


@on("postgres")
def test_worker_threads_leave_no_connections_behind(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    for i in range(8):
        engine.start("testapp.three_records", {"db": alias, "run": f"c{i}"})

    def sessions() -> set[int]:
        close_database_lease_connections()
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            return {int(row[0]) for row in cursor.fetchall()}

    # Compared as sets of backends: the announcer's thread may close the connection it
    # announced the starts on while the worker runs, which is not a leak. On a busy
    # machine it may also open one only after ``before`` (announcing the starts late);
    # it closes that a second after its last announcement, while a worker thread's
    # leaked connection stays: what is left is looked at until then (60 s hang guard).
    before = sessions()
    Worker(engine, concurrency=4, until_idle=True, poll_interval=0.1).run()
    assert WorkflowRun.objects.using(alias).filter(status=RunStatus.COMPLETED).count() == 8
    left = sessions() - before
    deadline = time.monotonic() + 60
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = sessions() - before
    assert left == set()


def stored_event(alias: str, provider_id: str, *, notify: bool = True) -> None:
    """A webhook event stored as the view stores one, waiting for its run."""
    new = NewEvent(
        source="wh-github",
        event="push",
        provider_id=provider_id,
        data_json=json.dumps({"n": provider_id}),
        workflow="testapp.webhook_event",
    )
    assert store_event(alias, new, notify=notify)


def run_of(alias: str, provider_id: str) -> WorkflowRun | None:
    receipt = WebhookReceipt.objects.using(alias).get(provider_id=provider_id)
    return (
        None if receipt.run_id is None else WorkflowRun.objects.using(alias).get(id=receipt.run_id)
    )


@on(*ALL)
def test_the_worker_starts_and_runs_stored_webhook_events(vendor: str) -> None:
    alias = database_alias(vendor)
    for n in range(5):
        stored_event(alias, f"w-{n}")
    Worker(WorkflowEngine(alias), concurrency=2, until_idle=True, poll_interval=0.1).run()
    for n in range(5):
        run = run_of(alias, f"w-{n}")
        assert run is not None
        assert (run.status, run.output) == (RunStatus.COMPLETED, {"n": f"w-{n}"})
    assert not WebhookReceipt.objects.using(alias).filter(input__isnull=False).exists()


@on("postgres")
def test_a_stored_webhook_event_wakes_an_idle_worker_before_its_poll(vendor: str) -> None:
    alias = database_alias(vendor)
    proc = worker_process(alias, PIKKU_TEST_POLL="60")
    try:
        wait_for(lambda: listening(alias), 60, "the worker to LISTEN")
        time.sleep(1)  # idle, listening; it looked for waiting events when it started
        stored_event(alias, "notified")

        def finished() -> bool:
            run = run_of(alias, "notified")
            return run is not None and run.status == RunStatus.COMPLETED

        wait_for(finished, 30, "the notified worker to start and finish the event's run")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, 60)
    assert code == 0, out


def test_help_explains_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        call_command("pikku_worker", "--help")
    out = capsys.readouterr().out
    for option in ("--concurrency", "--queue", "--until-idle", "--poll-interval", "SIGTERM"):
        assert option in out


@pytest.mark.django_db
def test_bad_options_are_clear_errors() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="concurrency"):
        call_command("pikku_worker", "--concurrency", "0")
    with pytest.raises(CommandError, match="poll-interval"):
        call_command("pikku_worker", "--poll-interval", "-1")
