"""Worker logs: the workflow on every line about a run, each id once, failed steps with
their exception type and attempt, a JSON format, and a worker process's stderr."""

from __future__ import annotations

import json
import logging
import signal
from typing import Any

import pytest

from pikku_django.logging import (
    JsonFormatter,
    LogFormat,
    configure_worker_logging,
    level_for,
)
from pikku_django.models import RunStatus
from pikku_django.workflows import WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.logcontext import Lazy, log_context, workflow_logger
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process

ATTEMPTS: dict[str, int] = {}


@step(name="wiring_logs.charge", retries=2, retry_delay=0)
def charge(data: dict[str, Any]) -> str:
    ATTEMPTS[data["tag"]] = ATTEMPTS.get(data["tag"], 0) + 1
    if ATTEMPTS[data["tag"]] == 1:
        raise KeyError("amount")
    return "charged"


@workflow(name="wiring_logs.checkout")
def checkout(ctx: WorkflowContext, input: dict[str, Any]) -> str:
    return str(ctx.do("charge", "wiring_logs.charge", input))


def messages(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("pikku_django")]


@pytest.mark.django_db(transaction=True)
def test_a_run_logs_its_start_failed_step_and_end_with_its_workflow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pikku_django")
    engine = WorkflowEngine()
    run = engine.start("wiring_logs.checkout", {"tag": "story"})
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    about_run = [r for r in messages(caplog) if getattr(r, "run_id", None) == str(run.id)]
    lines = [r.getMessage() for r in about_run]
    assert any(line.endswith("] Run started") for line in lines), lines
    assert any(line.endswith("] Run completed") for line in lines), lines
    (failed,) = [r for r in about_run if "Step failed" in r.getMessage()]
    assert failed.getMessage() == (
        f"[workflow=wiring_logs.checkout run_id={run.id} step=charge attempt=1] "
        "Step failed with KeyError: 'amount' (will retry)"
    )
    assert failed.levelno == logging.INFO  # another attempt follows
    for record in about_run:
        assert record.workflow == "wiring_logs.checkout", record.getMessage()  # type: ignore[attr-defined]
        assert record.getMessage().count(str(run.id)) == 1, record.getMessage()


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_is_a_warning_with_its_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pikku_django")
    engine = WorkflowEngine()
    run = engine.start("testapp.webhook_event", {"no": "data"})
    engine.run_until_idle()
    (line,) = [r for r in messages(caplog) if "Run failed" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert line.getMessage() == (
        f"[workflow=testapp.webhook_event run_id={run.id}] Run failed: KeyError: 'data'"
    )


def test_the_json_formatter_writes_the_fields_as_keys() -> None:
    logger = workflow_logger("pikku_django.tests")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger.logger.addHandler(handler)
    logger.logger.setLevel(logging.INFO)
    try:
        with log_context(workflow=Lazy(lambda: "shop.checkout"), run_id="r1", step="charge"):
            logger.info("Step failed with %s", "KeyError")
        try:
            raise ValueError("bad")
        except ValueError:
            logger.exception("Outside a run")
    finally:
        logger.logger.removeHandler(handler)
    first, second = (json.loads(JsonFormatter().format(r)) for r in records)
    assert first["message"] == "Step failed with KeyError"  # the fields are keys, not tags
    assert first["workflow"] == "shop.checkout"
    assert first["run_id"] == "r1"
    assert first["step"] == "charge"
    assert "attempt" not in first
    assert first["level"] == "INFO"
    assert first["logger"] == "pikku_django.tests"
    assert second["exception"]["type"] == "ValueError"
    assert "Traceback" in second["exception"]["traceback"]


def test_worker_logging_adds_one_stderr_handler_when_none_is_configured() -> None:
    bare_logger = logging.getLogger("pikku_django_wiring_bare")
    bare_logger.propagate = False  # nothing above it handles its records
    configure_worker_logging(2, LogFormat.JSON, name=bare_logger.name)
    configure_worker_logging(2, LogFormat.JSON, name=bare_logger.name)  # still one handler
    assert len(bare_logger.handlers) == 1
    assert isinstance(bare_logger.handlers[0].formatter, JsonFormatter)
    assert bare_logger.level == logging.DEBUG
    assert [level_for(v) for v in (0, 1, 2, 3)] == [
        logging.WARNING,
        logging.INFO,
        logging.DEBUG,
        logging.DEBUG,
    ]


@on_databases("postgres")
def test_a_worker_process_logs_start_runs_and_signals_as_json(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    env = {"DJANGO_SETTINGS_MODULE": "tests.wiring_worker_settings"}
    env["PIKKU_TEST_DEFAULT_LOGGING"] = "1"
    proc = worker_process(alias, "--log-format", "json", "--concurrency", "2", **env)
    try:
        ok = engine.start("testapp.webhook_event", {"data": "fine"})
        bad = engine.start("testapp.webhook_event", {"no": "data"})

        def settled() -> bool:
            done = engine.runs().filter(id__in=[ok.id, bad.id]).exclude(status="running")
            return done.count() == 2

        wait_for(settled, 60, "both runs to settle")
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, 60)
    assert code == 0, out
    entries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    text = [e["message"] for e in entries]
    from pikku_django import __version__

    (start,) = [e for e in entries if "started: database" in e["message"]]
    assert f"pikku_worker {__version__}" in start["message"]
    for part in (repr(alias), "postgresql", "queues all", "concurrency 2", "leases "):
        assert part in start["message"], start["message"]
    assert any(m.startswith("Received SIGTERM: finishing work in flight") for m in text), text
    assert any(m.endswith(" stopped") for m in text), text
    by_run = {
        (e["run_id"], e["message"]) for e in entries if e.get("workflow") == "testapp.webhook_event"
    }
    assert (str(ok.id), "Run completed") in by_run
    assert (str(bad.id), "Run failed: KeyError: 'data'") in by_run
