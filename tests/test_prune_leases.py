"""``pikku_prune`` deletes the run leases of the runs it deletes, in its batches, and
keeps every other lease (its token too), on SQLite, PostgreSQL and MariaDB, and on
Redis and in memory."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from pikku_django.leases import LeaseService, get_lease_service
from pikku_django.models import Lease, RunStatus, WorkflowRun
from pikku_django.workflows import WorkflowEngine, workflow
from pikku_django.workflows.engine import run_lease_key
from pikku_django.workflows.passes.context import WorkflowContext
from tests.conftest import database_alias, on_databases, require_service


@workflow(name="prune_lease_noop")
def noop(ctx: WorkflowContext, inp: Any) -> str:
    return "done"


def _finished_runs(engine: WorkflowEngine, n: int) -> list[Any]:
    ids = [engine.start(noop).id for _ in range(n)]
    engine.run_until_idle()
    assert all(engine.get_run(i).status == RunStatus.COMPLETED for i in ids)
    return ids


def _age(alias: str, ids: list[Any], days: int) -> None:
    WorkflowRun.objects.using(alias).filter(id__in=ids).update(
        updated_at=timezone.now() - timedelta(days=days)
    )


def _prune(alias: str) -> str:
    out = StringIO()
    call_command(
        "pikku_prune", "--older-than", "30d", "--batch-size", "2", "--database", alias, stdout=out
    )
    return out.getvalue()


@on_databases("sqlite", "postgres", "mariadb")
def test_prune_deletes_the_run_leases_of_the_runs_it_deletes(vendor: str) -> None:
    alias = database_alias(vendor)
    with override_settings(PIKKU={"WORKFLOW_DATABASE": alias, "LEASE_DATABASE": alias}):
        engine = WorkflowEngine(alias)
        old = _finished_runs(engine, 5)
        recent = _finished_runs(engine, 2)
        _age(alias, old, 40)
        other = engine.leases.acquire("reports:nightly", "me", 60_000)
        assert other is not None
        assert engine.leases.release(other)
        leases = Lease.objects.using(alias)
        # A pass releases the run lease but its row keeps the token.
        assert leases.filter(key__in=[run_lease_key(i) for i in old + recent]).count() == 7

        assert "Deleted 5 settled runs" in _prune(alias)

        assert not leases.filter(key__in=[run_lease_key(i) for i in old]).exists()
        assert leases.filter(key__in=[run_lease_key(i) for i in recent]).count() == 2
        kept = leases.get(key="reports:nightly")
        assert kept.token == other.token
        # The next holder of a kept key still gets a higher token.
        again = engine.leases.acquire("reports:nightly", "you", 60_000)
        assert again is not None
        assert again.token > other.token


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_prune_forgets_run_leases_on_other_backends(backend: str) -> None:
    if backend == "redis":
        require_service("redis")
        pikku = {"LEASE_BACKEND": "redis", "LEASE_CACHE": "redis"}
    else:
        pikku = {"LEASE_BACKEND": "memory"}
    with override_settings(PIKKU=pikku):
        service: LeaseService = get_lease_service()
        engine = WorkflowEngine("default", leases=service)
        old = _finished_runs(engine, 3)
        _age("default", old, 40)
        key = run_lease_key(old[0])
        first = service.acquire(key, "me", 60_000)
        assert first is not None
        assert service.release(first)
        assert "Deleted 3 settled runs" in _prune("default")
        # Nothing is kept of the key: its tokens start afresh.
        fresh = service.acquire(key, "me", 60_000)
        assert fresh is not None
        assert fresh.token == 1
        service.release(fresh)
        service.forget([key])
