"""A database error in an orchestration pass never makes it loop forever, and a value
a database cannot store is refused the same way on every database."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connections

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepStatus
from pikku_django.workflows import (
    FakeClock,
    NotSerializableError,
    WorkflowContext,
    WorkflowEngine,
    step,
    workflow,
)
from pikku_django.workflows._dberrors import is_transient
from tests.conftest import database_alias, on_databases

VENDORS = ("sqlite", "postgres", "mariadb")
CALLS: list[str] = []


@workflow(name="pe_missing_table")
def missing_table(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    def before() -> str:
        CALLS.append("inline")
        return "done"

    ctx.do("before", before)
    with connections[inp["alias"]].cursor() as cursor:
        cursor.execute("SELECT * FROM pikku_no_such_table")
    return "unreachable"


@step(name="pe_nul_echo")
def nul_echo() -> str:
    return "a\x00b"


@step(name="pe_ok")
def ok() -> str:
    return "ok"


@workflow(name="pe_nul")
def nul(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    """Makes a value with a NUL character where ``inp["where"]`` says."""
    if inp["where"] == "step":
        return ctx.do("inline", lambda: "a\x00b")
    if inp["where"] == "queued":
        return ctx.do("queued", "pe_nul_echo")
    if inp["where"] == "resume":
        return ctx.suspend("waiting")
    if inp["where"] == "queued-ok":
        return ctx.do("queued", "pe_ok")
    return {"list": ["a\x00b"]}


def _engine(vendor: str) -> tuple[WorkflowEngine, FakeClock]:
    clock = FakeClock()
    return WorkflowEngine(database_alias(vendor), leases=InMemoryLeaseService(), clock=clock), clock


@on_databases(*VENDORS)
def test_a_workflow_whose_body_queries_a_missing_table_fails_within_bounded_tries(
    vendor: str, settings: Any
) -> None:
    settings.PIKKU = {**settings.PIKKU, "PASS_ERROR_TRIES": 3}
    engine, clock = _engine(vendor)
    CALLS.clear()
    run = engine.start(missing_table, {"alias": engine.using})
    passes = 0
    while engine.get_run(run.id).status == RunStatus.RUNNING:
        passes += engine.run_until_idle()
        clock.advance(60)
        assert passes < 20, "the run kept being passed"
    run = engine.get_run(run.id)
    assert run.status == RunStatus.FAILED
    assert "3 time(s) in a row" in run.error["message"]
    assert run.pass_errors == 3
    # The inline step before the error ran once: later passes replayed its result.
    assert CALLS == ["inline"]


@on_databases(*VENDORS)
def test_a_nul_character_is_refused_in_input_and_resume_data(vendor: str) -> None:
    engine, _ = _engine(vendor)
    with pytest.raises(NotSerializableError, match="NUL"):
        engine.start(nul, {"where": "output", "text": "a\x00b"})
    assert not engine.runs().exists()
    run = engine.start(nul, {"where": "resume"})
    engine.run_until_idle()
    with pytest.raises(NotSerializableError, match="NUL"):
        engine.resume(run.id, {"nested": ["a\x00b"]})
    assert engine.get_run(run.id).status == RunStatus.SUSPENDED


@pytest.mark.parametrize("where", ["output", "step", "queued"])
@on_databases(*VENDORS)
def test_a_nul_character_made_by_a_run_fails_it_for_good(vendor: str, where: str) -> None:
    engine, _ = _engine(vendor)
    run = engine.start(nul, {"where": where})
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert run.status == RunStatus.FAILED
    assert "NUL" in str(run.error)
    if where != "output":
        made = engine.steps().get(run_id=run.id)
        assert (made.status, made.attempt) == (StepStatus.FAILED, 1)  # not retried


def test_database_errors_are_classified() -> None:
    import sqlite3

    def wrapped(cause: Exception, cls: type[Exception] = OperationalError) -> Any:
        exc = cls(str(cause))
        exc.__cause__ = cause
        return exc

    assert is_transient(wrapped(sqlite3.OperationalError("database is locked")))
    assert not is_transient(wrapped(sqlite3.OperationalError("no such table: x")))
    from django.db import DataError, ProgrammingError

    assert not is_transient(wrapped(ValueError("x"), DataError))
    assert not is_transient(wrapped(ValueError("x"), ProgrammingError))


@on_databases(*VENDORS)
def test_a_deadlock_on_a_settle_is_retried_without_spending_an_attempt(
    vendor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    engine, _ = _engine(vendor)
    real = engine.store.settle
    failures = []

    def deadlocked_once(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(1)
            exc = OperationalError("database is locked (as a deadlock would be)")
            exc.__cause__ = sqlite3.OperationalError("database is locked")
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.store, "settle", deadlocked_once)
    run = engine.start(nul, {"where": "queued-ok"})
    engine.run_until_idle()
    assert failures == [1]
    row = engine.steps().get(run_id=run.id)
    assert (row.status, row.attempt) == (StepStatus.SUCCEEDED, 1)
    assert engine.get_run(run.id).status == RunStatus.COMPLETED
