"""With default settings, a run whose worker died anywhere falls due again within the
run lease plus a few seconds: no five-minute sweep or pass timeout in the way.

Here on a stepped clock; tests/test_crash_recovery_bounds.py kills worker processes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pikku_django.conf import DEFAULTS
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.engine import StepClaimer
from tests.conftest import database_alias, on_databases

VENDORS = ("sqlite", "postgres", "mariadb")
#: The run lease with default settings, and the few seconds recovery may add to it.
LEASE = timedelta(milliseconds=DEFAULTS["RUN_LEASE_MS"])
FEW = timedelta(seconds=8)


@step(name="rb_add")
def add(data: dict[str, int]) -> int:
    return data["n"] + 1


@workflow(name="rb_two")
def two(ctx: WorkflowContext, inp: Any) -> list[int]:
    return [ctx.do("a", "rb_add", {"n": 0}), ctx.do("b", "rb_add", {"n": 1})]


def _engine(vendor: str) -> tuple[WorkflowEngine, FakeClock]:
    clock = FakeClock()
    alias = database_alias(vendor)
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=clock), clock


def _due_after(engine: WorkflowEngine, clock: FakeClock, run_id: Any) -> timedelta:
    """How long until another worker claims the run, stepping the clock."""
    waited = timedelta()
    while waited <= LEASE + FEW:
        if run_id in engine.claim_due_runs(5):
            return waited
        clock.advance(1)
        waited += timedelta(seconds=1)
    raise AssertionError(f"run {run_id} was not due within {LEASE + FEW}")


@on_databases(*VENDORS)
def test_a_worker_dead_between_a_settle_and_its_pass(vendor: str) -> None:
    engine, clock = _engine(vendor)
    run = engine.start(two)
    [run_id] = engine.claim_due_runs(1)
    claimed = engine.orchestrate(run_id, claimer=StepClaimer("w:1"))
    assert claimed is not None
    # The worker settles the step for itself to pass the run next, then dies.
    assert engine.execute_step(claimed, wake="pass") == "succeeded"
    assert engine.claim_due_runs(5) == []  # not passed twice while the worker lives
    waited = _due_after(engine, clock, run.id)
    assert LEASE <= waited <= LEASE + FEW
    engine.orchestrate(run.id)
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED


@on_databases(*VENDORS)
def test_a_worker_dead_in_the_middle_of_a_pass(vendor: str) -> None:
    engine, clock = _engine(vendor)
    run = engine.start(two)
    [run_id] = engine.claim_due_runs(1)  # ... and the worker dies before passing it
    assert run_id == run.id
    waited = _due_after(engine, clock, run.id)
    assert waited <= LEASE + FEW
    engine.orchestrate(run.id)
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED
