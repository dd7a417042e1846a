"""Queues: a run's queue for its steps, queues declared in PIKKU["QUEUES"] (leases,
concurrency limits, rates), their system checks, and the limit inside the claim.

On SQLite, PostgreSQL and MariaDB, in-process; tests/test_queues_workers.py runs
the limit against worker processes.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from django.core import checks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pikku_django.checks import check_queue_settings, check_settings
from pikku_django.dbclock import EpochMs
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.control.queues import QueueSettings, Rate, parse_queues, parse_rate
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")


@step(name="qut_echo")
def qut_echo(data: Any) -> Any:
    return data


@step(name="qut_mail", queue="mail")
def qut_mail(data: Any) -> Any:
    return data


@workflow(name="qut_steps")
def qut_steps(ctx: WorkflowContext, inp: Any) -> Any:
    """Its own queue for each kind of step: none named, the step's, the call's."""
    return [
        ctx.do("plain", qut_echo, 1),
        ctx.do("mail", qut_mail, 2),
        ctx.do("called", qut_echo, 3, queue="urgent"),
    ]


@workflow(name="qut_reports", queue="reports")
def qut_reports(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("plain", qut_echo, inp)


@workflow(name="qut_one")
def qut_one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("work", qut_echo, inp)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


def _engine(alias: str, **config: Any) -> WorkflowEngine:
    return WorkflowEngine(
        alias,
        leases=InMemoryLeaseService(),
        clock=FakeClock(),
        config=EngineConfig.from_settings(database=alias, **config),
    )


def _limited(alias: str, **concurrency: int) -> WorkflowEngine:
    queues = parse_queues({q: {"concurrency": n} for q, n in concurrency.items()})
    return _engine(alias, queues=MappingProxyType(queues))


def _queues_of(alias: str, run: WorkflowRun) -> dict[str, str]:
    steps = WorkflowStep.objects.using(alias).filter(run_id=run.id)
    return dict(steps.values_list("name", "queue"))


# -- a run's queue ----------------------------------------------------------------------


def test_a_runs_queue_is_for_its_steps_that_name_none(alias: str) -> None:
    engine = _engine(alias)
    run = engine.start(qut_steps, None, queue="bulk")
    assert run.queue == "bulk"
    for queue in ("bulk", "mail", "urgent"):
        assert engine.claim_due_runs(1) == [run.id]
        engine.orchestrate(run.id)
        assert engine.claim_due_steps(["nothing-here"]) == []
        # Each step waits on its own queue: a worker serving only it claims it.
        [claimed] = engine.claim_due_steps([queue])
        engine.execute_step(claimed)
    engine.run_until_idle()
    run.refresh_from_db()
    assert run.status == "completed", run.error
    assert _queues_of(alias, run) == {"plain": "bulk", "mail": "mail", "called": "urgent"}


def test_without_a_queue_steps_go_to_the_default_queue(alias: str) -> None:
    engine = _engine(alias)
    run = engine.start(qut_steps, None)
    assert run.queue == ""
    engine.run_until_idle()
    assert _queues_of(alias, run) == {"plain": "default", "mail": "mail", "called": "urgent"}


def test_the_workflows_queue_and_the_call_overriding_it(alias: str) -> None:
    engine = _engine(alias)
    first = engine.start(qut_reports, 1)
    second = engine.start(qut_reports, 2, queue="other")
    engine.run_until_idle()
    assert _queues_of(alias, first) == {"plain": "reports"}
    assert _queues_of(alias, second) == {"plain": "other"}


@pytest.mark.parametrize("queue", ["", " padded ", "x" * 101, 5, ["a"]])
def test_a_bad_queue_name_is_refused_and_starts_nothing(alias: str, queue: Any) -> None:
    engine = _engine(alias)
    with pytest.raises(ValueError, match="queue name"):
        engine.start(qut_one, 1, queue=queue)
    with pytest.raises(ValueError, match="queue name"):
        workflow(name="qut_bad", queue=queue)
    assert not WorkflowRun.objects.using(alias).exists()


# -- PIKKU["QUEUES"] ----------------------------------------------------------------


def test_queues_fold_in_the_older_queue_lease_setting() -> None:
    queues = parse_queues(
        {"reports": {"lease_ms": 300_000, "concurrency": 8, "rate": "100/1m"}, "mail": {}},
        {"reports": 5_000, "mail": 20_000, "old": 40_000},
    )
    assert queues == {
        "reports": QueueSettings("reports", 300_000, 8, Rate(100, 60.0)),
        "mail": QueueSettings("mail", 20_000),
        "old": QueueSettings("old", 40_000),
    }


def test_an_engine_reads_each_queues_lease_and_limit(settings: Any) -> None:
    settings.PIKKU = {
        "STEP_LEASE_MS": 60_000,
        "QUEUES": {"reports": {"lease_ms": 300_000, "concurrency": 2}},
        "QUEUE_LEASE_MS": {"old": 90_000, "reports": 1},
    }
    config = EngineConfig.from_settings()
    assert config.lease_ms_for_queue("reports") == 300_000
    assert config.lease_ms_for_queue("old") == 90_000
    assert config.lease_ms_for_queue("other") == 60_000
    assert (config.concurrency_of("reports"), config.concurrency_of("old")) == (2, None)


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("100/1m", Rate(100, 60)),
        ("10/s", Rate(10, 1)),
        ("5 / 30s", Rate(5, 30)),
        ("1/h", Rate(1, 3600)),
    ],
)
def test_rates(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["100", "0/1m", "10/0s", "ten/1m", "10/fortnight", 10, None])
def test_bad_rates(text: Any) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


def _ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


@pytest.mark.parametrize(
    ("pikku", "expected"),
    [
        ({}, []),
        ({"QUEUES": {"reports": {"lease_ms": 300_000, "concurrency": 8}}}, []),
        ({"QUEUES": ["reports"]}, ["pikku_django.E017"]),
        ({"QUEUES": {"reports": 8}}, ["pikku_django.E017"]),
        ({"QUEUES": {"reports": {"limit": 8}}}, ["pikku_django.E017"]),
        ({"QUEUES": {"reports": {"concurrency": 0}}}, ["pikku_django.E017"]),
        ({"QUEUES": {"reports": {"lease_ms": "5s"}}}, ["pikku_django.E017"]),
        ({"QUEUES": {"": {}, "a": {"rate": "x"}}}, ["pikku_django.E017", "pikku_django.E017"]),
        ({"QUEUES": {"reports": {"rate": "100/1m"}}}, []),
        ({"QUEUE_LEASE_MS": {"reports": 300_000}}, ["pikku_django.W011"]),
    ],
)
def test_the_queue_settings_check(
    settings: Any, pikku: dict[str, Any], expected: list[str]
) -> None:
    settings.PIKKU = pikku
    assert _ids(check_settings() + check_queue_settings()) == expected


def test_the_deprecation_hint_spells_out_the_new_setting(settings: Any) -> None:
    settings.PIKKU = {"QUEUE_LEASE_MS": {"reports": 300_000}}
    [warning] = check_queue_settings()
    assert "{'reports': {'lease_ms': 300000}}" in (warning.hint or "")


def test_an_engine_refuses_bad_queue_settings(settings: Any) -> None:
    settings.PIKKU = {"QUEUES": {"reports": {"concurrency": -1}}}
    with pytest.raises(ValueError, match="concurrency must be a positive int"):
        EngineConfig.from_settings()


# -- the concurrency limit inside the claim ------------------------------------------


def _ready_steps(engine: WorkflowEngine, count: int, queue: str) -> None:
    for n in range(count):
        engine.start(qut_one, n, queue=queue)
    while engine.claim_due_runs(1):
        pass
    for run in WorkflowRun.objects.using(engine.using).filter(steps__isnull=True):
        engine.orchestrate(run.id)


def _live(alias: str, queue: str) -> int:
    return (
        WorkflowStep.objects.using(alias)
        .filter(queue=queue, status=StepStatus.RUNNING, lease_expires_at__gte=EpochMs())
        .count()
    )


def test_a_limited_queue_claims_at_most_its_limit(alias: str) -> None:
    engine = _limited(alias, tight=2)
    _ready_steps(engine, 5, "tight")
    first = engine.claim_due_steps(limit=10)
    assert len(first) == 2
    assert engine.claim_due_steps(limit=10) == []
    engine.execute_step(first[0])
    [third] = engine.claim_due_steps(limit=10)  # a settled step freed its slot
    assert _live(alias, "tight") == 2
    # A claim whose lease lapsed (its worker died) frees its slot too.
    WorkflowStep.objects.using(alias).filter(id=third.step_id).update(lease_expires_at=0)
    [again] = engine.claim_due_steps(limit=10)
    assert _live(alias, "tight") == 2
    assert engine.claim_due_steps(limit=10) == []
    assert again.step_id != first[1].step_id


def test_a_full_queue_does_not_hold_up_the_others(alias: str) -> None:
    engine = _limited(alias, tight=1)
    _ready_steps(engine, 3, "tight")
    engine.start(qut_one, "free", queue="free", priority=-100)
    [run_id] = engine.claim_due_runs(1)
    engine.orchestrate(run_id)
    claimed = [c.queue for _ in range(3) for c in engine.claim_due_steps(limit=1)]
    assert claimed == ["tight", "free"]


def test_the_pass_leaves_a_limited_queues_step_to_the_claim(alias: str) -> None:
    from pikku_django.workflows.engine import StepClaimer

    engine = _limited(alias, tight=1)
    blocker = engine.start(qut_one, 0, queue="tight")
    engine.orchestrate(blocker.id)
    engine.claim_due_steps(limit=1)
    run = engine.start(qut_one, 1, queue="tight")
    claimed = engine.orchestrate(run.id, claimer=StepClaimer("w"))
    assert claimed is None
    assert WorkflowStep.objects.using(alias).get(run_id=run.id).status == StepStatus.SCHEDULED


OPS = st.lists(st.sampled_from(["claim", "claim", "settle", "lapse"]), min_size=1, max_size=25)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=st.integers(1, 4), steps=st.integers(1, 8), ops=OPS, batch=st.integers(1, 3))
def test_no_sequence_of_claims_settles_and_lapses_exceeds_the_limit(
    alias: str, limit: int, steps: int, ops: list[str], batch: int
) -> None:
    StepAttempt.objects.using(alias).all().delete()
    WorkflowStep.objects.using(alias).all().delete()
    WorkflowRun.objects.using(alias).all().delete()
    engine = _limited(alias, tight=limit)
    _ready_steps(engine, steps, "tight")
    held: list[Any] = []
    for op in ops:
        if op == "claim":
            before = _live(alias, "tight")
            got = engine.claim_due_steps(limit=batch)
            assert len(got) <= min(batch, max(0, limit - before))
            held += got
        elif held and op == "settle":
            engine.execute_step(held.pop(0), wake=False)
        elif held and op == "lapse":
            lapsed = held.pop()
            WorkflowStep.objects.using(alias).filter(id=lapsed.step_id).update(lease_expires_at=0)
        assert _live(alias, "tight") <= limit
