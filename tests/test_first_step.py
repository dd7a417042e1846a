"""A run's first step, found as it starts: stored with the run only when the body's
first act is a queued step a worker may claim (no query, no write, no error before it);
on PostgreSQL a worker's due-run claim stores it claimed with the run's lease, parks
the run and clears the hint, and the worker runs it without a first pass. A worker that
cannot take it (another queue, a limited queue, an unknown workflow, a run with steps,
a lease held elsewhere) clears the hint and passes the run as usual."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import WorkflowContext, WorkflowEngine, registry, step, workflow
from pikku_django.workflows._values import StepClaimer, StepOutcome
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.control.queues import parse_queues
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, db_mark, fresh_database_lease_service, on_databases

CLAIMER = StepClaimer("host:1:2")


@step(name="fs.echo")
def echo(value: Any) -> Any:
    return value


@step(name="fs.slow", timeout=2)
def slow(value: Any) -> Any:
    return value


@workflow(name="fs.two")
def two(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    first = ctx.do("first", echo, {"n": inp["n"], "tag": inp.get("tag")})
    return [first["n"], ctx.do("second", echo, inp["n"] + 1)]


@workflow(name="fs.in_queue")
def in_queue(ctx: WorkflowContext, inp: str) -> Any:
    return ctx.do("only", echo, 1, queue=inp)


@workflow(name="fs.timed")
def timed(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("only", slow, 1)


@workflow(name="fs.inline_first")
def inline_first(ctx: WorkflowContext, inp: Any) -> Any:
    ctx.do("local", lambda: 1)
    return ctx.do("then", echo, 2)


@workflow(name="fs.sleep_first")
def sleep_first(ctx: WorkflowContext, inp: Any) -> Any:
    ctx.sleep("nap", 3600)
    return ctx.do("then", echo, 2)


@workflow(name="fs.queries_first")
def queries_first(ctx: WorkflowContext, inp: Any) -> Any:
    count = WorkflowRun.objects.count()
    return ctx.do("then", echo, count)


@workflow(name="fs.writes_first")
def writes_first(ctx: WorkflowContext, inp: dict[str, str]) -> Any:
    runs = WorkflowRun.objects.using(inp["alias"]).filter(id=inp["id"])
    runs.update(suspend_reason="touched")
    return ctx.do("then", echo, 1)


@workflow(name="fs.swallows_the_refusal")
def swallows_the_refusal(ctx: WorkflowContext, inp: Any) -> Any:
    with contextlib.suppress(BaseException):  # what a careless body might do
        WorkflowRun.objects.count()
    return ctx.do("then", echo, 3)


@workflow(name="fs.raises_first")
def raises_first(ctx: WorkflowContext, inp: Any) -> Any:
    raise ValueError("not today")


@workflow(name="fs.no_steps")
def no_steps(ctx: WorkflowContext, inp: Any) -> Any:
    return inp


@pytest.fixture
def pg() -> str:
    return database_alias("postgres")


@pytest.fixture
def engine(pg: str) -> WorkflowEngine:
    return WorkflowEngine(pg, leases=fresh_database_lease_service(pg))


def first_step(engine: WorkflowEngine, run: WorkflowRun) -> Any:
    return engine.runs().values_list("first_step", flat=True).get(id=run.id)


def claim(engine: WorkflowEngine, claimer: StepClaimer = CLAIMER) -> Any:
    [due] = engine.claim_due_run_rows(1, lease_holder="holder", claimer=claimer)
    return due


pg_mark = db_mark("postgres")


@pg_mark
def test_a_started_run_stores_the_queued_step_its_first_pass_reaches(
    engine: WorkflowEngine,
) -> None:
    run = engine.start(two, {"n": 4, "tag": "x"})
    assert first_step(engine, run) == {
        "name": "first",
        "function": "fs.echo",
        "input": {"n": 4, "tag": "x"},
        "retries": 5,
        "retry_delay": 1.0,
        "backoff": "fixed",
        "queue": "default",
        "transactional": False,
        "timeout": None,
    }


@pg_mark
@pytest.mark.parametrize(
    "wf",
    [inline_first, sleep_first, queries_first, swallows_the_refusal, raises_first, no_steps],
    ids=lambda wf: wf.__name__,
)
def test_nothing_is_stored_when_the_body_reaches_anything_else_first(
    engine: WorkflowEngine, wf: Any
) -> None:
    run = engine.start(wf, 1)
    assert first_step(engine, run) is None
    assert WorkflowStep.objects.using(engine.using).filter(run_id=run.id).count() == 0


@pg_mark
def test_a_body_that_writes_first_does_not_write_at_start(engine: WorkflowEngine) -> None:
    other = engine.start(no_steps, 1)
    run = engine.start(writes_first, {"alias": engine.using, "id": str(other.id)})
    assert first_step(engine, run) is None
    assert engine.runs().get(id=other.id).suspend_reason == ""


@pg_mark
def test_inline_keyed_and_debounced_runs_store_none(engine: WorkflowEngine) -> None:
    inline = engine.start(two, {"n": 1}, inline=True)
    keyed = engine.start(two, {"n": 1}, concurrency_key="k")
    debounced = engine.start(two, {"n": 1}, idempotency_key="d", debounce=60)
    assert [first_step(engine, r) for r in (inline, keyed, debounced)] == [None, None, None]


@pg_mark
def test_a_step_of_a_limited_queue_is_not_stored(pg: str) -> None:
    queues = parse_queues({"limited": {"rate": "5/s"}}, {})
    config = EngineConfig.from_settings(database=pg, queues=queues)
    engine = WorkflowEngine(pg, leases=fresh_database_lease_service(pg), config=config)
    assert first_step(engine, engine.start(in_queue, "limited")) is None
    assert first_step(engine, engine.start(in_queue, "other")) is not None


@pg_mark
def test_the_setting_turns_it_off(pg: str) -> None:
    config = EngineConfig.from_settings(database=pg, first_step_at_start=False)
    engine = WorkflowEngine(pg, leases=fresh_database_lease_service(pg), config=config)
    assert first_step(engine, engine.start(two, {"n": 1})) is None


@on_databases("sqlite", "mariadb")
def test_other_stores_store_none(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias, leases=fresh_database_lease_service(alias))
    assert first_step(engine, engine.start(two, {"n": 1})) is None


@pg_mark
def test_the_claim_stores_it_claimed_parks_the_run_and_clears_the_hint(
    engine: WorkflowEngine,
) -> None:
    run = engine.start(two, {"n": 4})
    due = claim(engine)
    assert due.run.id == run.id
    assert due.lease is not None
    assert due.first_step is not None
    assert due.run.first_step is None
    row = WorkflowStep.objects.using(engine.using).get(run_id=run.id)
    assert (row.name, row.status, row.attempt, row.input) == (
        "first",
        StepStatus.RUNNING,
        1,
        {"n": 4, "tag": None},
    )
    assert row.lease_expires_at is not None
    attempt = StepAttempt.objects.using(engine.using).get(step_id=row.id)
    assert (attempt.attempt, attempt.status, attempt.worker) == (1, "running", CLAIMER.worker)
    stored = engine.runs().get(id=run.id)
    assert (stored.wake_at, stored.first_step) == (None, None)

    claimed = engine.first_step_claimed(due, CLAIMER)
    assert claimed is not None
    assert (claimed.step_id, claimed.name, claimed.function, claimed.attempt) == (
        row.id,
        "first",
        "fs.echo",
        1,
    )
    assert claimed.lease_ms == engine.config.step_lease_ms
    assert claimed.carried is not None
    assert set(claimed.carried.steps) == {"first"}


@pg_mark
def test_the_step_lease_is_capped_by_its_timeout(engine: WorkflowEngine) -> None:
    engine.start(timed)
    claimed = engine.first_step_claimed(claim(engine), CLAIMER)
    assert claimed is not None
    assert (claimed.lease_ms, claimed.timeout) == (2000, 2)


@pg_mark
@pytest.mark.parametrize(
    "why",
    ["other queue", "limited queue", "unknown workflow", "has steps", "lease held", "no claimer"],
)
def test_a_worker_that_cannot_take_it_clears_it_and_passes_the_run(pg: str, why: str) -> None:
    queue = "limited" if why == "limited queue" else "mail"
    config = EngineConfig.from_settings(database=pg)
    if why == "limited queue":
        config = EngineConfig.from_settings(
            database=pg, queues=parse_queues({"limited": {"concurrency": 2}}, {})
        )
    leases = fresh_database_lease_service(pg)
    # Started where the queue has no limits (a start where it has stores no first step).
    run = WorkflowEngine(pg, leases=leases).start(in_queue, queue)
    engine = WorkflowEngine(pg, leases=leases, config=config)
    assert first_step(engine, run) is not None
    claimer: StepClaimer | None = CLAIMER
    if why == "other queue":
        claimer = StepClaimer("host:1:2", ("default",))
    elif why == "no claimer":
        claimer = None
    elif why == "unknown workflow":
        registry.unregister("fs.in_queue")
    elif why == "has steps":
        engine.orchestrate(run.id)  # a pass without a claimer stores the step scheduled
        engine.runs().filter(id=run.id).update(wake_at=engine.clock.now())
    elif why == "lease held":
        leases.acquire(f"workflow-run:{run.id}", "someone else", 30_000)
    try:
        [due] = engine.claim_due_run_rows(1, lease_holder="holder", claimer=claimer)
    finally:
        if why == "unknown workflow":
            registry.workflow(name="fs.in_queue")(in_queue)
    assert due.first_step is None
    assert engine.first_step_claimed(due, CLAIMER) is None
    stored = engine.runs().get(id=run.id)
    assert stored.first_step is None
    assert stored.wake_at is not None  # pushed back for its pass, not parked
    expected = 1 if why == "has steps" else 0
    assert WorkflowStep.objects.using(pg).filter(run_id=run.id).count() == expected


@pg_mark
def test_workers_run_the_first_steps_without_first_passes(engine: WorkflowEngine) -> None:
    runs = [engine.start(two, {"n": n}) for n in range(12)]
    worker = Worker(engine, concurrency=2, until_idle=True, poll_interval=0.05, idle_grace=0)
    worker.run()
    for n, run in enumerate(runs):
        done = engine.runs().get(id=run.id)
        assert (done.status, done.output, done.first_step) == (
            RunStatus.COMPLETED,
            [n, n + 1],
            None,
        )
        steps = WorkflowStep.objects.using(engine.using).filter(run_id=run.id)
        assert sorted((s.name, s.attempt, s.status) for s in steps) == [
            ("first", 1, StepStatus.SUCCEEDED),
            ("second", 1, StepStatus.SUCCEEDED),
        ]
        assert StepAttempt.objects.using(engine.using).filter(step__run_id=run.id).count() == 2
    # Two passes a run (after each step), none before the first step.
    assert worker.passes == 2 * len(runs)


@pg_mark
def test_workers_that_may_not_claim_first_steps_make_the_same_runs(pg: str) -> None:
    config = EngineConfig.from_settings(database=pg, carried_versions_only=True)
    engine = WorkflowEngine(pg, leases=fresh_database_lease_service(pg), config=config)
    runs = [engine.start(two, {"n": n}) for n in range(3)]
    assert all(first_step(engine, run) is not None for run in runs)
    worker = Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0)
    worker.run()
    assert [engine.runs().get(id=r.id).output for r in runs] == [[0, 1], [1, 2], [2, 3]]
    assert worker.passes == 3 * len(runs)  # a first pass each


@workflow(name="fs.one")
def one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("only", echo, inp)


@pg_mark
def test_a_one_step_run_costs_the_worker_two_statements(
    engine: WorkflowEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from pikku_django.workflows.control import _admission
    from pikku_django.workflows.worker._run_lease_hold import take_run_lease

    # No keyed runs wait here, whatever an earlier test in this process saw.
    monkeypatch.setattr(_admission, "_last_seen_waiting", {})

    run = engine.start(one, 7)
    with CaptureQueriesContext(connections[engine.using]) as captured:
        due = claim(engine)
        claimed = engine.first_step_claimed(due, CLAIMER)
        assert claimed is not None
        held = take_run_lease(engine, run.id, due)
        assert held is not None
        outcome, after = engine.execute_and_pass(claimed, CLAIMER, held)
    assert outcome is StepOutcome.SUCCEEDED
    assert after is not None
    assert after.released
    # The claim (run, lease, step and attempt), then the step's success with the run's end.
    assert len(captured.captured_queries) == 2
    done = engine.runs().get(id=run.id)
    assert (done.status, done.output) == (RunStatus.COMPLETED, 7)
