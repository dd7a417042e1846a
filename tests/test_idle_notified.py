"""An idle worker that listens (PostgreSQL) looks for work itself rarely, yet still
runs what falls due without an announcement: a sleep's end, a run's deadline.
The one LISTEN implementation reconnects, calls back after each connect, and tells
waiters to poll often while it is not listening."""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections
from django.db.backends.signals import connection_created

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus
from pikku_django.wakeups import ChannelListener
from pikku_django.workflows import WorkflowContext, WorkflowEngine, workflow
from pikku_django.workflows.worker import _idle
from pikku_django.workflows.worker._idle import PollCadence
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases

#: How long a test waits for what it expects before it fails: only a hang takes this long.
GUARD = 60.0
HOUR = 3600.0


@workflow(name="idle_nap")
def idle_nap(ctx: WorkflowContext, inp: Any) -> str:
    ctx.sleep("nap", "1s")
    return "rested"


@workflow(name="idle_waits_for_ever")
def idle_waits_for_ever(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.suspend("nobody answers")


def _wait_for(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


# -- the cadence -----------------------------------------------------------------------


def test_the_cadence_waits_long_only_while_listening_and_no_queue_is_limited() -> None:
    listening = threading.Event()
    cadence = PollCadence(0.5, 20.0, listening=listening.is_set)
    assert cadence.interval() == 0.5  # not listening (yet, or the connection is down)
    listening.set()
    assert cadence.interval() == 20.0
    assert cadence.intake_interval() == 20.0  # idle: the intakes too
    cadence.busy()
    assert cadence.intake_interval() == 0.5  # busy or notified: intakes as often as before
    assert cadence.interval() == 20.0
    limited = PollCadence(0.5, 20.0, listening=listening.is_set, limited=True)
    assert limited.interval() == 0.5  # a limited queue's freed slot is not announced
    # Never less often than the poll interval itself.
    assert PollCadence(5.0, 1.0, listening=listening.is_set).interval() == 5.0


# -- the listener ----------------------------------------------------------------------


@on_databases("postgres")
def test_the_listener_hands_on_payloads_calls_back_on_connect_and_stops(vendor: str) -> None:
    alias = database_alias(vendor)
    payloads: list[str] = []
    connects: list[int] = []
    listener = ChannelListener(
        alias, "pikku_test_idle", payloads.append, on_listen=lambda: connects.append(1)
    )
    assert listener.interval(0.2, 5.0) == 0.2  # not listening: poll often
    stopping = threading.Event()
    thread = threading.Thread(target=listener.run, args=(stopping,), daemon=True)
    thread.start()
    try:
        assert listener.listening.wait(GUARD)
        assert connects == [1]
        assert listener.interval(0.2, 5.0) == 5.0
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_notify('pikku_test_idle', 'hello')")
        _wait_for(lambda: payloads == ["hello"], GUARD, "the notification")
    finally:
        stopping.set()
        thread.join(GUARD)
    assert not thread.is_alive()
    assert not listener.listening.is_set()
    assert listener.interval(0.2, 5.0) == 0.2


@on_databases("postgres")
def test_the_listener_ends_when_nothing_waits_on_it(vendor: str) -> None:
    alias = database_alias(vendor)
    wanted = threading.Event()
    wanted.set()
    listener = ChannelListener(alias, "pikku_test_idle", lambda payload: None, timeout=0.05)
    thread = threading.Thread(
        target=listener.run, args=(threading.Event(), wanted.is_set), daemon=True
    )
    thread.start()
    assert listener.listening.wait(GUARD)
    assert thread.is_alive()
    wanted.clear()
    thread.join(GUARD)
    assert not thread.is_alive()


# -- the worker ------------------------------------------------------------------------


@pytest.fixture
def statements() -> Iterator[collections.Counter[str]]:
    """Statements run on connections opened from now on, by their text."""
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        with lock:
            counts[re.sub(r"\s+", " ", sql)] += 1
        return execute(sql, params, many, context)

    def created(sender: Any, connection: Any, **kwargs: Any) -> None:
        if count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    connection_created.connect(created)
    try:
        yield counts
    finally:
        connection_created.disconnect(created)


def _run(worker: Worker) -> None:
    try:
        worker.run()
    finally:
        connections.close_all()  # this thread's own (its heartbeats')


def _claims(counts: collections.Counter[str]) -> int:
    """How many looks for due runs (the claim: runs woken by now)."""
    return sum(n for sql, n in counts.items() if '"wake_at" <= %s' in sql)


@on_databases("postgres")
def test_a_listening_idle_worker_polls_rarely_and_still_runs_what_falls_due(
    vendor: str, statements: collections.Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    # Listening, it looks for work itself once an hour: longer than the test waits
    # (GUARD) for anything, so what it runs without an announcement, its next-due
    # look woke it for. Idle threads other than the poller wait as long.
    monkeypatch.setattr(_idle, "FOLLOWER_WAIT", HOUR)
    worker = Worker(engine, concurrency=2, poll_interval=0.1, notified_poll_interval=HOUR)
    thread = threading.Thread(target=_run, args=(worker,), daemon=True)
    thread.start()
    try:
        assert worker._listener is not None
        assert worker._listener.listening.wait(GUARD)
        time.sleep(1)  # past its first looks: idle and listening
        before = _claims(statements)
        time.sleep(2)
        # Polling every 0.1 s would have claimed about 20 times; it looks every hour.
        assert _claims(statements) - before <= 2
        # Nothing announces a sleep's end: the next-due look wakes the worker for it.
        napping = engine.start("idle_nap", None)
        completed = RunStatus.COMPLETED
        _wait_for(lambda: engine.get_run(napping.id).status == completed, GUARD, "the nap")
        # Nor a deadline: the deadline intake names it, and the worker looks by then.
        waiting = engine.start("idle_waits_for_ever", None, timeout=1)
        failed = RunStatus.FAILED
        _wait_for(lambda: engine.get_run(waiting.id).status == failed, GUARD, "the deadline")
    finally:
        worker.stop()
        thread.join(GUARD)
    assert engine.get_run(waiting.id).error["code"] == "RUN_TIMEOUT"


@on_databases("sqlite", "postgres")
def test_a_worker_that_does_not_listen_polls_every_poll_interval(
    vendor: str, statements: collections.Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    monkeypatch.setattr(_idle, "FOLLOWER_WAIT", HOUR)
    worker = Worker(
        engine, concurrency=1, poll_interval=0.1, notified_poll_interval=HOUR, notify=False
    )
    assert worker._listener is None
    thread = threading.Thread(target=_run, args=(worker,), daemon=True)
    thread.start()
    try:
        time.sleep(1)
        before = _claims(statements)
        # Idle, it looks again and again: at the hour it would have looked once.
        _wait_for(lambda: _claims(statements) - before >= 5, GUARD, "five looks for work")
    finally:
        worker.stop()
        thread.join(GUARD)
