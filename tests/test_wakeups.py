"""Wake-ups behind a transaction pooler (``PIKKU["DATABASE_POOLING"]``): workers and run
waits LISTEN over the alias ``PIKKU["LISTEN_DATABASES"]`` names, or, without one, poll
often (no LISTEN is made); announcing is unchanged. The system check says which.

Here the "pooled" alias is the suite's own PostgreSQL alias declared as pooled by
transaction, and the listen alias a second alias of the same database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core import checks
from django.db import connections
from django.db.backends.signals import connection_created

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus
from pikku_django.wakeups import (
    RUN_DONE_CHANNEL,
    idle_listeners,
    listen_alias,
    shared_listener,
    worker_poll_interval,
)
from pikku_django.wakeups.checks import check_wakeups
from pikku_django.workflows import WorkflowContext, WorkflowEngine, workflow
from pikku_django.workflows.api import reset_engine
from pikku_django.workflows.runs._waits import wait_for_run
from pikku_django.workflows.worker import _idle
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases

#: How long a test waits for what it expects before it fails: only a hang takes this long.
GUARD = 60.0
HOUR = 3600.0
DIRECT = "postgres_direct"


@workflow(name="wake_hello")
def wake_hello(ctx: WorkflowContext, inp: Any) -> str:
    return ctx.do("greet", lambda: "hello")


@pytest.fixture(autouse=True)
def _listeners_closed() -> Iterator[None]:
    """No shared LISTEN is left over from before a test, nor open after it (before the
    test databases are dropped)."""
    assert idle_listeners(30)
    yield
    assert idle_listeners(30)


def _wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + GUARD
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _add_alias(name: str, settings_dict: dict[str, Any]) -> None:
    django_settings.DATABASES[name] = settings_dict
    connections.settings[name] = settings_dict


def _drop_alias(name: str) -> None:
    if name in connections.settings:
        connections[name].close()
        del connections.settings[name]
    django_settings.DATABASES.pop(name, None)


#: The test on PostgreSQL, allowed the listen alias (tests/settings.py: a test mirror of
#: the postgres alias) besides.
on_postgres_and_direct = pytest.mark.parametrize(
    "vendor",
    [
        pytest.param(
            "postgres",
            marks=pytest.mark.django_db(
                databases=[
                    a for a in ("default", "postgres", DIRECT) if a in django_settings.DATABASES
                ],
                transaction=True,
            ),
            id="postgres",
        )
    ],
)


@pytest.fixture
def direct(vendor: str) -> str:
    """A second alias of the PostgreSQL test database (reaching it without the pooler)."""
    database_alias(vendor)
    assert (
        connections[DIRECT].settings_dict["NAME"] == connections["postgres"].settings_dict["NAME"]
    )
    return DIRECT


@pytest.fixture
def opened() -> Iterator[list[tuple[str, str]]]:
    """(thread name, alias) of each connection opened from now on."""
    seen: list[tuple[str, str]] = []

    def created(sender: Any, connection: Any, **kwargs: Any) -> None:
        seen.append((threading.current_thread().name, connection.alias))

    connection_created.connect(created)
    try:
        yield seen
    finally:
        connection_created.disconnect(created)


def _listening(opened: list[tuple[str, str]]) -> set[str]:
    """The aliases that listener threads connected through."""
    return {alias for thread, alias in opened if "listen" in thread}


def _run(worker: Worker) -> None:
    try:
        worker.run()
    finally:
        connections.close_all()


def _worker_picks_up_a_new_run(engine: WorkflowEngine, worker: Worker) -> None:
    """Start ``worker``; once it is idle, a run started then completes."""
    thread = threading.Thread(target=_run, args=(worker,), daemon=True)
    thread.start()
    try:
        time.sleep(1)  # past its first looks: idle
        run = engine.start("wake_hello", None)
        completed = RunStatus.COMPLETED
        _wait_for(lambda: engine.get_run(run.id).status == completed, "the run")
    finally:
        worker.stop()
        thread.join(GUARD)
    assert not thread.is_alive()


# -- the worker and run waits ------------------------------------------------------------


@on_postgres_and_direct
def test_behind_a_transaction_pooler_the_worker_listens_over_the_listen_alias(
    vendor: str,
    direct: str,
    opened: list[tuple[str, str]],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {
        "WORKFLOW_DATABASE": alias,
        "DATABASE_POOLING": {alias: "transaction"},
        "LISTEN_DATABASES": {alias: direct},
    }
    reset_engine()
    assert listen_alias(alias) == direct
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    # It looks for work itself once an hour: only the announcement of the start, made
    # through the pooled alias and heard over the direct one, wakes it within GUARD.
    monkeypatch.setattr(_idle, "FOLLOWER_WAIT", HOUR)
    worker = Worker(engine, concurrency=1, poll_interval=HOUR, notified_poll_interval=HOUR)
    assert worker.poll_interval == HOUR
    assert worker._listener is not None
    assert "notified over 'postgres_direct'" in worker.describe(notified=True)
    _worker_picks_up_a_new_run(engine, worker)
    assert _listening(opened) == {direct}
    # A wait for a run's end listens over the same alias.
    run = engine.start("wake_hello", None)
    thread = threading.Thread(target=_run, args=(Worker(engine, until_idle=True),))
    thread.start()
    assert wait_for_run(alias, run.id, GUARD).status == RunStatus.COMPLETED
    thread.join(GUARD)
    assert shared_listener(alias, RUN_DONE_CHANNEL)._listener is not None
    assert shared_listener(alias, RUN_DONE_CHANNEL)._listener.using == direct
    assert _listening(opened) == {direct}


@on_databases("postgres")
def test_behind_a_transaction_pooler_without_a_listen_alias_the_worker_polls(
    vendor: str, opened: list[tuple[str, str]], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {
        "WORKFLOW_DATABASE": alias,
        "DATABASE_POOLING": {alias: "transaction"},
        "WORKER_POOLED_POLL_INTERVAL": 0.1,
    }
    reset_engine()
    assert listen_alias(alias) is None
    assert worker_poll_interval(alias, HOUR) == 0.1
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    monkeypatch.setattr(_idle, "FOLLOWER_WAIT", HOUR)
    # Asked to poll hourly, it polls every WORKER_POOLED_POLL_INTERVAL instead: it
    # cannot hear the announcements, so nothing else would wake it within GUARD.
    worker = Worker(engine, concurrency=1, poll_interval=HOUR, notified_poll_interval=HOUR)
    assert worker._listener is None
    assert worker.poll_interval == 0.1
    _worker_picks_up_a_new_run(engine, worker)
    # A wait for a run's end polls too.
    run = engine.start("wake_hello", None)
    thread = threading.Thread(target=_run, args=(Worker(engine, until_idle=True),))
    thread.start()
    assert wait_for_run(alias, run.id, GUARD).status == RunStatus.COMPLETED
    thread.join(GUARD)
    assert _listening(opened) == set()  # nothing tried to LISTEN through the pooler


@on_databases("postgres")
def test_a_session_pooler_or_none_listens_on_the_alias_itself(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    for mode in ("session", "none"):
        settings.PIKKU = {"DATABASE_POOLING": {alias: mode}}
        assert listen_alias(alias) == alias
        assert worker_poll_interval(alias, 1.0) == 1.0


@on_databases("sqlite", "mariadb")
def test_without_notifications_nothing_listens_and_polling_is_unchanged(
    vendor: str, settings: Any
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"DATABASE_POOLING": {alias: "transaction"}}
    assert listen_alias(alias) is None
    assert worker_poll_interval(alias, 1.0) == 1.0


# -- the system check --------------------------------------------------------------------


def _ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


@on_databases("postgres")
def test_the_check_says_whether_the_worker_listens_or_polls(
    vendor: str, direct: str, settings: Any
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "DATABASE_POOLING": {alias: "transaction"}}
    [polls] = check_wakeups()
    assert polls.id == "pikku_django.W501"
    assert "polls for new work every 0.25s" in polls.msg
    settings.PIKKU = {**settings.PIKKU, "LISTEN_DATABASES": {alias: direct}}
    [listens] = check_wakeups()
    assert listens.id == "pikku_django.I501"
    assert f"listens for it over {direct!r}" in listens.msg
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "DATABASE_POOLING": {alias: "session"}}
    assert check_wakeups() == []
    settings.PIKKU = {
        "WORKFLOW_DATABASE": alias,
        "DATABASE_POOLING": {alias: "transaction"},
        "WORKER_NOTIFY": False,
    }
    assert check_wakeups() == []  # it polls every WORKER_POLL_INTERVAL, as asked


@on_databases("postgres")
def test_the_check_refuses_a_listen_alias_that_is_unknown_or_another_database(
    vendor: str, direct: str, settings: Any
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"LISTEN_DATABASES": {alias: "nowhere"}}
    [unknown] = check_wakeups()
    assert unknown.id == "pikku_django.E501"
    assert "'nowhere', which is not in DATABASES" in unknown.msg
    settings.PIKKU = {"LISTEN_DATABASES": {"nowhere": direct}}
    assert _ids(check_wakeups()) == ["pikku_django.E501"]
    settings.PIKKU = {"LISTEN_DATABASES": {alias: "default"}}  # SQLite
    [other] = check_wakeups()
    assert other.id == "pikku_django.E502"
    assert "only one of them is PostgreSQL" in other.msg
    settings.PIKKU = {"LISTEN_DATABASES": {"default": "default"}}
    [useless] = check_wakeups()
    assert (useless.id, useless.level) == ("pikku_django.W502", checks.WARNING)
    assert "nothing listens, workers poll" in useless.msg
    _add_alias("postgres_other", {**connections[alias].settings_dict, "NAME": "another_db"})
    try:
        settings.PIKKU = {"LISTEN_DATABASES": {alias: "postgres_other"}}
        [elsewhere] = check_wakeups()
        assert elsewhere.id == "pikku_django.E502"
        assert "they name different databases" in elsewhere.msg
    finally:
        _drop_alias("postgres_other")
    settings.PIKKU = {
        "LISTEN_DATABASES": {alias: direct},
        "DATABASE_POOLING": {direct: "transaction"},
    }
    [pooled] = check_wakeups()
    assert pooled.id == "pikku_django.E502"
    assert "is itself behind a transaction pooler" in pooled.msg
    settings.PIKKU = {"LISTEN_DATABASES": {alias: direct}}
    assert check_wakeups() == []


def test_the_check_is_registered() -> None:
    assert check_wakeups in checks.registry.registry.get_checks()
