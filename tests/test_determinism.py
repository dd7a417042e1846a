"""A replay must reach every step the run recorded before it records a new one: a step
name built from a random number, the time or a new id fails the run with
NonDeterministicWorkflowError at its second step instead of recording a new step on
every pass for ever. And a run records at most ``MAX_STEPS_PER_RUN`` steps (or its
workflow's ``max_steps``). Legitimate shapes (parallel groups, sleeps, event waits,
child runs, retried steps, patches, inline steps) are never flagged."""

from __future__ import annotations

import contextlib
import logging
import random
import time
import uuid
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from pikku_django.models import RunStatus, WorkflowStep
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.errors import NonDeterministicWorkflowError, StepFailedError
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")

#: A worker still at it after this many step calls loops: the test stops it.
RUNAWAY = 40


class Runaway(BaseException):
    """Raised by a step called too often in an inline run (the engine lets it through)."""


_calls: dict[str, int] = {}
_workers: list[Worker] = []


def _count(key: str) -> None:
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] >= RUNAWAY:
        if not _workers:
            raise Runaway()  # an inline run: out of the caller's start
        for worker in _workers:
            worker.stop()


@step(name="det.echo", retries=0)
def echo(value: Any) -> Any:
    _count("echo")
    return value


_flaky: dict[str, int] = {}


@step(name="det.flaky", retries=2, retry_delay=0)
def flaky(key: str) -> str:
    _flaky[key] = _flaky.get(key, 0) + 1
    if _flaky[key] < 3:
        raise RuntimeError("not yet")
    return key


@workflow(name="det.random_names")
def random_names(ctx: WorkflowContext, inp: Any) -> Any:
    first = ctx.do(f"step-{random.random()}", echo, 1)
    return ctx.do(f"then-{uuid.uuid4()}", echo, first + 1)


@workflow(name="det.clock_names")
def clock_names(ctx: WorkflowContext, inp: Any) -> Any:
    total = 0
    for i in range(3):
        total += ctx.do(f"fetch-{i}-{time.time_ns()}", echo, i)
    return total


@workflow(name="det.swallows")
def swallows(ctx: WorkflowContext, inp: Any) -> Any:
    for i in range(3):
        with contextlib.suppress(Exception):  # what a careless body might do
            ctx.do(f"try-{i}-{uuid.uuid4().hex}", echo, i)
    return "done"


@workflow(name="det.loop", max_steps=5)
def loop(ctx: WorkflowContext, inp: int) -> int:
    return sum(ctx.do("item", echo, i) for i in range(inp))


@workflow(name="det.loop_default")
def loop_default(ctx: WorkflowContext, inp: int) -> int:
    return sum(ctx.do("item", echo, i) for i in range(inp))


@workflow(name="det.fan_out", max_steps=6)
def fan_out(ctx: WorkflowContext, inp: int) -> Any:
    group = ctx.parallel("fan")
    for i in range(inp):
        group.do("kid", child, i)
    return group.join()


@workflow(name="det.child")
def child(ctx: WorkflowContext, inp: int) -> int:
    return int(ctx.do("double", echo, inp * 2))


#: The steps a run of every_shape records (publish, patch and event steps included).
EVERY_SHAPE_STEPS = 15


@workflow(name="det.every_shape", max_steps=EVERY_SHAPE_STEPS)
def every_shape(ctx: WorkflowContext, inp: str) -> Any:
    """Steps recorded in every legitimate order (none may be flagged), up to its limit."""
    seen = [ctx.do("local", lambda: 1)]
    group = ctx.parallel("fan")
    for i in range(3):
        group.do("branch", echo, i)
    group.do("kid", child, 5)
    seen.append(sum(group.join()))
    ctx.sleep("nap", 60)
    if ctx.patched("extra-step"):
        seen.append(ctx.do("extra", echo, 7))
    seen.append(ctx.do("flaky", flaky, inp))
    try:
        ctx.do("fails", "det.fails", None)
    except StepFailedError:
        seen.append(ctx.do("fallback", echo, "fallback"))
    seen.append(ctx.wait_for_event("go"))
    ctx.set_progress(len(seen))
    seen.append(ctx.do("child", child, 1))
    return seen


@step(name="det.fails", retries=1, retry_delay=0)
def fails(value: Any) -> Any:
    raise ValueError("always")


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture(autouse=True)
def _reset() -> Any:
    _calls.clear()
    _workers.clear()
    yield
    _workers.clear()


