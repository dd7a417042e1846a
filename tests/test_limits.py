"""Queue rate limits and per-key concurrency, in-process on SQLite, PostgreSQL and
MariaDB (tests/test_limits_workers.py runs them against worker processes)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pikku_django.checks import check_queue_settings
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import QueueClaim, RunStatus, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.control._admission import admit, admittable
from pikku_django.workflows.control._rates import GROW_AT_LEAST, prune_claims
from pikku_django.workflows.control.queues import Rate, parse_queues
from pikku_django.workflows.store import NewRun
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, db_mark
from tests.test_batched_claims import claim_batch

VENDORS = ("sqlite", "postgres", "mariadb")


@step(name="lim_echo")
def lim_echo(data: Any) -> Any:
    return data


@workflow(name="lim_one")
def lim_one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("work", lim_echo, inp)


@workflow(name="lim_wait")
def lim_wait(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.suspend("held")


@workflow(
    name="lim_per_customer",
    concurrency_key=lambda inp: f"customer:{inp['customer']}",
    concurrency_limit=2,
)
def lim_per_customer(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("work", lim_echo, inp)


@workflow(name="lim_single", concurrency_key="nightly")
def lim_single(ctx: WorkflowContext, inp: Any) -> Any:
    return inp


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


def _engine(alias: str, queues: dict[str, Any] | None = None) -> WorkflowEngine:
    return WorkflowEngine(
        alias,
        leases=InMemoryLeaseService(),
        clock=FakeClock(),
        config=EngineConfig.from_settings(
            database=alias, queues=MappingProxyType(parse_queues(queues or {}))
        ),
    )


def _admit(engine: WorkflowEngine) -> int:
    return admit(engine.store, 100, engine.clock.now())


def _passed(engine: WorkflowEngine) -> list[Any]:
    """The runs a worker passes now, each passed once."""
    ids = []
    while got := engine.claim_due_runs(1):
        ids += got
        for run_id in got:
            engine.orchestrate(run_id)
    return ids


# -- per-key concurrency ---------------------------------------------------------------


def test_runs_sharing_a_key_start_one_at_a_time_in_start_order(alias: str) -> None:
    engine = _engine(alias)
    runs = [engine.start(lim_one, n, concurrency_key="acct-1") for n in range(3)]
    other = engine.start(lim_one, "x", concurrency_key="acct-2")
    assert all(r.key_waiting and r.wake_at is None for r in runs)
    assert _passed(engine) == []  # nothing is due before a worker admits it
    assert _admit(engine) == 2
    assert set(_passed(engine)) == {runs[0].id, other.id}
    assert _admit(engine) == 0  # acct-1's first run is in progress (its step waits)
    # A worker's run_until_idle admits the next of the key as each one ends.
    engine.run_until_idle()
    statuses = WorkflowRun.objects.using(alias).values_list("status", flat=True)
    assert set(statuses) == {RunStatus.COMPLETED}
    first_steps = WorkflowStep.objects.using(alias).filter(run__concurrency_key="acct-1")
    assert list(first_steps.order_by("id").values_list("run_id", flat=True)) == [r.id for r in runs]


def test_a_keys_limit_lets_that_many_run_at_once(alias: str) -> None:
    engine = _engine(alias)
    for n in range(5):
        engine.start(lim_one, n, concurrency_key="k", concurrency_limit=3)
    assert _admit(engine) == 3
    assert len(_passed(engine)) == 3
    assert _admit(engine) == 0
    waiting = WorkflowRun.objects.using(alias).filter(key_waiting=True).count()
    assert waiting == 2


def test_a_suspended_run_holds_its_slot_and_an_ended_one_frees_it(alias: str) -> None:
    engine = _engine(alias)
    held = engine.start(lim_wait, None, concurrency_key="k")
    nxt = engine.start(lim_one, 1, concurrency_key="k")
    assert _admit(engine) == 1
    _passed(engine)
    held.refresh_from_db(using=alias)
    assert held.status == RunStatus.SUSPENDED
    assert _admit(engine) == 0
    assert not admittable(engine.store, engine.clock.now())
    engine.cancel(held.id)
    assert admittable(engine.store, engine.clock.now())
    assert _admit(engine) == 1
    assert _passed(engine) == [nxt.id]


@db_mark("postgres")
def test_an_ending_run_tells_workers_only_while_keyed_runs_wait() -> None:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    alias = database_alias("postgres")
    engine = _engine(alias)

    def notifies(end: Any) -> bool:
        with CaptureQueriesContext(connections[alias]) as captured:
            end()
        return any("pikku.concurrency_keys" in q["sql"] for q in captured.captured_queries)

    held = engine.start(lim_wait, None, concurrency_key="k")
    engine.start(lim_one, 1, concurrency_key="k")
    assert _admit(engine) == 1  # the look finds a run waiting behind ``held``
    _passed(engine)
    assert notifies(lambda: engine.cancel(held.id))
    assert _admit(engine) == 1
    engine.run_until_idle()
    assert _admit(engine) == 0  # a look that finds none waiting
    other = engine.start(lim_wait, None)
    _passed(engine)
    assert not notifies(lambda: engine.cancel(other.id))


def test_a_cancelled_waiting_run_is_never_started(alias: str) -> None:
    engine = _engine(alias)
    first = engine.start(lim_one, 0, concurrency_key="k")
    gone = engine.start(lim_one, 1, concurrency_key="k")
    last = engine.start(lim_one, 2, concurrency_key="k")
    engine.cancel(gone.id)
    engine.run_until_idle()
    passed = WorkflowStep.objects.using(alias).order_by("id").values_list("run_id", flat=True)
    assert list(passed) == [first.id, last.id]
    gone.refresh_from_db(using=alias)
    assert gone.status == RunStatus.CANCELLED


def test_a_waiting_run_with_a_later_start_waits_for_it_too(alias: str) -> None:
    engine = _engine(alias)
    late = engine.start(lim_one, 0, concurrency_key="k", delay=60)
    now = engine.start(lim_one, 1, concurrency_key="k")
    assert _admit(engine) == 1
    assert _passed(engine) == [now.id]
    engine.run_until_idle()
    assert _admit(engine) == 0  # not due yet
    engine.clock.advance(61)  # type: ignore[attr-defined]
    assert _admit(engine) == 1
    assert _passed(engine) == [late.id]


def test_the_workflows_default_key_and_limit(alias: str) -> None:
    engine = _engine(alias)
    runs = [engine.start(lim_per_customer, {"customer": c}) for c in "aaab"]
    assert {r.concurrency_key for r in runs} == {"customer:a", "customer:b"}
    assert {r.concurrency_limit for r in runs} == {2}
    assert _admit(engine) == 3  # two of a's, b's one
    single = engine.start(lim_single, 1)
    assert single.concurrency_key == "nightly"
    # The call overrides the workflow's key and limit.
    own = engine.start(lim_single, 2, concurrency_key="mine", concurrency_limit=4)
    assert (own.concurrency_key, own.concurrency_limit) == ("mine", 4)


def test_runs_an_intake_creates_wait_for_their_key_too(alias: str) -> None:
    engine = _engine(alias)
    ids = engine.create_runs(
        [NewRun("lim_per_customer", {"customer": "z", "n": n}) for n in range(3)]
    )
    runs = WorkflowRun.objects.using(alias).filter(id__in=ids)
    assert {(r.concurrency_key, r.key_waiting) for r in runs} == {("customer:z", True)}
    assert _admit(engine) == 2
    assert len(_passed(engine)) == 2


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"concurrency_key": 7}, TypeError),
        ({"concurrency_key": ""}, ValueError),
        ({"concurrency_key": "x" * 256}, ValueError),
        ({"concurrency_key": "k", "concurrency_limit": 0}, ValueError),
        ({"concurrency_key": "k", "concurrency_limit": True}, TypeError),
        ({"concurrency_key": "k", "inline": True}, ValueError),
    ],
)
def test_bad_key_options_are_refused_and_start_nothing(
    alias: str, options: dict[str, Any], error: type[Exception]
) -> None:
    engine = _engine(alias)
    with pytest.raises(error, match=r"concurrency|inline"):
        engine.start(lim_one, 1, **options)
    assert not WorkflowRun.objects.using(alias).exists()


def test_a_workflow_declared_with_a_bad_key_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="concurrency_key"):
        workflow(name="lim_bad", concurrency_key=5)  # type: ignore[call-overload]
    with pytest.raises(ImproperlyConfigured, match="concurrency_limit"):
        workflow(name="lim_bad", concurrency_key="k", concurrency_limit=0)


# -- rate limits -----------------------------------------------------------------------


def _ready_steps(engine: WorkflowEngine, count: int, queue: str) -> None:
    for n in range(count):
        engine.start(lim_one, n, queue=queue)
    _passed(engine)


def test_a_rated_queue_claims_at_most_its_rate_per_period(alias: str) -> None:
    engine = _engine(alias, {"slow": {"rate": "2/1h"}})
    _ready_steps(engine, 4, "slow")
    engine.start(lim_one, "free", queue="free", priority=-100)
    _passed(engine)
    got = engine.claim_due_steps(limit=10)
    assert sorted(c.queue for c in got) == ["free", "slow", "slow"]
    for claimed in got:
        engine.execute_step(claimed, wake=False)
    assert engine.claim_due_steps(limit=10) == []  # settled claims still count
    # The queue has as many slots as its rate's count, each used once.
    assert QueueClaim.objects.using(alias).filter(queue="slow").count() == 2
    # Once a claim is older than the period its slot is free again.
    QueueClaim.objects.using(alias).update(claimed_ms=0)
    assert len(engine.claim_due_steps(limit=10)) == 2
    assert QueueClaim.objects.using(alias).filter(queue="slow", claimed_ms__gt=0).count() == 2
    assert QueueClaim.objects.using(alias).filter(queue="slow").count() == 2


def test_a_lowered_rate_uses_fewer_slots_and_prunes_the_rest(alias: str) -> None:
    engine = _engine(alias, {"slow": {"rate": "5/1h"}})
    _ready_steps(engine, 8, "slow")
    assert len(engine.claim_due_steps(limit=10)) == 5
    slots = QueueClaim.objects.using(alias).filter(queue="slow")
    assert sorted(slots.values_list("slot", flat=True)) == [0, 1, 2, 3, 4]
    slots.update(claimed_ms=0)  # a period ago
    lowered = _engine(alias, {"slow": {"rate": "2/1h"}})
    assert len(lowered.claim_due_steps(limit=10)) == 2  # slots 0 and 1 only
    past = slots.filter(slot__gte=2).count()  # 3, unless the claim pruned them already
    assert prune_claims(lowered.store, "slow", Rate(2, 3600)) == past
    assert sorted(slots.values_list("slot", flat=True)) == [0, 1]
    assert lowered.claim_due_steps(limit=10) == []


def test_a_queues_slots_grow_as_it_claims_up_to_its_count(alias: str) -> None:
    engine = _engine(alias, {"big": {"rate": f"{GROW_AT_LEAST * 3}/1h"}})
    _ready_steps(engine, GROW_AT_LEAST * 3 + 2, "big")
    slots = QueueClaim.objects.using(alias).filter(queue="big")
    assert len(engine.claim_due_steps(limit=1)) == 1
    assert slots.count() == GROW_AT_LEAST  # made as the queue first needs them
    assert len(engine.claim_due_steps(limit=GROW_AT_LEAST)) == GROW_AT_LEAST
    assert slots.count() == GROW_AT_LEAST * 2  # doubled
    assert len(engine.claim_due_steps(limit=100)) == GROW_AT_LEAST * 3 - GROW_AT_LEAST - 1
    assert slots.count() == GROW_AT_LEAST * 3  # never past the count
    assert engine.claim_due_steps(limit=100) == []
    assert sorted(slots.values_list("slot", flat=True)) == list(range(GROW_AT_LEAST * 3))


def _batch(engine: WorkflowEngine, by: str) -> list[Any]:
    """One claim of up to 10 steps: the engine's, or a look of a worker thread whose
    worker has 10 free threads (tests/test_batched_claims.py)."""
    if by == "engine":
        return engine.claim_due_steps(limit=10)
    return [u.claimed for u in claim_batch(Worker(engine, concurrency=10, notify=False))]


@pytest.mark.parametrize("by", ["engine", "worker"])
def test_a_queues_rate_and_concurrency_both_hold(alias: str, by: str) -> None:
    engine = _engine(alias, {"both": {"rate": "3/1h", "concurrency": 2}})
    _ready_steps(engine, 5, "both")
    first = _batch(engine, by)
    assert len(first) == 2  # the concurrency limit
    engine.execute_step(first[0], wake=False)
    assert len(_batch(engine, by)) == 1  # the rate's third
    engine.execute_step(first[1], wake=False)
    assert _batch(engine, by) == []  # a free slot, but no claim left


@pytest.mark.parametrize("by", ["engine", "worker"])
def test_a_batch_claim_takes_a_limited_queues_room_and_the_free_queues_steps(
    alias: str, by: str
) -> None:
    engine = _engine(alias, {"tight": {"concurrency": 2}})
    _ready_steps(engine, 4, "tight")
    _ready_steps(engine, 3, "free")
    got = _batch(engine, by)
    assert sorted(c.queue for c in got) == ["free"] * 3 + ["tight"] * 2
    assert _batch(engine, by) == []  # the limited queue is full, the free one empty


def test_the_pass_leaves_a_rated_queues_step_to_the_claim(alias: str) -> None:
    from pikku_django.workflows.engine import StepClaimer

    engine = _engine(alias, {"slow": {"rate": "5/1m"}})
    run = engine.start(lim_one, 1, queue="slow")
    [run_id] = engine.claim_due_runs(1)
    assert engine.orchestrate(run_id, claimer=StepClaimer("w")) is None
    assert WorkflowStep.objects.using(alias).get(run_id=run.id).status == StepStatus.SCHEDULED


OPS = st.lists(st.sampled_from(["claim", "claim", "settle", "age"]), min_size=1, max_size=20)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(count=st.integers(1, 4), steps=st.integers(1, 8), ops=OPS, batch=st.integers(1, 3))
def test_no_sequence_of_claims_exceeds_the_rate(
    alias: str, count: int, steps: int, ops: list[str], batch: int
) -> None:
    WorkflowRun.objects.using(alias).all().delete()
    QueueClaim.objects.using(alias).all().delete()
    engine = _engine(alias, {"rated": {"rate": f"{count}/1h"}})
    _ready_steps(engine, steps, "rated")
    held: list[Any] = []
    in_period = 0  # claims made since the last time every claim aged out
    for op in ops:
        if op == "claim":
            got = engine.claim_due_steps(limit=batch)
            in_period += len(got)
            held += got
        elif op == "settle" and held:
            engine.execute_step(held.pop(0), wake=False)
        elif op == "age":
            QueueClaim.objects.using(alias).update(claimed_ms=0)
            in_period = 0
        assert in_period <= count


def test_a_rate_no_longer_warns() -> None:
    ids = [m.id for m in check_queue_settings()]
    assert "pikku_django.W012" not in ids
