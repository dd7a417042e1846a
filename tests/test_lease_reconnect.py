"""Connections the package keeps open (the lease pool, Django's connection that the
prepared statements run on) are replaced once the server has ended their sessions,
as a server restart does: the next statement works."""

from __future__ import annotations

import threading
import time
from typing import Any

from django.db import connections

from pikku_django import prepared
from pikku_django.leases.database import DatabaseLeaseService
from tests.conftest import database_alias, fresh_database_lease_service, on_databases

HOUR = 60 * 60 * 1000
POOLED = 3

SESSION_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


def end_sessions(alias: str, sessions: set[int]) -> None:
    """End ``sessions`` from a connection of its own, as the server's restart would,
    and wait until the server has let them go."""
    template = connections[alias]
    killer = type(template)(template.settings_dict, alias)
    try:
        with killer.cursor() as cursor:
            for session in sessions:
                if template.vendor == "postgresql":
                    cursor.execute("SELECT pg_terminate_backend(%s)", [session])
                else:
                    cursor.execute(f"KILL {int(session)}")
            deadline = time.monotonic() + 30
            while sessions & live_sessions(template.vendor, cursor):
                assert time.monotonic() < deadline, "the sessions were never ended"
                time.sleep(0.05)
    finally:
        killer.close()


def live_sessions(vendor: str, cursor: Any) -> set[int]:
    if vendor == "postgresql":
        cursor.execute("SELECT pid FROM pg_stat_activity")
    else:
        cursor.execute("SELECT id FROM information_schema.processlist")
    return {int(row[0]) for row in cursor.fetchall()}


def pooled_sessions(service: DatabaseLeaseService, n: int) -> set[int]:
    """Open ``n`` pooled connections at once, so all of them go back idle; their ids."""
    sessions: set[int] = set()
    barrier = threading.Barrier(n)
    vendor = connections[service.using].vendor

    def lend() -> None:
        with service._pool.connection() as conn:
            cursor = conn.connection.cursor()
            cursor.execute(SESSION_ID[vendor])
            sessions.add(int(cursor.fetchone()[0]))
            cursor.close()
            barrier.wait(timeout=30)

    threads = [threading.Thread(target=lend) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(sessions) == n
    return sessions


@on_databases("postgres", "mariadb", transaction=True)
def test_lease_pool_replaces_connections_the_server_ended(vendor: str) -> None:
    alias = database_alias(vendor)
    service = fresh_database_lease_service(alias)
    try:
        a = service.acquire("job", "a", HOUR)
        assert a is not None
        end_sessions(alias, pooled_sessions(service, POOLED))
        # Every idle connection is dead: each of the next operations must still work.
        for _ in range(POOLED + 1):
            again = service.acquire("job", "a", HOUR)
            assert again is not None
            assert again.token == a.token
        assert service.acquire("job", "b", HOUR) is None
        assert service.release(a) is True
        assert service.get("job") is None
    finally:
        service.close()


@on_databases("postgres", "mariadb", transaction=True)
def test_prepared_statements_reconnect_once_the_server_ended_the_session(vendor: str) -> None:
    alias = database_alias(vendor)
    session = int(prepared.fetch_one(alias, SESSION_ID[connections[alias].vendor], [])[0])
    end_sessions(alias, {session})
    row = prepared.fetch_one(alias, SESSION_ID[connections[alias].vendor], [])
    assert int(row[0]) != session
    assert prepared.fetch_nothing_on(connections[alias], "SELECT 1", []) >= 0


@on_databases("postgres", transaction=True)
def test_a_notification_waiting_on_djangos_connection_is_not_taken_for_its_end(
    vendor: str,
) -> None:
    alias = database_alias(vendor)
    connection = connections[alias]
    connection.ensure_connection()
    raw = connection.connection
    raw.execute("LISTEN pikku_test_reconnect")
    session = int(prepared.fetch_one(alias, "SELECT pg_backend_pid()", [])[0])
    template = connections[alias]
    sender = type(template)(template.settings_dict, alias)
    try:
        with sender.cursor() as cursor:
            cursor.execute("NOTIFY pikku_test_reconnect, 'hello'")
    finally:
        sender.close()
    time.sleep(0.2)
    assert int(prepared.fetch_one(alias, "SELECT pg_backend_pid()", [])[0]) == session
    assert connection.connection is raw
    raw.execute("UNLISTEN *")
