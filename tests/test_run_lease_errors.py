"""A run whose lease cannot be taken because the lease store fails is woken again
shortly, not left for its pass timeout."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import WorkflowRun
from pikku_django.workflows import WorkflowEngine
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases


class UnreachableRunLeases(InMemoryLeaseService):
    """A lease store that fails every run lease (its server went away)."""

    def acquire(self, key: str, holder: str, ttl_ms: int) -> Any:
        if key.startswith("workflow-run:"):
            raise ConnectionError("lease store unreachable")
        return super().acquire(key, holder, ttl_ms)


@on_databases("sqlite", "postgres", "mariadb")
def test_run_whose_lease_fails_is_woken_within_seconds(vendor: str, settings: Any) -> None:
    settings.PIKKU = {**settings.PIKKU, "RUN_PASS_TIMEOUT": 300}
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=UnreachableRunLeases())
    run = engine.start("testapp.three_records", {"db": alias, "run": "r"})
    worker = Worker(engine, concurrency=1, poll_interval=0.05)
    with pytest.raises(ConnectionError):
        worker._one_unit()
    wake_at = WorkflowRun.objects.using(alias).get(id=run.id).wake_at
    assert wake_at is not None
    assert wake_at - timezone.now() < timedelta(seconds=5), "left for its pass timeout"
