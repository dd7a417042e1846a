"""Cancel wins over a running transactional step: its settle checks the run in the
same transaction, and the step's writes roll back."""

from __future__ import annotations

import threading
from typing import Any

from django.contrib.auth.models import Group
from django.db import connections

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepStatus
from pikku_django.workflows import WorkflowContext, WorkflowEngine, step, workflow
from tests.conftest import database_alias, on_databases

ENGINES: dict[str, WorkflowEngine] = {}


@step(name="ct_write_then_cancelled", transactional=True)
def write_then_cancelled(data: dict[str, Any]) -> str:
    alias = data["alias"]
    Group.objects.using(alias).create(name=data["group"])
    if data["cancel"]:
        # Cancelled from elsewhere (its own connection) while the step runs.
        def cancel() -> None:
            try:
                ENGINES[alias].cancel(data["run"])
            finally:
                connections.close_all()

        thread = threading.Thread(target=cancel)
        thread.start()
        thread.join(30)
    return "written"


@workflow(name="ct_run")
def run_one(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("write", "ct_write_then_cancelled", {**inp, "run": str(ctx.run_id)})


# SQLite lets one writer in at a time: a cancel cannot commit while the step's
# transaction is open, so the race exists only on PostgreSQL and MariaDB.
@on_databases("postgres", "mariadb")
def test_a_run_cancelled_during_its_transactional_step_keeps_none_of_its_writes(
    vendor: str,
) -> None:
    alias = database_alias(vendor)
    engine = ENGINES[alias] = WorkflowEngine(alias, leases=InMemoryLeaseService())
    run = engine.start(run_one, {"alias": alias, "group": f"ct-{vendor}", "cancel": True})
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.CANCELLED
    assert not Group.objects.using(alias).filter(name=f"ct-{vendor}").exists()
    row = engine.steps().get(run_id=run.id)
    assert row.status == StepStatus.FAILED
    assert row.error["code"] == "RUN_STOPPED"
    attempt = engine.attempts().get(step_id=row.id)
    assert attempt.status == StepStatus.FAILED
    assert attempt.finished_at is not None


@on_databases("sqlite", "postgres", "mariadb")
def test_a_transactional_step_of_a_running_run_commits_its_writes(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = ENGINES[alias] = WorkflowEngine(alias, leases=InMemoryLeaseService())
    run = engine.start(run_one, {"alias": alias, "group": f"ok-{vendor}", "cancel": False})
    engine.run_until_idle()
    assert engine.get_run(run.id).output == "written"
    assert Group.objects.using(alias).filter(name=f"ok-{vendor}").exists()
