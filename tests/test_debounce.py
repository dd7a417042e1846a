"""Debounced starts on SQLite, PostgreSQL and MariaDB.

Starts with one idempotency key inside the window make one run, which starts once
the window is quiet with the latest input; a start after its run began makes a new
run; concurrent starters (PostgreSQL, MariaDB) still make one run.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from tests.conftest import database_alias, db_mark, on_databases

VENDORS = ("sqlite", "postgres", "mariadb")


@step(name="db_echo")
def db_echo(data: Any) -> Any:
    return data


@workflow(name="db_sync")
def db_sync(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("echo", db_echo, inp)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine(alias: str, clock: FakeClock) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=clock)


def test_starts_inside_the_window_make_one_run_with_the_latest_input(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    first = engine.start(db_sync, {"n": 1}, idempotency_key="doc-1", debounce="5s")
    assert first.start_at == clock.now() + timedelta(seconds=5)
    for n in (2, 3):
        clock.advance(4)  # inside the window each time: it moves on
        again = engine.start(db_sync, {"n": n}, idempotency_key="doc-1", debounce="5s")
        assert again.id == first.id
        assert again.input == {"n": n}
        assert again.start_at == clock.now() + timedelta(seconds=5)
    assert engine.runs().filter(idempotency_key="doc-1").count() == 1
    clock.advance(timedelta(seconds=5) - timedelta(milliseconds=1))
    assert engine.claim_due_runs(5) == []  # not quiet for the window yet
    clock.advance(timedelta(milliseconds=1))
    engine.run_until_idle()
    run = engine.get_run(first.id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == {"n": 3}
    assert engine.runs().filter(workflow="db_sync").count() == 1


def test_a_start_after_the_window_makes_a_new_run(engine: WorkflowEngine, clock: FakeClock) -> None:
    first = engine.start(db_sync, "a", idempotency_key="doc-2", debounce=5)
    clock.advance(6)
    engine.run_until_idle()
    assert engine.get_run(first.id).output == "a"
    second = engine.start(db_sync, "b", idempotency_key="doc-2", debounce=5)
    assert second.id != first.id
    assert second.idempotency_key == "doc-2"
    assert engine.get_run(first.id).idempotency_key is None  # the key moved on
    # A window that passed before any worker claimed the run: a new run too, and
    # the first still starts with its own input.
    clock.advance(6)
    third = engine.start(db_sync, "c", idempotency_key="doc-2", debounce=5)
    assert third.id not in (first.id, second.id)
    clock.advance(6)
    engine.run_until_idle()
    outputs = {engine.get_run(r.id).output for r in (first, second, third)}
    assert outputs == {"a", "b", "c"}


def test_a_claimed_run_is_not_changed_by_a_later_start(
    engine: WorkflowEngine, clock: FakeClock
) -> None:
    first = engine.start(db_sync, "a", idempotency_key="doc-3", debounce=5)
    clock.advance(5)
    assert engine.claim_due_runs(1) == [first.id]  # a worker took its first pass
    later = engine.start(db_sync, "b", idempotency_key="doc-3", debounce=5)
    assert later.id != first.id
    assert engine.get_run(first.id).input == "a"


def test_bad_debounce_is_refused_and_starts_nothing(engine: WorkflowEngine) -> None:
    before = engine.runs().count()
    with pytest.raises(ValueError, match="idempotency_key"):
        engine.start(db_sync, 1, debounce="5s")
    with pytest.raises(ValueError, match="inline"):
        engine.start(db_sync, 1, idempotency_key="k", debounce="5s", inline=True)
    with pytest.raises(ValueError, match="debounce"):
        engine.start(db_sync, 1, idempotency_key="k", debounce="soon")
    with pytest.raises(ValueError, match="more than 0"):
        engine.start(db_sync, 1, idempotency_key="k", debounce=0)
    assert engine.runs().count() == before


@on_databases("postgres", "mariadb")
def test_concurrent_starters_make_one_run(vendor: str) -> None:
    engine = WorkflowEngine(database_alias(vendor), leases=InMemoryLeaseService())
    barrier = threading.Barrier(8)
    ids: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def starter(n: int) -> None:
        try:
            barrier.wait(30)
            for round_ in range(5):
                run = engine.start(
                    db_sync, {"n": n, "round": round_}, idempotency_key="burst", debounce="1min"
                )
                with lock:
                    ids.append(run.id)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=starter, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert len(ids) == 40
    assert len(set(ids)) == 1
    (run,) = engine.runs().filter(workflow="db_sync", idempotency_key="burst")
    assert run.id == ids[0]
    assert run.input["round"] in range(5)
