"""Lease and step-claim fencing across a failover, on a real primary and asynchronous
standby.

Leases (then, in the second scenario, step claims) are taken on the primary; then the
standby is held back, so what the primary commits next (a takeover, a new key, a
release and a new holder; a lapsed step claimed again) never reaches it. The
primary crashes (``immediate``), the standby is promoted, and the workers' libpq
multi-host connection (``target_session_attrs=read-write``) finds the new primary.
The holders of the lost commits still believe they hold their leases (their steps):
each of their refreshes, releases and fenced writes must be refused, and every token
handed out after the promotion must be higher than every token handed out before it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from pikku_django.leases import InMemoryLeaseService
from pikku_django.leases.base import Lease
from pikku_django.leases.database import DatabaseLeaseService
from pikku_django.leases.sql import POSTGRESQL_TIMELINE
from pikku_django.models import AttemptStatus, Backoff, StepKind, StepStatus, WorkflowRun
from pikku_django.models import Lease as LeaseRow
from pikku_django.workflows import registry
from pikku_django.workflows._values import NewStep, RunLeaseAsk
from pikku_django.workflows.engine import ClaimedStep, StepOutcome, WorkflowEngine
from pikku_django.workflows.errors import WorkflowStepSupersededError
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
            call_command("migrate", "pikku_django", database=ALIAS, verbosity=0)
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


STEP_FN = "tests.failover.charge"
#: What the step function returns when a worker runs it (set by the test).
_returns: dict[str, str] = {}


@registry.step(name=STEP_FN)
def _charge(data: Any) -> Any:
    return _returns["value"]


def start_step_run(engine: WorkflowEngine, name: str) -> uuid.UUID:
    """A running run with one queued step ``name``, never claimed."""
    run = WorkflowRun(workflow="tests.failover.steps", input={})
    step = NewStep(
        run_id=run.id,
        name=name,
        kind=StepKind.QUEUED,
        function=STEP_FN,
        input={},
        retries=5,
        retry_delay=0,
        backoff=Backoff.FIXED,
        queue="default",
        transactional=False,
    )
    engine.store.create_run(run, step, None)
    return run.id


def claim(engine: WorkflowEngine, run_id: uuid.UUID, name: str, worker: str) -> ClaimedStep:
    step_id = engine.steps().get(run_id=run_id, name=name).id
    claimed = engine.claim_step(step_id, lease_ms=LONG, worker=worker)
    assert claimed is not None, f"{worker} did not claim {name}"
    return claimed


def run_lease_tokens(engine: WorkflowEngine, run_ids: list[uuid.UUID], holder: str) -> list[int]:
    """The tokens of the run leases a due-run claim takes with ``run_ids`` (made due)."""
    for run_id in run_ids:
        engine.wake_run(run_id)
    now = timezone.now()
    ask = RunLeaseAsk("failover:run:", holder, LONG)
    due = engine.store.claim_due_runs_leased(now, now + timedelta(minutes=5), 10, ask)
    assert {d.run.id for d in due} >= set(run_ids)
    return [d.lease.token for d in due if d.run.id in run_ids and d.lease is not None]


def test_a_step_claim_from_the_lost_timeline_never_settles_over_its_successor(
    pair: ReplicatedPair,
) -> None:
    engine = WorkflowEngine(ALIAS, leases=InMemoryLeaseService())
    try:
        # Replicated: worker-1 claimed S1 (attempt 1) and died (its lease lapsed); R0's
        # run lease was taken with a due-run claim.
        s1_run = start_step_run(engine, "S1")
        w1 = claim(engine, s1_run, "S1", "worker-1")
        assert engine.refresh_step_lease(w1.step_id, -1, w1.attempt, w1.claim_token)
        r0 = start_step_run(engine, "R0")
        leases_before = run_lease_tokens(engine, [r0], "pass-1")

        pair.hold_back_standby()
        xid_before_loss = next_xid(pair)
        # Lost: worker-2 reclaims the lapsed S1 as attempt 2 and renews its lease; a
        # new run starts and worker-2 claims its step.
        w2 = claim(engine, s1_run, "S1", "worker-2")
        assert w2.attempt == 2
        assert engine.refresh_step_lease(w2.step_id, LONG, w2.attempt, w2.claim_token)
        s2_run = start_step_run(engine, "S2")
        w2_s2 = claim(engine, s2_run, "S2", "worker-2")
        xid_lost = next_xid(pair) - xid_before_loss
        claimed_before = [w1, w2, w2_s2]

        pair.fail_over()
        connections[ALIAS].close()  # the workers reconnect: to the new primary
        timeline = int(pair.standby.scalar(f"SELECT {POSTGRESQL_TIMELINE}"))
        s1 = engine.steps().get(run_id=s1_run, name="S1")
        lost_commits = [
            what
            for what, gone in (
                ("worker-2 claimed S1 as attempt 2", s1.attempt == 1),
                ("worker-2 renewed its lease of S1", (s1.lease_expires_at or 0) < epoch_ms()),
                ("a run started", not engine.runs().filter(id=s2_run).exists()),
                ("worker-2 claimed S2", not engine.steps().filter(run_id=s2_run).exists()),
            )
            if gone
        ]
        print(
            f"{len(lost_commits)} commits lost in the failover ({', '.join(lost_commits)}; "
            f"{xid_lost} transaction ids); the new primary is on timeline {timeline}"
        )
        assert len(lost_commits) == 4
        assert timeline > 1

        # After the promotion worker-3 claims S1 again: attempt 2 once more.
        w3 = claim(engine, s1_run, "S1", "worker-3")
        assert (w3.attempt, w3.step_id) == (w2.attempt, w2.step_id)
        s3_run = start_step_run(engine, "S3")
        w3_s3 = claim(engine, s3_run, "S3", "worker-3")
        claimed_after = [w3, w3_s3]
        before = [c.claim_token for c in claimed_before]
        after = [c.claim_token for c in claimed_after]
        print(f"claim tokens before the promotion {before}, after it {after}")
        assert min(after) > max(before)
        leases_after = run_lease_tokens(engine, [s1_run, s3_run], "pass-2")
        print(f"run lease tokens before the promotion {leases_before}, after it {leases_after}")
        assert min(leases_after) > max(leases_before)

        # worker-2, from the lost timeline, carries on: its renewal and its settle
        # are each refused, by the engine's own path and by the public calls.
        assert not engine.refresh_step_lease(w2.step_id, LONG, w2.attempt, w2.claim_token)
        _returns["value"] = "worker-2"
        assert engine.execute_step(w2) is StepOutcome.SUPERSEDED
        with pytest.raises(WorkflowStepSupersededError):
            engine.set_step_result(w2.step_id, "worker-2", w2.attempt, token=w2.claim_token)
        s1 = engine.steps().get(id=w3.step_id)
        assert (s1.status, s1.result, s1.claim_token) == (StepStatus.RUNNING, None, w3.claim_token)

        # worker-3's settle is accepted, and the result stored once.
        _returns["value"] = "worker-3"
        assert engine.execute_step(w3) is StepOutcome.SUCCEEDED
        s1 = engine.steps().get(id=w3.step_id)
        assert (s1.status, s1.result) == (StepStatus.SUCCEEDED, "worker-3")
        attempts = list(
            engine.attempts().filter(step_id=w3.step_id).values_list("attempt", "status", "result")
        )
        assert attempts == [
            (1, AttemptStatus.SUPERSEDED, None),
            (2, StepStatus.SUCCEEDED, "worker-3"),
        ]
    finally:
        _returns.clear()
        connections[ALIAS].close()


def epoch_ms() -> int:
    return int(time.time() * 1000)
