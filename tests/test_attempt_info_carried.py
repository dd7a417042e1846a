"""The step-attempt signals' run and claim, read from the run a worker's pass carries:
with a receiver connected (metrics, traces), a carried step costs no query more than
without one, and says what the query would have said."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from pikku_django import signals
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, workflow
from pikku_django.workflows._values import CarriedRun, ClaimedStep
from tests.conftest import database_alias, on_databases


@workflow(name="obs.carried_one")
def carried_one(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("only", "obs.carried_noop", input, queue="carried")


@pytest.fixture
def listening() -> Iterator[None]:
    def receiver(sender: Any, **kwargs: Any) -> None:
        pass

    signals.step_attempt_started.connect(receiver, weak=False, dispatch_uid="obs-carried")
    yield
    signals.step_attempt_started.disconnect(dispatch_uid="obs-carried")


def claimed_of(step: WorkflowStep, run: WorkflowRun, **more: Any) -> ClaimedStep:
    return ClaimedStep(
        step_id=step.id,
        run_id=run.id,
        name=step.name,
        function=step.function,
        input=step.input,
        attempt=1,
        transactional=False,
        lease_ms=60_000,
        queue=step.queue,
        carried=CarriedRun(run, {step.name: step}),
        worker="host:123:abc",
        **more,
    )


@on_databases("sqlite", "postgres")
def test_a_carried_claim_is_described_without_a_query(vendor: str, listening: None) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())
    run = engine.start("obs.carried_one", {"n": 1})
    run = engine.runs().get(id=run.id)
    run.trace_context = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    events = engine._states.events

    # A step stored by the statement that claimed it (its row not read back).
    fresh = WorkflowStep(id=41, run_id=run.id, name="only", function="f", queue="carried")
    with CaptureQueriesContext(connections[alias]) as queries:
        info = events.attempt_info(claimed_of(fresh, run))
    assert len(queries) == 0
    assert info is not None
    assert (info.workflow, info.step, info.attempt, info.queue) == (
        "obs.carried_one",
        "only",
        1,
        "carried",
    )
    assert (info.worker, info.claim_latency) == ("host:123:abc", 0.0)
    assert info.trace_context == run.trace_context

    # A step read from the database, claimed at a time this process stamped.
    read = WorkflowStep(id=42, run_id=run.id, name="only", function="f", queue="carried")
    read.created_at = run.created_at
    started = run.created_at + timedelta(seconds=2.5)
    with CaptureQueriesContext(connections[alias]) as queries:
        info = events.attempt_info(claimed_of(read, run, started_at=started))
    assert len(queries) == 0
    assert info is not None
    assert info.claim_latency == 2.5

    # Without the claim's time, or with the run's fields not loaded: the query says.
    partial = engine.runs().only("id", "status").get(id=run.id)
    for claimed in (claimed_of(read, run), claimed_of(fresh, partial)):
        with CaptureQueriesContext(connections[alias]) as queries:
            info = events.attempt_info(claimed)
        assert len(queries) >= 1
        assert info is not None
        assert info.workflow == "obs.carried_one"