def _work(engine: WorkflowEngine) -> Worker:
    """Run a worker until idle (stopped by a step when it runs away)."""
    worker = Worker(engine, concurrency=1, until_idle=True, poll_interval=0.05, idle_grace=0)
    _workers.append(worker)
    worker.run()
    return worker


def _steps(alias: str, run_id: Any) -> list[str]:
    return list(
        WorkflowStep.objects.using(alias)
        .filter(run_id=run_id)
        .order_by("id")
        .values_list("name", flat=True)
    )


@pytest.mark.parametrize("wf", [random_names, clock_names, swallows])
def test_a_step_name_that_changes_on_replay_fails_the_run_at_its_second_step(
    alias: str, wf: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(wf)
    with caplog.at_level(logging.ERROR, logger="pikku_django.workflows"):
        _work(engine)  # returns: nothing is left to do
    run = engine.get_run(run.id)
    names = _steps(alias, run.id)
    assert len(names) == 1, names  # the one step recorded; no new one on each pass
    assert _calls.get("echo", 0) == 1
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == NonDeterministicWorkflowError.code
    assert run.error["type"].endswith("NonDeterministicWorkflowError")
    message = run.error["message"]
    assert repr(names[0]) in message  # the step recorded and not reached
    new = message.split("new step ")[1].split(" without")[0]
    assert new.strip("'") != names[0]  # and the new one, named
    assert new.strip("'").split("-")[0] == names[0].split("-")[0]
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any(str(run.id) in r.getMessage() and names[0] in r.getMessage() for r in logged)


def test_an_inline_run_with_changing_step_names_fails_at_its_second_step(alias: str) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(random_names, inline=True)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == NonDeterministicWorkflowError.code
    assert len(_steps(alias, run.id)) == 1


def test_every_legitimate_order_of_steps_replays_to_the_end(alias: str) -> None:
    clock = FakeClock()
    engine = WorkflowEngine(alias, clock=clock)
    run = engine.start(every_shape, "k-" + alias)
    _work(engine)
    clock.advance(61)
    _work(engine)
    engine.events.send(run.id, "go", "went")
    _work(engine)
    run = engine.get_run(run.id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == [1, 13, 7, "k-" + alias, "fallback", "went", 2]
    # Exactly as many steps as its max_steps allows: the limit is not passed.
    assert len(_steps(alias, run.id)) == EVERY_SHAPE_STEPS


def test_a_run_records_at_most_its_workflows_max_steps(alias: str) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(loop, 20)
    _work(engine)
    run = engine.get_run(run.id)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "STEP_LIMIT"
    assert "limit of 5 steps" in run.error["message"]
    assert "MAX_STEPS_PER_RUN" in run.error["message"]
    assert "max_steps" in run.error["message"]
    assert len(_steps(alias, run.id)) == 5
    # Within its limit the same loop completes.
    done = engine.start(loop, 5)
    _work(engine)
    assert engine.get_run(done.id).output == 10


def test_max_steps_per_run_bounds_every_workflow_without_its_own(alias: str) -> None:
    engine = WorkflowEngine(alias, config=EngineConfig.from_settings(max_steps_per_run=3))
    run = engine.start(loop_default, 4)
    _work(engine)
    run = engine.get_run(run.id)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "STEP_LIMIT"
    assert "PIKKU['MAX_STEPS_PER_RUN']" in run.error["message"]
    assert len(_steps(alias, run.id)) == 3


def test_child_branches_stored_together_count_towards_the_limit(alias: str) -> None:
    engine = WorkflowEngine(alias)
    run = engine.start(fan_out, 10)
    _work(engine)
    run = engine.get_run(run.id)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "STEP_LIMIT"
    assert "'kid#5'" in run.error["message"]  # the group and five branches fill it
    assert len(_steps(alias, run.id)) <= 6


@pytest.mark.django_db
def test_a_step_limit_below_one_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match="max_steps"):
        workflow(name="det.no_steps", max_steps=0)(loop_default)
    with pytest.raises(ImproperlyConfigured, match="MAX_STEPS_PER_RUN"):
        from django.test import override_settings

        with override_settings(PIKKU={"MAX_STEPS_PER_RUN": "many"}):
            EngineConfig.from_settings()
