"""New work announced to idle workers, coalesced per process, on PostgreSQL.

The first write of a window announces itself; the writes after it are covered by one
announcement from a background thread, made after they committed (never before, never
for a write that rolled back). Workers then start every run: none waits for a poll.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connections, transaction

from pikku_django.wakeups import WORK_CHANNEL as CHANNEL
from pikku_django.wakeups import Announcer
from tests.conftest import database_alias, on_databases


def _listener(alias: str) -> psycopg.Connection[Any]:
    settings = connections[alias].settings_dict
    conn = psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        user=settings["USER"],
        dbname=settings["NAME"],
        autocommit=True,
    )
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


@pytest.fixture
def alias() -> str:
    return database_alias("postgres")


@pytest.fixture
def listener(alias: str) -> Iterator[psycopg.Connection[Any]]:
    conn = _listener(alias)
    try:
        yield conn
    finally:
        conn.close()


def _heard(conn: psycopg.Connection[Any], seconds: float) -> list[str]:
    """The payloads announced on the channel within ``seconds``."""
    return [n.payload for n in conn.notifies(timeout=seconds)]


@on_databases("postgres")
def test_the_first_write_of_a_window_announces_itself(vendor: str, alias: str) -> None:
    announcer = Announcer(window=0.2)
    assert announcer.inline(alias, "p")
    assert not announcer.inline(alias, "p")  # in the same window
    assert announcer.inline(alias, "other")  # another payload has a window of its own
    time.sleep(0.25)
    assert announcer.inline(alias, "p")


@on_databases("postgres")
def test_writes_after_the_first_are_announced_once_after_they_commit(
    vendor: str, alias: str, listener: psycopg.Connection[Any]
) -> None:
    announcer = Announcer(window=0.05)
    assert announcer.inline(alias, "receipts")
    for _ in range(50):
        assert not announcer.inline(alias, "receipts")
        announcer.after_commit(alias, "receipts")
    heard = _heard(listener, 0.5)
    assert heard, "the writes after the first were never announced"
    assert set(heard) == {"receipts"}
    assert len(heard) <= 2  # coalesced: fifty writes, one or two announcements


@on_databases("postgres")
def test_an_announcement_waits_for_the_commit_and_none_follows_a_rollback(
    vendor: str, alias: str, listener: psycopg.Connection[Any]
) -> None:
    announcer = Announcer(window=0.01)
    announcer.inline(alias, "x")
    with transaction.atomic(using=alias):
        announcer.after_commit(alias, "x")
        assert _heard(listener, 0.2) == []  # not before the commit
    assert _heard(listener, 0.5) == ["x"]

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic(using=alias):
        announcer.after_commit(alias, "x")
        raise Rollback
    assert _heard(listener, 0.3) == []


@on_databases("postgres")
def test_a_burst_of_run_starts_wakes_workers_for_every_run(
    vendor: str, alias: str, listener: psycopg.Connection[Any]
) -> None:
    """Starts in quick succession: each is announced, the first in its own statement and
    the rest by one announcement after them."""
    from pikku_django.workflows import WorkflowContext, WorkflowEngine, workflow

    @workflow(name="announce_burst")
    def burst(ctx: WorkflowContext, inp: Any) -> Any:
        return inp

    engine = WorkflowEngine(alias)
    for n in range(30):
        engine.start(burst, n)
    heard = _heard(listener, 0.5)
    assert heard, "no start was announced"
    assert len(heard) < 30  # coalesced
    # The last announcement came after the last start had committed: a worker that
    # looks on hearing it sees all thirty runs.
    assert engine.runs().filter(workflow="announce_burst").count() == 30
