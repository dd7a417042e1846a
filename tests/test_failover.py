"""Lease fencing across a failover, on a real primary and asynchronous standby.

Leases are taken on the primary; then the standby is held back, so what the primary
commits next (a takeover, a new key, a release and a new holder) never reaches it. The
primary crashes (``immediate``), the standby is promoted, and the workers' libpq
multi-host connection (``target_session_attrs=read-write``) finds the new primary.
The holders of the lost commits still believe they hold their leases: each of their
refreshes, releases and fenced writes must be refused, and every token handed out
after the promotion must be higher than every token handed out before it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connections

from pikku_django.leases.base import Lease
from pikku_django.leases.database import DatabaseLeaseService
from pikku_django.leases.sql import POSTGRESQL_TIMELINE
from pikku_django.models import Lease as LeaseRow
from tests.pg_clusters import (
    ReplicatedPair,
    django_alias,
    django_database,
    primary_and_standby,
    require_clusters,
)

pytestmark = pytest.mark.once

ALIAS = "failover_pg"
#: The application's database and role on the private clusters: an ordinary role.
APP = "pikku_app"
LONG = 60_000
SHORT = 300


@dataclass
class FencedStore:
    """What the leases protect, kept outside the database that fails over (a storage
    service): per key, it refuses a writer whose token is lower than one it has seen."""

    highest: dict[str, int] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)

    def write(self, lease: Lease, value: str) -> bool:
        if lease.token < self.highest.get(lease.key, 0):
            return False
        self.highest[lease.key] = lease.token
        self.values[lease.key] = value
        return True


@pytest.fixture
def pair(django_db_blocker: Any) -> Iterator[ReplicatedPair]:
    require_clusters()
    with primary_and_standby() as pair:
        pair.primary.create_database(APP, owner=APP)
        print(
            f"workers connect with: host=127.0.0.1,127.0.0.1 "
            f"port={pair.primary.port},{pair.standby.port} dbname={APP} user={APP} "
            f"target_session_attrs=read-write"
        )
        hosts = django_database(APP, APP, [pair.primary, pair.standby])
        with django_alias(ALIAS, hosts), django_db_blocker.unblock():
            with connections[ALIAS].schema_editor() as editor:
                editor.create_model(LeaseRow)
            connections[ALIAS].close()
            yield pair


def server_port(service: DatabaseLeaseService) -> int:
    """The port of the server the service's connections reach now."""
    with service._pool.connection() as conn:
        cursor = conn.connection.cursor()
        cursor.execute("SELECT inet_server_port()")
        port = int(cursor.fetchone()[0])
        cursor.close()
    return port


def take_after_lapse(service: DatabaseLeaseService, key: str, holder: str, ttl: int) -> Lease:
    """Take ``key`` once its current lease has lapsed."""
    deadline = time.monotonic() + 30
    while (lease := service.acquire(key, holder, ttl)) is None:
        assert time.monotonic() < deadline, f"{key} never lapsed"
        time.sleep(0.05)
    return lease


def next_xid(pair: ReplicatedPair, *, on_standby: bool = False) -> int:
    cluster = pair.standby if on_standby else pair.primary
    return int(cluster.scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))


def test_a_holder_from_the_lost_timeline_never_writes_over_its_successor(
    pair: ReplicatedPair,
) -> None:
    store = FencedStore()
    old_worker = DatabaseLeaseService(ALIAS)
    new_worker = DatabaseLeaseService(ALIAS)
    try:
        assert server_port(old_worker) == pair.primary.port
        # Replicated: "a" holds A; "b1" held B until "b2" took it over (token 2).
        a = old_worker.acquire("A", "a", 1_000)
        b1 = old_worker.acquire("B", "b1", SHORT)
        assert a is not None
        assert b1 is not None
        b2 = take_after_lapse(old_worker, "B", "b2", SHORT)
        assert b2.token > b1.token
        for lease in (a, b1, b2):
            assert store.write(lease, lease.holder)

        pair.hold_back_standby()
        xid_before_loss = next_xid(pair)
        # Lost: four commits the standby never receives.
        b3 = take_after_lapse(old_worker, "B", "b3", LONG)
        c1 = old_worker.acquire("C", "c1", LONG)
        assert old_worker.release(a)
        a2 = old_worker.acquire("A", "a2", LONG)
        assert c1 is not None
        assert a2 is not None
        lost_holders = [b3, c1, a2]
        for lease in lost_holders:
            assert store.write(lease, lease.holder)
        xid_lost = next_xid(pair) - xid_before_loss
        issued_before = [a, b1, b2, *lost_holders]

        pair.fail_over()
        assert server_port(new_worker) == pair.standby.port
        timeline = int(pair.standby.scalar(f"SELECT {POSTGRESQL_TIMELINE}"))
        rows = {row.key: row for row in LeaseRow.objects.using(ALIAS).all()}
        lost_commits = [
            what
            for what, gone in (
                ("b3 took B over", (rows["B"].holder, rows["B"].token) == ("b2", b2.token)),
                ("c1 took C", "C" not in rows),
                ("a released A", rows["A"].expires_at == a.expires_at),
                ("a2 took A", rows["A"].holder == "a"),
            )
            if gone
        ]
        print(
            f"{len(lost_commits)} commits lost in the failover ({', '.join(lost_commits)}; "
            f"{xid_lost} transaction ids); the new primary is on timeline {timeline}"
        )
        assert len(lost_commits) == 4
        assert timeline > 1

        # The successors, on the new primary.
        b4 = take_after_lapse(new_worker, "B", "b4", LONG)
        c2 = take_after_lapse(new_worker, "C", "c2", LONG)
        a3 = take_after_lapse(new_worker, "A", "a3", LONG)
        d1 = new_worker.acquire("D", "d1", LONG)
        assert d1 is not None
        issued_after = [b4, c2, a3, d1]
        assert min(x.token for x in issued_after) > max(x.token for x in issued_before), (
            f"tokens after the promotion {[x.token for x in issued_after]} do not all "
            f"exceed those before it {[x.token for x in issued_before]}"
        )
        for successor in (b4, c2, a3):
            assert store.write(successor, successor.holder)

        # Every holder from the lost timeline carries on, on the same worker, and is refused.
        for lease in lost_holders:
            assert old_worker.refresh(lease, LONG) is None, f"{lease.holder} renewed"
            assert not store.write(lease, lease.holder), f"{lease.holder} wrote over"
            assert not old_worker.release(lease), f"{lease.holder} released"
            assert old_worker.acquire(lease.key, lease.holder, LONG) is None
        assert server_port(old_worker) == pair.standby.port

        # The current holders' writes and renewals are accepted.
        for successor in issued_after:
            assert new_worker.refresh(successor, LONG) is not None
            assert store.write(successor, f"{successor.holder} again")
        assert store.values == {
            "A": "a3 again",
            "B": "b4 again",
            "C": "c2 again",
            "D": "d1 again",
        }
    finally:
        old_worker.close()
        new_worker.close()
