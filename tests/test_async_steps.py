"""Async steps on a worker's event loop: fencing, lease renewal on the loop, the
concurrency bound, and what is refused (async workflow bodies, transactional async
steps)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from pikku_django.models import RunStatus, StepStatus, WorkflowStep
from pikku_django.workflows import (
    ClaimedStep,
    StepOutcome,
    WorkflowContext,
    WorkflowEngine,
    step,
    workflow,
)
from pikku_django.workflows.errors import WorkflowDefinitionError
from pikku_django.workflows.worker._event_loop import AsyncSteps
from tests.conftest import database_alias, on_databases

ALL = ("sqlite", "postgres", "mariadb")

_probe = {"now": 0, "most": 0}
_probe_lock = threading.Lock()


@step(name="tests.async_probe")
async def async_probe(data: dict[str, Any]) -> dict[str, Any]:
    """Awaits ``seconds``, counting how many probes await at once."""
    with _probe_lock:
        _probe["now"] += 1
        _probe["most"] = max(_probe["most"], _probe["now"])
    try:
        await asyncio.sleep(data["seconds"])
    finally:
        with _probe_lock:
            _probe["now"] -= 1
    return {"n": data.get("n"), "thread": threading.current_thread().name}


@workflow(name="tests.async_probes")
def async_probes(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("probe", "tests.async_probe", input)


class Loop:
    """An AsyncSteps runner with the outcomes it reports, closed at the end."""

    def __init__(self, engine: WorkflowEngine, limit: int = 10) -> None:
        self.outcomes: dict[tuple[int, int], StepOutcome] = {}
        self.done = threading.Condition()
        self.steps = AsyncSteps(engine, limit=limit, on_start=lambda c: None, on_done=self._done)

    def _done(self, claimed: ClaimedStep, outcome: StepOutcome) -> None:
        with self.done:
            self.outcomes[claimed.step_id, claimed.attempt] = outcome
            self.done.notify_all()

    def wait(self, claimed: ClaimedStep, timeout: float = 60) -> StepOutcome:
        key = (claimed.step_id, claimed.attempt)
        with self.done:
            assert self.done.wait_for(lambda: key in self.outcomes, timeout), key
            return self.outcomes[key]


@pytest.fixture
def loop_of() -> Any:
    made: list[Loop] = []

    def make(engine: WorkflowEngine, limit: int = 10) -> Loop:
        made.append(Loop(engine, limit))
        return made[-1]

    yield make
    for loop in made:
        loop.steps.close(30)


def claim_one(engine: WorkflowEngine) -> ClaimedStep:
    (claimed,) = engine.claim_due_steps(limit=1, worker="test")
    return claimed


def started(engine: WorkflowEngine, seconds: float, n: int = 0) -> Any:
    run = engine.start("tests.async_probes", {"seconds": seconds, "n": n})
    engine.orchestrate(run.id)  # the pass that schedules the step
    return run


@on_databases(*ALL)
def test_a_late_result_of_a_superseded_async_attempt_is_refused(vendor: str, loop_of: Any) -> None:
    engine = WorkflowEngine(database_alias(vendor))
    run = started(engine, 0.3)
    first = claim_one(engine)
    # The first attempt's claim lapses (its worker stalled) and a second is claimed.
    assert engine.refresh_step_lease(first.step_id, -1, first.attempt)
    second = claim_one(engine)
    assert second.attempt == first.attempt + 1
    loop = loop_of(engine)
    loop.steps.submit(second)
    loop.steps.submit(first)
    assert loop.wait(second) is StepOutcome.SUCCEEDED
    assert loop.wait(first) is StepOutcome.SUPERSEDED
    step_row = WorkflowStep.objects.using(engine.using).get(id=first.step_id)
    assert (step_row.status, step_row.attempt) == (StepStatus.SUCCEEDED, second.attempt)
    history = {a.attempt: a.status for a in step_row.attempts.all()}
    assert history[second.attempt] == "succeeded"
    assert history[first.attempt] != "succeeded"
    engine.run_until_idle()
    run.refresh_from_db(using=engine.using)
    assert run.status == RunStatus.COMPLETED
    assert run.output["thread"] == "pikku-worker-aio"


@on_databases(*ALL)
def test_the_loop_renews_an_async_steps_lease_while_it_awaits(vendor: str, loop_of: Any) -> None:
    engine = WorkflowEngine(database_alias(vendor))
    started(engine, 2.5)
    # A claim of 1.2 s, renewed every 0.6 s by the loop while the step awaits 2.5 s
    # (twice the lease: it outlives the claim only by its renewals).
    claimed = replace(claim_one(engine), lease_ms=1200, claimed_at=time.monotonic())
    assert engine.refresh_step_lease(claimed.step_id, 1200, claimed.attempt)
    loop = loop_of(engine)
    loop.steps.submit(claimed)
    watch_until = time.monotonic() + 2.1
    while time.monotonic() < watch_until:
        time.sleep(0.2)
        # Nobody can take it over: its lease never lapses.
        assert engine.claim_due_steps(limit=1, worker="thief") == []
    assert loop.wait(claimed) is StepOutcome.SUCCEEDED
    row = WorkflowStep.objects.using(engine.using).get(id=claimed.step_id)
    assert (row.status, row.attempt) == (StepStatus.SUCCEEDED, 1)


@on_databases("postgres")
def test_at_most_the_limit_of_async_steps_run_at_once(vendor: str, loop_of: Any) -> None:
    engine = WorkflowEngine(database_alias(vendor))
    for n in range(6):
        started(engine, 0.3, n)
    claims = engine.claim_due_steps(limit=6, worker="test")
    assert len(claims) == 6
    _probe["most"] = 0
    loop = loop_of(engine, limit=2)
    for claimed in claims:
        loop.steps.submit(claimed)  # blocks while two are in flight
    for claimed in claims:
        assert loop.wait(claimed) is StepOutcome.SUCCEEDED
    assert _probe["most"] == 2


@on_databases("sqlite")
def test_an_async_step_run_without_a_worker_runs_to_its_end(vendor: str) -> None:
    """run_until_idle (and inline runs) call an async step on the calling thread."""
    engine = WorkflowEngine(database_alias(vendor))
    run = engine.start("tests.async_probes", {"seconds": 0.01, "n": 7})
    engine.run_until_idle()
    run.refresh_from_db(using=engine.using)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output["n"] == 7
    inline = engine.start("tests.async_probes", {"seconds": 0.01, "n": 8}, inline=True)
    assert inline.status == RunStatus.COMPLETED, inline.error
    assert inline.output["n"] == 8


@on_databases("sqlite")
def test_an_inline_async_callable_runs_in_the_pass(vendor: str) -> None:
    async def fetch(data: dict[str, Any]) -> int:
        await asyncio.sleep(0)
        return int(data["x"]) * 2

    @workflow(name="tests.async_inline")
    def inline_body(ctx: WorkflowContext, input: Any) -> Any:
        return ctx.do("fetch", fetch, {"x": 21})

    engine = WorkflowEngine(database_alias(vendor))
    run = engine.start("tests.async_inline")
    engine.run_until_idle()
    run.refresh_from_db(using=engine.using)
    assert (run.status, run.output) == (RunStatus.COMPLETED, 42)


def test_an_async_workflow_body_is_refused_at_registration() -> None:
    with pytest.raises(TypeError, match="replayed synchronously"):

        @workflow(name="tests.async_body")
        async def body(ctx: WorkflowContext, input: Any) -> Any:
            return None


def test_a_transactional_async_step_is_refused_at_registration() -> None:
    with pytest.raises(TypeError, match="cannot be transactional"):

        @step(name="tests.async_tx", transactional=True)
        async def tx(data: Any) -> Any:
            return None


@on_databases("sqlite")
def test_ctx_do_refuses_transactional_for_an_async_step(vendor: str) -> None:
    @workflow(name="tests.async_tx_call")
    def body(ctx: WorkflowContext, input: Any) -> Any:
        return ctx.do("probe", "tests.async_probe", {"seconds": 0}, transactional=True)

    engine = WorkflowEngine(database_alias(vendor))
    run = engine.start("tests.async_tx_call")
    engine.run_until_idle()
    run.refresh_from_db(using=engine.using)
    assert run.status == RunStatus.FAILED
    assert run.error["type"].endswith(WorkflowDefinitionError.__name__)
    assert "cannot be transactional" in run.error["message"]


def test_the_concurrency_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ASYNC_CONCURRENCY"):
        AsyncSteps(WorkflowEngine(), limit=0, on_start=print, on_done=lambda c, o: None)


@workflow(name="tests.async_api_story")
def async_api_story(ctx: WorkflowContext, input: Any) -> Any:
    answer = ctx.suspend("waiting for an answer")
    return {"answer": answer}


@pytest.mark.django_db(transaction=True)
def test_the_async_api_starts_reads_resumes_and_cancels_runs() -> None:
    from asgiref.sync import async_to_sync

    from pikku_django import acancel_workflow, aresume_workflow, astart_workflow
    from pikku_django.workflows import WorkflowRunNotFoundError, aworkflow_status

    async def story() -> None:
        run = await astart_workflow("tests.async_api_story", inline=True)
        assert run.status == RunStatus.SUSPENDED
        status = await aworkflow_status(run.id)
        assert (status.status, status.suspend_reason) == ("suspended", "waiting for an answer")
        resumed = await aresume_workflow(run.id, 42)
        assert (resumed.status, resumed.output) == (RunStatus.COMPLETED, {"answer": 42})
        assert (await aworkflow_status(run.id)).as_dict()["output"] == {"answer": 42}
        other = await astart_workflow("tests.async_api_story", idempotency_key="k")
        assert (await astart_workflow("tests.async_api_story", idempotency_key="k")).id == other.id
        cancelled = await acancel_workflow(other.id)
        assert cancelled.status == RunStatus.CANCELLED
        with pytest.raises(WorkflowRunNotFoundError):
            await aworkflow_status("00000000-0000-0000-0000-000000000000")

    async_to_sync(story)()
