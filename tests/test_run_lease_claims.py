"""Run leases taken and released by the workflow statements themselves.

Where the runs' database holds the leases too (PostgreSQL, the database lease service
on the same alias), a worker's claim of a due run takes the run's lease in the same
statement, and the write that ends a run it carries releases it: no lease statement
of its own on the way. Elsewhere the lease service is asked as before.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import override_settings

from pikku_django.leases import HeldLease, LeaseLostError
from pikku_django.leases.database import DatabaseLeaseService
from pikku_django.leases.memory import InMemoryLeaseService
from pikku_django.models import Lease as LeaseRow
from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.workflows import WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.engine import run_lease_key
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases


@step(name="lease_claims_echo")
def echo(data: Any) -> Any:
    return data


@workflow(name="lease_claims_one")
def one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("only", echo, inp)


def _engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=DatabaseLeaseService(using=alias))


@on_databases("postgres")
def test_a_due_run_is_claimed_with_its_lease(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = _engine(alias)
    assert engine.run_leases_in_store()
    run = engine.start(one, 1)
    (due,) = engine.claim_due_run_rows(1, lease_holder="holder-1")
    assert due.run.id == run.id
    assert due.lease is not None
    assert not due.lease_refused
    assert (due.lease.key, due.lease.holder) == (run_lease_key(run.id), "holder-1")
    row = LeaseRow.objects.using(alias).get(key=run_lease_key(run.id))
    assert (row.holder, row.token, row.expires_at) == (
        "holder-1",
        due.lease.token,
        due.lease.expires_at,
    )
    # The lease the claim took is held from there on as one the service acquired.
    held = HeldLease.taken(
        due.lease,
        ttl_ms=engine.config.run_lease_ms,
        service=engine.leases,
        asked_at=time.monotonic(),
    )
    with held:
        held.vouch()
    row.refresh_from_db()
    assert row.expires_at == 0  # released on leaving the block


@on_databases("postgres")
def test_a_run_whose_lease_is_held_elsewhere_is_claimed_without_it(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = _engine(alias)
    run = engine.start(one, 1)
    other = engine.leases.acquire(run_lease_key(run.id), "someone-else", 60_000)
    assert other is not None
    (due,) = engine.claim_due_run_rows(1, lease_holder="holder-1")
    assert due.lease is None
    assert due.lease_refused
    row = LeaseRow.objects.using(alias).get(key=run_lease_key(run.id))
    assert (row.holder, row.token) == ("someone-else", other.token)
    # Claimed nonetheless: pushed back, for the holder's pass.
    assert WorkflowRun.objects.using(alias).get(id=run.id).wake_at > run.wake_at


@on_databases("sqlite", "mariadb", "postgres")
def test_a_lease_kept_elsewhere_is_not_taken_by_the_claim(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    assert not engine.run_leases_in_store()
    run = engine.start(one, 1)
    (due,) = engine.claim_due_run_rows(1, lease_holder="holder-1")
    assert (due.run.id, due.lease, due.lease_refused) == (run.id, None, False)
    assert not LeaseRow.objects.using(alias).filter(key=run_lease_key(run.id)).exists()


@on_databases("postgres", "sqlite", "mariadb")
def test_a_worker_takes_and_releases_run_leases_with_its_writes(
    vendor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a one-step run costs no lease statement of its own; elsewhere the
    service takes and releases each run's lease."""
    alias = database_alias(vendor)
    asked: list[str] = []
    for name in ("acquire", "release"):
        real = getattr(DatabaseLeaseService, name)

        def spied(self: Any, *args: Any, real: Any = real, name: str = name) -> Any:
            asked.append(name)
            return real(self, *args)

        monkeypatch.setattr(DatabaseLeaseService, name, spied)
    with override_settings(PIKKU={"WORKFLOW_DATABASE": alias, "LEASE_DATABASE": alias}):
        engine = WorkflowEngine(alias)
        runs = [engine.start(one, n) for n in range(3)]
        Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0).run()
        done = [engine.get_run(r.id) for r in runs]
    assert [(r.status, r.output) for r in done] == [(RunStatus.COMPLETED, n) for n in range(3)]
    leases = LeaseRow.objects.using(alias).filter(key__in=[run_lease_key(r.id) for r in runs])
    assert sorted(leases.values_list("expires_at", flat=True)) == [0, 0, 0]  # all released
    if vendor == "postgres":
        assert "acquire" not in asked
        assert "release" not in asked
    else:
        assert asked.count("acquire") >= 3
        assert asked.count("release") >= 3


def test_a_lease_released_with_other_work_is_judged_by_that_release() -> None:
    service = InMemoryLeaseService()
    lease = service.acquire("k", "h", 10_000)
    assert lease is not None
    held = HeldLease.taken(lease, ttl_ms=10_000, service=service, asked_at=time.monotonic())
    with held:
        assert service.release(lease)  # as the statement that ended the run did
        held.released_with(True)
    lease = service.acquire("k", "h", 10_000)
    assert lease is not None
    held = HeldLease.taken(lease, ttl_ms=10_000, service=service, asked_at=time.monotonic())
    with pytest.raises(LeaseLostError), held:
        held.released_with(False)  # it was no longer this live lease
