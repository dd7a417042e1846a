"""A worker thread keeps its connection with Django's default ``CONN_MAX_AGE = 0`` and
replaces it only when it breaks, on PostgreSQL and MariaDB."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import DatabaseError, connections

from pikku_django.models import RunStatus
from pikku_django.workflows import WorkflowEngine, step, workflow
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.worker._connections import release_connections
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases

PIDS: dict[str, list[int]] = {}
PID_SQL = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
KILL_SQL = {"postgresql": "SELECT pg_terminate_backend(%s)", "mysql": "KILL %s"}


def _backend_pid(alias: str) -> int:
    conn = connections[alias]
    with conn.cursor() as cursor:
        cursor.execute(PID_SQL[conn.vendor])
        return int(cursor.fetchone()[0])


@step(name="cma_pid")
def record_pid(data: dict[str, Any]) -> int:
    pid = _backend_pid(data["db"])
    PIDS.setdefault(data["tag"], []).append(pid)
    return pid


@workflow(name="cma_five_steps")
def five_steps(ctx: WorkflowContext, inp: dict[str, Any]) -> list[int]:
    return [ctx.do(f"s{n}", record_pid, inp) for n in range(5)]


@on_databases("postgres", "mariadb")
def test_a_worker_thread_keeps_its_connection_with_conn_max_age_0(vendor: str) -> None:
    alias = database_alias(vendor)
    assert connections[alias].settings_dict["CONN_MAX_AGE"] == 0  # Django's default
    engine = WorkflowEngine(alias)
    tag = f"keep-{vendor}"
    runs = [engine.start(five_steps, {"db": alias, "tag": tag}).id for _ in range(2)]
    Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0).run()
    for run_id in runs:
        assert engine.get_run(run_id).status == RunStatus.COMPLETED
    # Ten steps, each its own unit of work, all on the thread's one connection.
    assert len(PIDS[tag]) == 10
    assert len(set(PIDS[tag])) == 1


def _in_thread(fn: Any) -> Any:
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    if errors:
        raise errors[0]
    return result[0]


@on_databases("postgres", "mariadb")
def test_a_broken_connection_is_closed_and_replaced(vendor: str) -> None:
    alias = database_alias(vendor)

    def scenario() -> tuple[int, int, int, bool]:
        first = _backend_pid(alias)
        release_connections()
        kept = _backend_pid(alias)
        # Another connection ends this one, and the next query on it fails.
        killer = connections.create_connection(alias)
        try:
            with killer.cursor() as cursor:
                cursor.execute(KILL_SQL[killer.vendor], [kept])
        finally:
            killer.close()
        conn = connections[alias]
        with pytest.raises(DatabaseError):
            _backend_pid(alias)
        assert conn.errors_occurred or conn.connection is None
        release_connections()
        closed = conn.connection is None
        return first, kept, _backend_pid(alias), closed

    first, kept, replaced, closed = _in_thread(scenario)
    assert first == kept
    assert closed
    assert replaced != kept


@on_databases("postgres")
def test_a_positive_conn_max_age_still_applies(vendor: str) -> None:
    alias = database_alias(vendor)

    def scenario() -> bool:
        conn = connections[alias]
        _backend_pid(alias)
        conn.close_at = 0.0  # as if CONN_MAX_AGE had passed
        saved = conn.settings_dict["CONN_MAX_AGE"]
        conn.settings_dict["CONN_MAX_AGE"] = 60
        try:
            release_connections()
        finally:
            conn.settings_dict["CONN_MAX_AGE"] = saved
        return conn.connection is None

    assert _in_thread(scenario)
