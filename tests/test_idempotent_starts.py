"""Concurrent starts of one idempotency key inside the callers' own transactions: each
returns the one run, on every database, and each caller's other writes in the same
transaction are kept (on MariaDB a deadlock would roll the caller's whole transaction
back, so the start must not deadlock, not only be retried)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connections, transaction

from pikku_django.leases import InMemoryLeaseService
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")
THREADS = 8
ROUNDS = 3


@step(name="idem.echo")
def echo(value: Any) -> Any:
    return value


@workflow(name="idem.one")
def one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("only", echo, inp)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


def _start_together(
    engine: WorkflowEngine, alias: str, key: str, tag: str, **options: Any
) -> list[Any]:
    """``THREADS`` threads, each in its own atomic block that first writes a group of
    its own, start ``key`` at once: what each got (a run id or an exception)."""
    got: list[Any] = [None] * THREADS
    barrier = threading.Barrier(THREADS)

    # SQLite's transactions take its one write lock as they begin (IMMEDIATE): its
    # threads meet before their blocks, the others inside them, after their own write.
    serial = connections[alias].vendor == "sqlite"

    def start(i: int) -> None:
        try:
            if serial:
                barrier.wait(30)
            with transaction.atomic(using=alias):
                Group.objects.using(alias).create(name=f"{tag}-{i}")
                if not serial:
                    barrier.wait(30)
                got[i] = engine.start(one, i, idempotency_key=key, **options).id
        except BaseException as exc:
            got[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return got


def test_concurrent_idempotent_starts_in_atomic_blocks_all_return_the_one_run(
    alias: str,
) -> None:
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())
    for round_ in range(ROUNDS):
        key, tag = f"key-{uuid.uuid4().hex}", f"g{round_}-{uuid.uuid4().hex[:12]}"
        got = _start_together(engine, alias, key, tag)
        errors = [g for g in got if not isinstance(g, uuid.UUID)]
        assert not errors, errors
        assert len(set(got)) == 1
        runs = engine.runs().filter(workflow="idem.one", idempotency_key=key)
        assert list(runs.values_list("id", flat=True)) == [got[0]]
        # Every caller's own write in the same transaction was kept.
        groups = Group.objects.using(alias).filter(name__startswith=f"{tag}-")
        assert groups.count() == THREADS


def test_concurrent_debounced_starts_in_atomic_blocks_all_return_the_one_run(alias: str) -> None:
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())
    key, tag = f"key-{uuid.uuid4().hex}", f"d-{uuid.uuid4().hex[:12]}"
    got = _start_together(engine, alias, key, tag, debounce=60)
    errors = [g for g in got if not isinstance(g, uuid.UUID)]
    assert not errors, errors
    assert len(set(got)) == 1
    run = engine.runs().get(workflow="idem.one", idempotency_key=key)
    assert run.id == got[0]
    assert run.input in range(THREADS)  # one of the starts' input, the last to write it
    assert Group.objects.using(alias).filter(name__startswith=f"{tag}-").count() == THREADS


#: Sessions of this test's database waiting in a start: on a row lock (on MariaDB, in
#: its insert of a run, or on the key's named lock), by vendor.
WAITING_SQL = {
    "mysql": (
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
        "AND (STATE = 'User lock' OR INFO LIKE 'INSERT INTO `pikku_workflow_run`%')"
    ),
    "postgresql": (
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    ),
}


def _waiting(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "postgresql":
            # The activity view is read once per transaction unless cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(WAITING_SQL[connections[alias].vendor])
        row = cursor.fetchone()
        return int(row[0]) if row else 0


class _RolledBack(Exception):
    """Rolls the first start's transaction back."""


def _begin(engine: WorkflowEngine, how: str, data: Any, key: str) -> uuid.UUID:
    """Start a run of ``one`` with ``key``: as a caller starts it, or as an intake
    creates it in the caller's transaction."""
    if how == "start":
        return engine.start(one, data, idempotency_key=key).id
    return engine.create_run("idem.one", data, idempotency_key=key).id


@pytest.mark.parametrize("how", ["start", "create_run"])
@pytest.mark.parametrize(
    "vendor", [pytest.param(v, marks=db_mark(v), id=v) for v in ("postgres", "mariadb")]
)
def test_starts_waiting_on_a_key_whose_first_start_rolls_back_all_return_one_run(
    vendor: str, how: str
) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())
    key, tag = f"key-{uuid.uuid4().hex}", f"rb-{uuid.uuid4().hex[:12]}"
    waiters = THREADS - 1
    started = threading.Event()
    got: list[Any] = [None] * waiters

    def first() -> None:
        try:
            with transaction.atomic(using=alias):
                _begin(engine, how, "first", key)
                started.set()
                # Until every other start waits on this one's key (or a while passed).
                for _ in range(400):
                    if _waiting(alias) >= waiters:
                        break
                    threading.Event().wait(0.05)
                raise _RolledBack()
        except _RolledBack:
            pass
        finally:
            started.set()
            connections.close_all()

    def start(i: int) -> None:
        try:
            started.wait(60)
            with transaction.atomic(using=alias):
                Group.objects.using(alias).create(name=f"{tag}-{i}")
                got[i] = _begin(engine, how, i, key)
        except BaseException as exc:
            got[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=first)]
    threads += [threading.Thread(target=start, args=(i,)) for i in range(waiters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = [g for g in got if not isinstance(g, uuid.UUID)]
    assert not errors, errors
    assert len(set(got)) == 1
    runs = engine.runs().filter(workflow="idem.one", idempotency_key=key)
    assert list(runs.values_list("id", flat=True)) == [got[0]]
    assert Group.objects.using(alias).filter(name__startswith=f"{tag}-").count() == waiters
