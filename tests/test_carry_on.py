"""A worker thread carries a run on: the step a pass reaches is stored already claimed,
a succeeded step is followed by its run's next pass in the same thread, and inline
steps are stored once, with their outcome. On SQLite, PostgreSQL and MariaDB (the
writes have a single-statement form on PostgreSQL and an ORM form elsewhere).
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connections

from pikku_django.dbclock import store_now_ms
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import (
    AttemptStatus,
    RunStatus,
    StepAttempt,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows import FakeClock, WorkflowEngine, step, workflow
from pikku_django.workflows.engine import StepClaimer
from pikku_django.workflows.errors import StepFunctionNotFoundError
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.store import NewStep, Settled
from pikku_django.workflows.store.postgresql import PostgresStore
from pikku_django.workflows.worker import _carrying as carrying_module
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")
SEEN: dict[str, list[Any]] = {}


@step(name="carry_echo")
def echo(data: dict[str, Any]) -> Any:
    return data["n"]


@workflow(name="carry_three")
def three(ctx: WorkflowContext, inp: dict[str, Any] | None) -> list[Any]:
    queue = (inp or {}).get("queue")
    return [ctx.do(f"s{n}", echo, {"n": n}, queue=queue) for n in range(3)]


@workflow(name="carry_inline")
def inline_steps(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    alias, tag = inp["db"], inp["tag"]

    def look() -> int:
        # While the function runs, its step has no row yet.
        SEEN.setdefault(tag, []).append(
            WorkflowStep.objects.using(alias).filter(run_id=ctx.run_id, name="look").exists()
        )
        return 7

    return ctx.do("look", look)


@workflow(name="carry_inline_fails")
def inline_fails(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    def boom() -> None:
        raise RuntimeError("first attempt fails")

    return ctx.do("boom", boom, retries=2, retry_delay=30)


@workflow(name="carry_inline_tx")
def inline_tx(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    alias = inp["db"]

    def make_group() -> str:
        Group.objects.using(alias).create(name=inp["group"])
        # Another pass of the run stores the step first (its lease had lapsed).
        other = threading.Thread(target=_store_step_elsewhere, args=(alias, ctx.run_id))
        other.start()
        other.join()
        return "mine"

    return ctx.do("tx", make_group, transactional=True)


def _store_step_elsewhere(alias: str, run_id: uuid.UUID) -> None:
    try:
        WorkflowStep.objects.using(alias).create(
            run_id=run_id,
            name="tx",
            kind="inline",
            status=StepStatus.SUCCEEDED,
            result="theirs",
            attempt=1,
        )
    finally:
        connections[alias].close()


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


CLAIMER = StepClaimer("host:1:2")


def test_a_pass_with_a_claimer_stores_the_step_it_reaches_claimed(engine: WorkflowEngine) -> None:
    run = engine.start(three)
    [run_id] = engine.claim_due_runs(1)
    claimed = engine.orchestrate(run_id, claimer=CLAIMER)

    assert claimed is not None
    assert (claimed.name, claimed.attempt, claimed.function) == ("s0", 1, "carry_echo")
    row = engine.steps().get(id=claimed.step_id)
    assert (row.status, row.attempt, row.available_at) == (StepStatus.RUNNING, 1, None)
    now = store_now_ms(engine.using)
    assert now < row.lease_expires_at <= now + engine.config.lease_ms_for_queue("default") + 1000
    [attempt] = engine.attempts().filter(step_id=row.id)
    assert (attempt.attempt, attempt.status, attempt.worker) == (1, StepStatus.RUNNING, "host:1:2")
    # Parked: nothing wakes the run until its step settles.
    assert engine.get_run(run.id).wake_at is None


def test_carrying_a_run_step_by_step_completes_it(engine: WorkflowEngine) -> None:
    run = engine.start(three)
    [run_id] = engine.claim_due_runs(1)
    claimed = engine.orchestrate(run_id, claimer=CLAIMER)
    names = []
    while claimed is not None:
        names.append(claimed.name)
        wakes = engine.get_run(run.id).wakes
        assert engine.execute_step(claimed, wake="pass") == "succeeded"
        # Left for this thread to pass next: no other worker is woken, but were this
        # thread to die first, the run falls due once its run lease would have lapsed.
        parked = engine.get_run(run.id)
        assert parked.wakes == wakes
        lease = timedelta(milliseconds=engine.config.run_lease_ms)
        assert parked.wake_at is not None
        assert engine.clock.now() + lease < parked.wake_at <= engine.clock.now() + 2 * lease
        assert engine.claim_due_runs(1) == []
        claimed = engine.orchestrate(run.id, claimer=CLAIMER)
    run = engine.get_run(run.id)
    assert names == ["s0", "s1", "s2"]
    assert (run.status, run.output) == (RunStatus.COMPLETED, [0, 1, 2])
    workers = set(engine.attempts().filter(step__run_id=run.id).values_list("worker", flat=True))
    assert workers == {"host:1:2"}


def test_a_claimer_takes_only_steps_of_its_queues(engine: WorkflowEngine) -> None:
    run = engine.start(three, {"queue": "mail"})
    [run_id] = engine.claim_due_runs(1)
    assert engine.orchestrate(run_id, claimer=StepClaimer("host:1:2", ("default",))) is None
    row = engine.steps().get(run_id=run.id, name="s0")
    assert (row.status, row.attempt, row.queue) == (StepStatus.SCHEDULED, 0, "mail")
    # A worker serving that queue claims it from the queue as usual.
    [claimed] = engine.claim_due_steps(["mail"], 1, "host:3:4")
    assert claimed.step_id == row.id


def test_a_claimed_step_is_not_stored_for_a_run_that_stopped_running(
    engine: WorkflowEngine,
) -> None:
    run = engine.start(three)
    engine.cancel(run.id)
    new = _new_step(run.id, "late")
    assert engine.store.insert_claimed(new, lease_ms=5000, worker="w", park_wakes=0) is None
    assert not engine.steps().filter(run_id=run.id).exists()


def test_a_claimed_step_that_exists_is_left_alone(engine: WorkflowEngine) -> None:
    run = engine.start(three)
    [run_id] = engine.claim_due_runs(1)
    engine.orchestrate(run_id)  # no claimer: s0 is scheduled
    before = engine.steps().get(run_id=run.id, name="s0")
    new = _new_step(run.id, "s0")
    assert engine.store.insert_claimed(new, lease_ms=5000, worker="w", park_wakes=0) is None
    after = engine.steps().get(id=before.id)
    assert (after.status, after.attempt) == (StepStatus.SCHEDULED, 0)
    assert not engine.attempts().filter(step_id=before.id).exists()


def test_a_settle_of_a_replaced_attempt_writes_nothing(engine: WorkflowEngine) -> None:
    engine.start(three)
    [run_id] = engine.claim_due_runs(1)
    first = engine.orchestrate(run_id, claimer=CLAIMER)
    assert first is not None
    engine.steps().filter(id=first.step_id).update(lease_expires_at=0)
    [second] = engine.claim_due_steps()
    assert second.attempt == 2
    assert engine.store.settle(first.step_id, 1, StepStatus.SUCCEEDED, result="stale") is None
    settled = engine.store.settle(second.step_id, 2, StepStatus.SUCCEEDED, result=2)
    assert settled == Settled(run_id, RunStatus.RUNNING, engine.get_run(run_id).wakes, 2)
    row = engine.steps().get(id=first.step_id)
    assert (row.status, row.result, row.lease_expires_at) == (StepStatus.SUCCEEDED, 2, None)
    stale, fresh = engine.attempts().filter(step_id=row.id).order_by("attempt")
    assert (stale.status, stale.result) == (AttemptStatus.SUPERSEDED, None)
    assert stale.finished_at is not None
    assert (fresh.status, fresh.result) == (StepStatus.SUCCEEDED, 2)
    assert fresh.finished_at is not None


def test_an_inline_step_is_stored_once_with_its_outcome(engine: WorkflowEngine) -> None:
    tag = uuid.uuid4().hex
    run = engine.start(inline_steps, {"db": engine.using, "tag": tag})
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, 7)
    assert SEEN[tag] == [False]
    row = engine.steps().get(run_id=run.id, name="look")
    assert (row.kind, row.status, row.attempt, row.result) == ("inline", "succeeded", 1, 7)
    [attempt] = engine.attempts().filter(step_id=row.id)
    assert (attempt.attempt, attempt.status, attempt.result) == (1, StepStatus.SUCCEEDED, 7)
    assert attempt.started_at <= attempt.finished_at


def test_an_inline_first_attempt_that_fails_waits_for_its_retry(engine: WorkflowEngine) -> None:
    run = engine.start(inline_fails)
    engine.run_until_idle()
    row = engine.steps().get(run_id=run.id, name="boom")
    assert (row.status, row.attempt, row.retries) == (StepStatus.FAILED, 1, 2)
    assert row.error["message"] == "first attempt fails"
    assert row.available_at == engine.clock.now() + timedelta(seconds=30)
    assert engine.get_run(run.id).wake_at == row.available_at
    [attempt] = engine.attempts().filter(step_id=row.id)
    assert attempt.status == StepStatus.FAILED
    assert attempt.error["message"] == "first attempt fails"
    engine.clock.advance(30)
    engine.run_until_idle()
    row.refresh_from_db(using=engine.using)
    assert row.attempt == 2


@pytest.mark.parametrize(
    "alias", [pytest.param("postgres", marks=db_mark("postgres"), id="postgres")], indirect=True
)
def test_a_transactional_inline_step_stored_elsewhere_first_rolls_back(
    engine: WorkflowEngine,
) -> None:
    group = f"carry-{uuid.uuid4().hex[:12]}"
    run = engine.start(inline_tx, {"db": engine.using, "group": group})
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "theirs")
    assert not Group.objects.using(engine.using).filter(name=group).exists()


def test_postgres_writes_are_single_statements(alias: str) -> None:
    engine = WorkflowEngine(alias)
    assert isinstance(engine.store, PostgresStore) == (alias == database_alias("postgres"))


def test_a_worker_thread_carries_each_run_from_pass_to_pass(alias: str) -> None:
    engine = WorkflowEngine(alias)
    runs = [engine.start(three).id for _ in range(3)]
    worker = Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0)
    worker.run()
    for run_id in runs:
        assert engine.get_run(run_id).status == RunStatus.COMPLETED
        attempts = StepAttempt.objects.using(alias).filter(step__run_id=run_id)
        assert attempts.count() == 3
        assert len(set(attempts.values_list("worker", flat=True))) == 1
    # One pass per step and one to finish: none was repeated for want of a lease.
    assert worker.passes == 3 * 4
    assert worker.counts["finished"] == 9


def test_past_its_time_a_carried_run_goes_back_to_the_queue(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(carrying_module, "CHAIN_SECONDS", 0)
    engine = WorkflowEngine(alias)
    run = engine.start(three)
    worker = Worker(engine, concurrency=2, until_idle=True, poll_interval=0.05, idle_grace=0)
    worker.run()
    run = engine.get_run(run.id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, [0, 1, 2])
    assert WorkflowRun.objects.using(alias).get(id=run.id).wakes >= 3


def _new_step(run_id: uuid.UUID, name: str) -> NewStep:
    return NewStep(
        run_id=run_id,
        name=name,
        kind="queued",
        function="carry_echo",
        input={"n": 0},
        retries=0,
        retry_delay=0.0,
        backoff="fixed",
        queue="default",
        transactional=False,
    )


def test_the_timers_thread_starts_callbacks_when_due_unless_cancelled() -> None:
    from pikku_django.timers import call_later

    ran: list[str] = []
    done = threading.Event()

    def record() -> None:
        ran.append(threading.current_thread().name)
        done.set()

    cancelled = call_later(0.05, lambda: ran.append("cancelled"), name="never")
    cancelled.cancel()
    started = time.monotonic()
    call_later(0.1, record, name="pikku-test-timer")
    assert done.wait(60)
    assert time.monotonic() - started >= 0.1
    time.sleep(0.1)
    assert ran == ["pikku-test-timer"]


@step(name="carry_lines")
def order_lines() -> dict[str, int]:
    # Keys in an order PostgreSQL's jsonb does not keep (it stores shorter keys first).
    return {"widget-large": 3, "nut": 1, "bolt": 2, "é": 4}


@step(name="carry_reserve")
def reserve(data: dict[str, Any]) -> str:
    return data["sku"]


@workflow(name="carry_by_key_order")
def by_key_order(ctx: WorkflowContext, inp: Any) -> list[Any]:
    lines = ctx.do("lines", order_lines)
    # Repeated names are numbered in call order, so the key order must be the same
    # on every replay, whether the result came from this process or the database.
    return [ctx.do("reserve", reserve, {"sku": sku}) for sku in lines]


@workflow(name="carry_by_inline_key_order")
def by_inline_key_order(ctx: WorkflowContext, inp: Any) -> list[Any]:
    lines = ctx.do("lines", order_lines, queued=False)  # read back from the database later
    return [ctx.do("reserve", reserve, {"sku": sku}) for sku in lines]


@pytest.mark.parametrize("wf", [by_key_order, by_inline_key_order], ids=["queued", "inline"])
def test_a_carried_run_replays_results_in_stored_key_order(alias: str, wf: Any) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(wf)
    Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0).run()
    run = engine.get_run(run.id)
    assert run.status == RunStatus.COMPLETED, run.error
    stored = engine.steps().get(run_id=run.id, name="lines").result
    assert run.output == list(stored)
    for n, sku in enumerate(stored):
        name = "reserve" if n == 0 else f"reserve#{n}"
        assert engine.steps().get(run_id=run.id, name=name).result == sku


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "not-prepared"])
@pytest.mark.parametrize(
    "alias", [pytest.param("postgres", marks=db_mark("postgres"), id="postgres")], indirect=True
)
def test_postgres_statements_prepared_or_not(alias: str, prepared: bool, settings: Any) -> None:
    settings.PIKKU = {**settings.PIKKU, "PREPARED_STATEMENTS": prepared}
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    assert engine.store.prepared is prepared
    run = engine.start(three)
    Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0).run()
    assert engine.get_run(run.id).output == [0, 1, 2]
    # The worker thread's connection is gone; this one prepares on its own.
    engine.start(inline_fails)
    engine.run_until_idle()
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert (cursor.fetchone()[0] > 0) is prepared


def test_a_look_for_ready_steps_sees_only_the_queues_asked(engine: WorkflowEngine) -> None:
    run = engine.start(three, {"queue": "mail"})
    now = engine.clock.now()
    exact = isinstance(engine.store, PostgresStore)  # elsewhere it always says yes
    assert engine.store.ready_steps_exist(now, []) is not exact  # no step yet
    [run_id] = engine.claim_due_runs(1)
    engine.orchestrate(run_id)  # s0 scheduled on "mail"
    assert engine.store.ready_steps_exist(now, []) is True
    assert engine.store.ready_steps_exist(now, ["mail", "x"]) is True
    assert engine.store.ready_steps_exist(now, ["other"]) is not exact
    assert engine.claim_due_steps(["other"]) == []
    engine.steps().filter(run_id=run.id).update(available_at=now + timedelta(seconds=5))
    assert engine.store.ready_steps_exist(now, ["mail"]) is not exact
    assert engine.claim_due_steps(["mail"]) == []


def test_claiming_due_runs_pushes_each_back_by_the_pass_timeout(engine: WorkflowEngine) -> None:
    first, second = engine.start(three), engine.start(three)
    claimed = engine.claim_due_runs(5)
    assert sorted(claimed) == sorted([first.id, second.id])
    # The pass timeout, but no longer than the run lease the pass holds (and a margin).
    config = engine.config
    timeout = min(config.run_pass_timeout, config.run_lease_ms / 1000 + 5)
    until = engine.clock.now() + timedelta(seconds=timeout)
    assert {engine.get_run(r).wake_at for r in claimed} == {until}
    assert engine.claim_due_runs(5) == []


def test_a_run_passed_elsewhere_is_woken_again_a_second_later(alias: str) -> None:
    leases = InMemoryLeaseService()
    engine = WorkflowEngine(alias, leases=leases)
    run = engine.start(three)
    other = leases.acquire(f"workflow-run:{run.id}", "another worker", 60_000)
    worker = Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0)
    before = engine.clock.now()
    assert worker._one_unit() == 0
    woken = engine.get_run(run.id)
    assert before < woken.wake_at <= engine.clock.now() + timedelta(seconds=1)
    assert not engine.steps().filter(run_id=run.id).exists()
    leases.release(other)
    Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=5).run()
    assert engine.get_run(run.id).output == [0, 1, 2]


@workflow(name="carry_inline_missing")
def inline_missing(ctx: WorkflowContext, inp: Any) -> Any:
    def dispatch_to_handler() -> None:
        raise StepFunctionNotFoundError("billing.charge")

    return ctx.do("dispatch", dispatch_to_handler)


def test_an_inline_step_missing_its_function_suspends_the_run(engine: WorkflowEngine) -> None:
    run = engine.start(inline_missing)
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert run.status == RunStatus.SUSPENDED
    assert run.suspend_reason.startswith("RPC_NOT_FOUND")
    assert "billing.charge" in run.suspend_reason
    row = engine.steps().get(run_id=run.id, name="dispatch")
    assert (row.status, row.attempt) == (StepStatus.SUSPENDED, 0)
    assert row.error["code"] == "RPC_NOT_FOUND"
    assert not engine.attempts().filter(step_id=row.id).exists()


# -- what a carried pass must not change ----------------------------------------------

CHARGES: list[str] = []
CARRY: dict[str, Any] = {}


@step(name="carry_same")
def same(data: Any) -> Any:
    if data == "cancel me":
        # The run is cancelled (from the admin, say) while this step runs.
        def cancel() -> None:
            try:
                WorkflowEngine(CARRY["alias"]).cancel(CARRY["run"])
            finally:
                connections[CARRY["alias"]].close()

        other = threading.Thread(target=cancel)
        other.start()
        other.join()
    return data


@workflow(name="carry_inline_then_queued")
def inline_then_queued(ctx: WorkflowContext, inp: Any) -> list[Any]:
    def charge() -> str:
        CHARGES.append(str(ctx.run_id))
        return "charged"

    return [ctx.do("charge", charge), ctx.do("q1", same, 1), ctx.do("q2", same, 2)]


def test_an_inline_step_before_queued_ones_runs_once(alias: str) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(inline_then_queued)
    Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0).run()
    assert engine.get_run(run.id).output == ["charged", 1, 2]
    assert CHARGES.count(str(run.id)) == 1


@workflow(name="carry_cancelled_meanwhile")
def cancelled_meanwhile(ctx: WorkflowContext, inp: Any) -> list[Any]:
    first = ctx.do("q1", same, "cancel me")
    return [first, ctx.do("ship", lambda: CHARGES.append(f"shipped {ctx.run_id}"))]


def test_a_run_cancelled_during_a_carried_step_is_not_passed_again(alias: str) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(cancelled_meanwhile)
    CARRY.update(alias=alias, run=run.id)
    Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0).run()
    assert engine.get_run(run.id).status == RunStatus.CANCELLED
    assert f"shipped {run.id}" not in CHARGES
    assert list(engine.steps().filter(run_id=run.id).values_list("name", flat=True)) == ["q1"]


@step(name="carry_pair")
def pair() -> list[str]:
    return ["a", "b"]


@workflow(name="carry_changes_its_input")
def changes_its_input(ctx: WorkflowContext, inp: dict[str, Any]) -> list[Any]:
    n = inp.pop("n")
    return [ctx.do("q1", same, n), ctx.do("q2", same, n + 1)]


@workflow(name="carry_changes_a_result")
def changes_a_result(ctx: WorkflowContext, inp: Any) -> list[Any]:
    items = ctx.do("items", pair)
    items.append("local")
    return [ctx.do("q1", same, len(items)), ctx.do("q2", same, len(items))]


@pytest.mark.parametrize(
    ("wf", "expected"),
    [(changes_its_input, [5, 6]), (changes_a_result, [3, 3])],
    ids=["input", "result"],
)
def test_workflow_code_may_change_its_input_and_results(
    alias: str, wf: Any, expected: list[int]
) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(wf, {"n": 5})
    Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0).run()
    run = engine.get_run(run.id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, expected), run.error


ATTEMPT_INPUTS: list[Any] = []


@workflow(name="carry_consumes_its_input")
def consumes_its_input(ctx: WorkflowContext, inp: Any) -> Any:
    def charge(data: dict[str, Any]) -> str:
        ATTEMPT_INPUTS.append(dict(data))
        card = data.pop("card")
        if len(ATTEMPT_INPUTS) == 1:
            raise RuntimeError("gateway timeout")
        return card

    return ctx.do("charge", charge, {"card": "4242"}, retries=2, retry_delay=1)


def test_an_inline_retry_gets_the_input_as_given(engine: WorkflowEngine) -> None:
    ATTEMPT_INPUTS.clear()
    run = engine.start(consumes_its_input)
    engine.run_until_idle()
    assert engine.steps().get(run_id=run.id, name="charge").input == {"card": "4242"}
    engine.clock.advance(2)
    engine.run_until_idle()
    assert engine.get_run(run.id).output == "4242"
    assert ATTEMPT_INPUTS == [{"card": "4242"}, {"card": "4242"}]


SHOWN: list[str] = []


@step(name="carry_odd_numbers")
def odd_numbers() -> dict[str, Any]:
    return {"amount": 1e20, "neg": -0.0, "zz": 1, "a": 2}


@step(name="carry_show")
def show(data: Any) -> str:
    SHOWN.append(repr(data))
    return repr(data)


@workflow(name="carry_as_stored")
def as_stored(ctx: WorkflowContext, inp: Any) -> list[str]:
    numbers = ctx.do("numbers", odd_numbers)
    shown = ctx.do("show", show, {"zz": 1, "a": 2})
    return [repr(numbers), shown, repr(ctx.do("inline", odd_numbers, queued=False))]


def test_a_carried_pass_sees_values_as_a_read_returns_them(alias: str) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(as_stored)
    Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0).run()
    run = engine.get_run(run.id)
    steps = {s.name: s for s in engine.steps().filter(run_id=run.id)}
    # What each pass saw equals what a fresh read of the database returns.
    assert run.output == [
        repr(steps["numbers"].result),
        repr(steps["show"].input),
        repr(steps["inline"].result),
    ]
    assert SHOWN[-1] == repr(steps["show"].input)


class FlakyLeases(InMemoryLeaseService):
    """A lease store whose second acquire of a run lease fails (a network blip)."""

    def __init__(self) -> None:
        super().__init__()
        self.acquires = 0

    def acquire(self, key: str, holder: str, ttl_ms: int) -> Any:
        if key.startswith("workflow-run:"):
            self.acquires += 1
            if self.acquires == 2:
                raise ConnectionError("lease store unreachable")
        return super().acquire(key, holder, ttl_ms)


def test_a_pass_owed_after_a_lease_error_is_left_to_any_worker(alias: str, settings: Any) -> None:
    # A step lease shorter than the run lease: the run lease is given back before
    # the step, and taking it again for the next pass fails.
    settings.PIKKU = {**settings.PIKKU, "STEP_LEASE_MS": 20_000, "RUN_LEASE_MS": 30_000}
    engine = WorkflowEngine(alias, leases=FlakyLeases())
    run = engine.start(three)
    worker = Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=3)
    worker.run()
    assert worker.errors == 1
    assert engine.get_run(run.id).output == [0, 1, 2]
