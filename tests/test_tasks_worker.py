"""django.tasks through real ``pikku_worker`` processes: a task whose worker is SIGKILLed.

The task's attempt 1 is killed mid-call; once its step lease lapses another worker
takes the task as attempt 2, which completes it, once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pikku_django.models import StepAttempt, StepStatus
from pikku_django.tasks.compat import TaskResultStatus
from pikku_django.workflows.api import reset_engine
from tests import test_tasks_defs as defs
from tests.conftest import database_alias, on_databases
from tests.test_crash_recovery import up
from tests.test_worker import finish, wait_for, worker_process
from tests.testapp.models import Effect

LEASE_MS = 3_000


@pytest.fixture
def alias(vendor: str, settings: Any) -> Iterator[str]:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "LEASE_BACKEND": "memory"}
    reset_engine()
    yield alias
    reset_engine()


def task_worker(alias: str) -> subprocess.Popen[str]:
    return worker_process(
        alias,
        "--concurrency",
        "1",
        PIKKU_TEST_STEP_LEASE_MS=str(LEASE_MS),
        PIKKU_TEST_POLL="0.2",
    )


def stop(*procs: subprocess.Popen[str]) -> list[str]:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    return [finish(proc, 60)[1] for proc in procs]


@on_databases("postgres", "mariadb")
def test_a_task_whose_worker_is_sigkilled_completes_as_attempt_two_once(
    vendor: str, alias: str, tmp_path: Path
) -> None:
    started, tag = tmp_path / "started", uuid.uuid4().hex
    result = defs.block_until_killed.enqueue(str(started), alias, tag)
    first = task_worker(alias)
    second = None
    try:
        wait_for(started.exists, 60, "attempt 1 of the task to start")
        assert int(started.read_text()) == first.pid
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING
        second = task_worker(alias)
        wait_for(lambda: up(alias, second), 60, "the second worker to be up before the kill")
        os.kill(first.pid, signal.SIGKILL)

        def done() -> bool:
            result.refresh()
            return result.is_finished

        wait_for(done, LEASE_MS / 1000 + 45, "the task to finish on the other worker")
    finally:
        outputs = stop(*(p for p in (first, second) if p is not None))
    assert result.status == TaskResultStatus.SUCCESSFUL, (result.errors, outputs)
    assert result.return_value == second.pid
    assert result.attempts == 2
    assert len(set(result.worker_ids)) == 2
    assert f":{first.pid}:" in result.worker_ids[0]
    assert f":{second.pid}:" in result.worker_ids[1]
    assert result.errors == []  # attempt 1 raised nothing: it lost its worker
    attempts = StepAttempt.objects.using(alias).filter(step__run_id=result.id)
    assert attempts.filter(status=StepStatus.SUCCEEDED).count() == 1
    assert list(attempts.values_list("attempt", flat=True).order_by("attempt")) == [1, 2]
    effects = Effect.objects.using(alias).filter(run_id=tag)
    assert sorted(effects.values_list("attempt_pid", flat=True)) == sorted([first.pid, second.pid])
