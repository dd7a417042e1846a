"""How limited queues' steps are claimed: in one statement on PostgreSQL, in priority
order across limited and free queues, and with lapsed claims never held back by a
backlog of fresh steps (SQLite, PostgreSQL, MariaDB)."""

from __future__ import annotations

from datetime import timedelta
from types import MappingProxyType
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import QueueClaim, StepStatus, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.control import _rates
from pikku_django.workflows.control.queues import parse_queues
from pikku_django.workflows.steps._claims import IN_ORDER_EVERY
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")


@step(name="lc_echo")
def lc_echo(data: Any) -> Any:
    return data


@workflow(name="lc_one")
def lc_one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("work", lc_echo, inp)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


def _engine(alias: str, queues: dict[str, Any]) -> WorkflowEngine:
    return WorkflowEngine(
        alias,
        leases=InMemoryLeaseService(),
        clock=FakeClock(),
        config=EngineConfig.from_settings(
            database=alias, queues=MappingProxyType(parse_queues(queues))
        ),
    )


def _ready(engine: WorkflowEngine, queue: str, count: int, priority: int = 0) -> list[Any]:
    """``count`` runs on ``queue`` whose one step waits ready: the runs."""
    runs = [engine.start(lc_one, n, queue=queue, priority=priority) for n in range(count)]
    while due := engine.claim_due_runs(10):
        for run_id in due:
            engine.orchestrate(run_id)
    return runs


@pytest.mark.parametrize("limits", [{"concurrency": 5}, {"rate": "50/1h"}])
def test_the_head_of_the_claim_order_goes_first_across_limited_and_free_queues(
    alias: str, limits: dict[str, Any]
) -> None:
    engine = _engine(alias, {"limited": limits})
    _ready(engine, "free", 2, priority=0)
    _ready(engine, "limited", 2, priority=50)
    _ready(engine, "free", 1, priority=90)
    claimed = [engine.claim_due_steps(limit=1, busy=True)[0] for _ in range(5)]
    steps = WorkflowStep.objects.using(alias).in_bulk([c.step_id for c in claimed])
    order = [(c.queue, steps[c.step_id].priority, c.step_id) for c in claimed]
    # Highest priority first, then first stored, whichever queue a step is on.
    assert order == sorted(order, key=lambda o: (-o[1], o[2]))
    assert [q for q, _, _ in order] == ["free", "limited", "limited", "free", "free"]
    assert engine.claim_due_steps(limit=1, busy=True) == []


@pytest.mark.parametrize("left", ["lapsed", "retry"])
def test_a_lapsed_claim_or_due_retry_is_not_held_back_by_fresh_steps(alias: str, left: str) -> None:
    engine = _engine(alias, {"limited": {"concurrency": 50}})
    for queue in ("free", "limited"):
        [lapsing] = _ready(engine, queue, 1)
        [claimed] = engine.claim_due_steps([queue], limit=1)
        assert claimed.run_id == lapsing.id
        rows = WorkflowStep.objects.using(alias).filter(id=claimed.step_id)
        if left == "lapsed":
            rows.update(lease_expires_at=1)
        else:
            due = engine.clock.now() - timedelta(seconds=1)
            rows.update(status=StepStatus.FAILED, lease_expires_at=None, available_at=due)
        _ready(engine, queue, IN_ORDER_EVERY + 2)  # a backlog of fresh steps behind it
        looks = []
        for _ in range(IN_ORDER_EVERY):
            [got] = engine.claim_due_steps([queue], limit=1, busy=True)
            looks.append(got.run_id)
            if got.run_id == lapsing.id:
                break
        assert looks[-1] == lapsing.id, f"{queue}: not reclaimed in {len(looks)} busy looks"
        assert got.attempt == 2
        assert got.reclaimed == (left == "lapsed")


@db_mark("postgres")
def test_a_busy_look_in_claim_order_with_only_fresh_steps_ready_claims_them_at_once() -> None:
    """With no retry due and no claim lapsed, the look in claim order is the fresh
    claim: one look at the other two kinds of ready step, then the claim."""
    alias = database_alias("postgres")
    engine = _engine(alias, {})
    _ready(engine, "free", IN_ORDER_EVERY + 1)
    seen = []
    for _ in range(IN_ORDER_EVERY):
        with CaptureQueriesContext(connections[alias]) as queries:
            [claimed] = engine.claim_due_steps(["free"], limit=1, busy=True)
        seen.append(len(queries.captured_queries))
        assert claimed.attempt == 1
        assert claimed.started_at is not None
    # Fifteen fresh claims, and one look in claim order that found only fresh steps.
    assert sorted(seen) == [1] * (IN_ORDER_EVERY - 1) + [2]


@pytest.mark.parametrize(
    ("limits", "statements"),
    [
        ({"rate": "100/1h"}, ["pikku_queue_claim"]),
        ({"concurrency": 4}, ["BEGIN", "pg_advisory_xact_lock", "pikku_step_attempt", "COMMIT"]),
        (
            {"concurrency": 4, "rate": "100/1h"},
            ["BEGIN", "pg_advisory_xact_lock", "pikku_queue_claim", "COMMIT"],
        ),
    ],
)
@db_mark("postgres")
def test_a_limited_queues_fresh_step_is_claimed_in_one_statement_on_postgresql(
    monkeypatch: pytest.MonkeyPatch, limits: dict[str, Any], statements: list[str]
) -> None:
    alias = database_alias("postgres")
    monkeypatch.setattr(_rates, "PRUNE_EVERY", 10**9)  # no prune in the statements counted
    engine = _engine(alias, {"limited": limits})
    _ready(engine, "limited", 3)
    assert len(engine.claim_due_steps(["limited"], limit=1, busy=True)) == 1  # makes slots
    with CaptureQueriesContext(connections[alias]) as queries:
        [claimed] = engine.claim_due_steps(["limited"], limit=1, busy=True)
    sql = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(sql) == len(statements), sql
    for text, marker in zip(sql, statements, strict=True):
        assert marker in text, text
    assert claimed.attempt == 1
    step_row = WorkflowStep.objects.using(alias).get(id=claimed.step_id)
    assert step_row.status == StepStatus.RUNNING
    if "rate" in limits:  # both claims stamped a slot of their own
        stamped = QueueClaim.objects.using(alias).filter(queue="limited", claimed_ms__gt=0)
        assert stamped.count() == 2
