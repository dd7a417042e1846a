"""Send-with-start under concurrent senders, and waiting for a run's result
(``wait_for_run`` and ``await_run``) on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest
from django.db import connections

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, WorkflowEvent, WorkflowRun
from pikku_django.wakeups import idle_listeners
from pikku_django.workflows import (
    EventOutcome,
    RunWaitTimeoutError,
    WorkflowContext,
    WorkflowEngine,
    WorkflowRunNotFoundError,
    workflow,
)
from pikku_django.workflows import api as workflows_api
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")
SENDERS = 8


@workflow(name="rw_collect")
def rw_collect(ctx: WorkflowContext, inp: Any) -> Any:
    got = [ctx.wait_for_event("item") for _ in range(inp["expect"])]
    return sorted(got)


@pytest.fixture(scope="module", autouse=True)
def _listeners_closed() -> Any:
    """The waits' LISTEN connection is closed before the test databases are dropped."""
    yield
    assert idle_listeners(30)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService())


@pytest.mark.parametrize(
    "vendor",
    [pytest.param(v, marks=db_mark(v), id=v) for v in ("postgres", "mariadb")],
)
def test_send_with_start_under_eight_senders_starts_one_run(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    key = f"cart-{uuid.uuid4().hex}"
    go = threading.Barrier(SENDERS)
    results: list[Any] = []
    errors: list[BaseException] = []

    def sender(i: int) -> None:
        try:
            go.wait(20)
            results.append(
                engine.events.send_with_start(
                    "rw_collect", key, "item", i, input={"expect": SENDERS}, event_id=f"item-{i}"
                )
            )
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    runs = list(WorkflowRun.objects.using(alias).filter(workflow="rw_collect", idempotency_key=key))
    assert len(runs) == 1
    assert sum(r.started for r in results) == 1
    assert {r.run_id for r in results} == {runs[0].id}
    assert {r.outcome for r in results} == {EventOutcome.KEPT}
    assert WorkflowEvent.objects.using(alias).filter(run_id=runs[0].id).count() == SENDERS
    engine.run_until_idle()
    done = engine.get_run(runs[0].id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output == list(range(SENDERS))


def test_send_with_start_reaches_a_running_run(engine: WorkflowEngine) -> None:
    key = uuid.uuid4().hex
    first = engine.events.send_with_start("rw_collect", key, "item", 1, input={"expect": 2})
    engine.run_until_idle()
    second = engine.events.send_with_start("rw_collect", key, "item", 2, input={"expect": 99})
    assert (first.started, second.started) == (True, False)
    assert second.outcome == EventOutcome.DELIVERED
    engine.run_until_idle()
    done = engine.get_run(first.run_id)
    assert (done.input, done.output) == ({"expect": 2}, [1, 2])


def _finish_later(engine: WorkflowEngine, run_id: uuid.UUID, after: float) -> threading.Thread:
    def finish() -> None:
        try:
            time.sleep(after)
            engine.events.send(run_id, "item", "x")
            engine.run_until_idle()
        finally:
            connections.close_all()

    thread = threading.Thread(target=finish)
    thread.start()
    return thread


def test_wait_for_run_returns_the_ended_run(engine: WorkflowEngine) -> None:
    run = engine.start(rw_collect, {"expect": 1})
    engine.run_until_idle()
    thread = _finish_later(engine, run.id, 0.3)
    done = engine.events.wait_for_run(run.id, timeout=60)
    thread.join(60)
    assert done.status == RunStatus.COMPLETED
    assert done.output == ["x"]
    assert engine.events.wait_for_run(run.id, timeout=0).output == ["x"]  # ended: at once


def test_wait_for_run_times_out_and_refuses_unknown_runs(engine: WorkflowEngine) -> None:
    run = engine.start(rw_collect, {"expect": 1})
    engine.run_until_idle()
    with pytest.raises(RunWaitTimeoutError) as caught:
        engine.events.wait_for_run(run.id, timeout=0.3)
    assert (caught.value.run_id, caught.value.status) == (run.id, RunStatus.RUNNING)
    with pytest.raises(WorkflowRunNotFoundError):
        engine.events.wait_for_run(uuid.uuid4(), timeout=1)
    with pytest.raises(ValueError, match="timeout"):
        engine.events.wait_for_run(run.id, timeout=-1)


def test_a_cancelled_run_ends_the_wait(engine: WorkflowEngine) -> None:
    run = engine.start(rw_collect, {"expect": 1})
    engine.run_until_idle()

    def cancel() -> None:
        try:
            time.sleep(0.3)
            engine.cancel(run.id)
        finally:
            connections.close_all()

    thread = threading.Thread(target=cancel)
    thread.start()
    assert engine.events.wait_for_run(run.id, timeout=60).status == RunStatus.CANCELLED
    thread.join(60)


def test_await_run_is_the_async_twin(
    engine: WorkflowEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workflows_api, "_engine", engine)
    run = engine.start(rw_collect, {"expect": 1})
    engine.run_until_idle()
    thread = _finish_later(engine, run.id, 0.3)

    async def main() -> WorkflowRun:
        return await workflows_api.await_run(run.id, 60)

    done = asyncio.run(main())
    thread.join(60)
    assert done.output == ["x"]


@pytest.mark.parametrize("vendor", [pytest.param("postgres", marks=db_mark("postgres"))])
def test_postgres_wakes_the_wait_by_notify(vendor: str) -> None:
    """With a poll far longer than the test, the run's end is seen at once: NOTIFY."""
    engine = WorkflowEngine(database_alias(vendor), leases=InMemoryLeaseService())
    run = engine.start(rw_collect, {"expect": 1})
    engine.run_until_idle()
    done: list[WorkflowRun] = []

    def wait() -> None:
        try:
            done.append(engine.events.wait_for_run(run.id, timeout=3600, poll_interval=3600))
        finally:
            connections.close_all()

    thread = _finish_later(engine, run.id, 0.5)
    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(60)
    thread.join(60)
    # Reading the run once an hour, the wait ended this soon only because it was woken.
    assert not waiter.is_alive(), "the run's end did not wake the wait"
    assert done[0].status == RunStatus.COMPLETED
