"""Log records name their run, step and attempt; the worker reports its progress."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pikku_django.leases import InMemoryLeaseService
from pikku_django.workflows import FakeClock, WorkflowEngine, step, workflow
from pikku_django.workflows.worker.loop import Worker

pytestmark = pytest.mark.django_db(transaction=True)

attempts: list[int] = []


@step(name="log.flaky", retries=2, retry_delay=0)
def flaky(data: Any) -> str:
    attempts.append(1)
    if len(attempts) == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


@workflow(name="log.story")
def story(ctx: Any, input: Any) -> Any:
    return ctx.do("flaky", flaky)


def test_step_records_carry_run_step_and_attempt(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pikku_django")
    attempts.clear()
    engine = WorkflowEngine(leases=InMemoryLeaseService(), clock=FakeClock())
    run = engine.start("log.story")
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == "completed"
    failed = [r for r in caplog.records if "failed" in r.getMessage() and hasattr(r, "step")]
    assert failed, caplog.text
    record = failed[0]
    assert (record.run_id, record.step, record.attempt) == (str(run.id), "flaky", 1)
    assert f"run_id={run.id} step=flaky attempt=1" in record.getMessage()
    finished = [r for r in caplog.records if "completed" in r.getMessage()]
    assert finished[0].run_id == str(run.id)


def test_worker_logs_progress(caplog: pytest.LogCaptureFixture, settings: Any) -> None:
    settings.PIKKU = {"WORKER_PROGRESS_INTERVAL": 0.01}
    caplog.set_level(logging.INFO, logger="pikku_django")
    attempts.clear()
    engine = WorkflowEngine(leases=InMemoryLeaseService())
    engine.start("log.story")
    worker = Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05)
    worker.run()
    assert worker.counts["claimed"] == 2
    assert worker.counts["retried"] == 1
    assert worker.counts["finished"] == 1
    lines = [r.getMessage() for r in caplog.records if "progress" in r.getMessage()]
    assert lines
    assert "claimed 2, finished 1, failed 0, retried 1, recovered 0" in lines[-1]
