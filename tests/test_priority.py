"""Run priorities: -100 to 100, higher claimed first, first in first out within one.

On SQLite, PostgreSQL and MariaDB, due runs and ready steps are claimed in
priority order whatever the order they were started in; steps (and child runs)
inherit their run's priority; values outside the range are refused.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import StepAttempt, WorkflowRun, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, db_mark
from tests.test_batched_claims import claim_batch

VENDORS = ("sqlite", "postgres", "mariadb")


@step(name="prt_echo")
def prt_echo(data: Any) -> Any:
    return data


@workflow(name="prt_plain")
def prt_plain(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("echo", prt_echo, inp)


@workflow(name="prt_urgent", priority=50)
def prt_urgent(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("echo", prt_echo, inp)


@workflow(name="prt_parent")
def prt_parent(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("kid", prt_plain, inp)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


def _engine(alias: str) -> tuple[WorkflowEngine, FakeClock]:
    clock = FakeClock()
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=clock), clock


def _empty(alias: str) -> None:
    StepAttempt.objects.using(alias).all().delete()
    WorkflowStep.objects.using(alias).all().delete()
    WorkflowRun.objects.using(alias).all().delete()


def _start_all(engine: WorkflowEngine, clock: FakeClock, priorities: list[int]) -> list[str]:
    """Start one run per priority, in this order, a millisecond apart: their ids."""
    ids = []
    for n, priority in enumerate(priorities):
        ids.append(str(engine.start(prt_plain, {"n": n}, priority=priority).id))
        clock.advance(0.001)
    return ids


def _expected(ids: list[str], priorities: list[int]) -> list[str]:
    """Highest priority first, then in start order."""
    order = sorted(range(len(ids)), key=lambda n: (-priorities[n], n))
    return [ids[n] for n in order]


PRIORITIES = st.lists(st.integers(min_value=-100, max_value=100), min_size=1, max_size=8)
# Few distinct values, so that ties (first in, first out) come up often.
TIED = st.lists(st.sampled_from([-100, -1, 0, 0, 7, 100]), min_size=2, max_size=8)
EXAMPLES = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@EXAMPLES
@given(priorities=st.one_of(PRIORITIES, TIED))
def test_due_runs_are_claimed_by_priority_then_start_order(
    alias: str, priorities: list[int]
) -> None:
    _empty(alias)
    engine, clock = _engine(alias)
    ids = _start_all(engine, clock, priorities)
    claimed = [str(run_id) for _ in ids for run_id in engine.claim_due_runs(1)]
    assert claimed == _expected(ids, priorities)
    assert engine.claim_due_runs(1) == []


@EXAMPLES
@given(priorities=st.one_of(PRIORITIES, TIED), pass_order=st.randoms(use_true_random=False))
def test_ready_steps_are_claimed_by_priority_then_first_in(
    alias: str, priorities: list[int], pass_order: Any
) -> None:
    _empty(alias)
    engine, clock = _engine(alias)
    ids = _start_all(engine, clock, priorities)
    # Each run's pass stores its step; the passes run in a random order, and the
    # steps are claimed in their runs' priority order, then in the order stored.
    passes = list(ids)
    pass_order.shuffle(passes)
    for run_id in passes:
        engine.orchestrate(run_id)
    stored = [
        str(run_id)
        for run_id in WorkflowStep.objects.using(alias)
        .order_by("id")
        .values_list("run_id", flat=True)
    ]
    claimed = [str(c.run_id) for _ in ids for c in engine.claim_due_steps(limit=1)]
    by_priority = {run_id: p for run_id, p in zip(ids, priorities, strict=True)}
    assert claimed == sorted(stored, key=lambda r: -by_priority[r])
    assert engine.claim_due_steps(limit=1) == []


def _batch(engine: WorkflowEngine, by: str, batch: int) -> list[Any]:
    """What one claim of ``batch`` ready steps takes: the engine's, or a look of a
    worker thread with ``batch`` free threads (tests/test_batched_claims.py)."""
    if by == "engine":
        return engine.claim_due_steps(limit=batch)
    return [u.claimed for u in claim_batch(Worker(engine, concurrency=batch, notify=False))]


@pytest.mark.parametrize("by", ["engine", "worker"])
@pytest.mark.parametrize("batch", [3, 5])
def test_a_batch_claim_takes_the_highest_priorities(alias: str, batch: int, by: str) -> None:
    engine, clock = _engine(alias)
    priorities = [0, -5, 100, 0, 3, 100, -100]
    ids = _start_all(engine, clock, priorities)
    for run_id in ids:
        engine.orchestrate(run_id)
    got = [str(c.run_id) for c in _batch(engine, by, batch)]
    assert got == _expected(ids, priorities)[:batch]


@pytest.mark.parametrize("by", ["engine", "worker"])
@pytest.mark.parametrize("batch", [3, 5])
def test_a_batch_claim_of_due_runs_takes_the_highest_priorities(
    alias: str, batch: int, by: str
) -> None:
    engine, clock = _engine(alias)
    priorities = [0, -5, 100, 0, 3, 100, -100]
    ids = _start_all(engine, clock, priorities)
    if by == "engine":
        got = {str(run_id) for run_id in engine.claim_due_runs(batch)}
    else:
        units = claim_batch(Worker(engine, concurrency=batch, notify=False))
        got = {str(u.run_id) for u in units}
    assert got == set(_expected(ids, priorities)[:batch])


def test_steps_and_child_runs_inherit_the_runs_priority(alias: str) -> None:
    engine, _ = _engine(alias)
    run = engine.start(prt_parent, {"x": 1}, priority=-20)
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == "completed", run.error
    child = WorkflowRun.objects.using(alias).get(workflow="prt_plain")
    assert child.priority == -20
    priorities = set(
        WorkflowStep.objects.using(alias)
        .filter(run__in=[run.id, child.id])
        .values_list("priority", flat=True)
    )
    assert priorities == {-20}


def test_the_workflows_default_priority_and_the_call_overriding_it(alias: str) -> None:
    engine, _ = _engine(alias)
    assert engine.start(prt_urgent, 1).priority == 50
    assert engine.start(prt_urgent, 2, priority=-3).priority == -3
    assert engine.start(prt_plain, 3).priority == 0
    assert engine.start(prt_plain, 4, priority=100).priority == 100
    assert engine.start(prt_plain, 5, priority=-100).priority == -100
    engine.run_until_idle()
    assert set(WorkflowStep.objects.using(alias).values_list("priority", flat=True)) == {
        50,
        -3,
        0,
        100,
        -100,
    }


@pytest.mark.parametrize(
    ("priority", "error", "message"),
    [
        (101, ValueError, "from -100 to 100"),
        (-101, ValueError, "from -100 to 100"),
        (10**9, ValueError, "from -100 to 100"),
        ("5", TypeError, "must be an int"),
        (1.5, TypeError, "must be an int"),
        (True, TypeError, "must be an int"),
    ],
)
def test_a_priority_outside_the_range_is_refused_and_starts_nothing(
    alias: str, priority: Any, error: type[Exception], message: str
) -> None:
    engine, _ = _engine(alias)
    with pytest.raises(error, match=message):
        engine.start(prt_plain, 1, priority=priority)
    assert not WorkflowRun.objects.using(alias).exists()


def test_a_workflow_declared_with_a_bad_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="from -100 to 100"):
        workflow(name="prt_bad", priority=200)
    with pytest.raises(TypeError, match="must be an int"):
        workflow(name="prt_bad", priority=None)  # type: ignore[arg-type]


def test_one_priority_is_first_in_first_out(alias: str) -> None:
    engine, clock = _engine(alias)
    ids = _start_all(engine, clock, [7] * 6)
    claimed = [str(run_id) for _ in ids for run_id in engine.claim_due_runs(1)]
    assert claimed == ids
    for run_id in reversed(ids):  # steps stored in the opposite order
        engine.orchestrate(run_id)
    steps = [str(c.run_id) for _ in ids for c in engine.claim_due_steps(limit=1)]
    assert steps == list(reversed(ids))
