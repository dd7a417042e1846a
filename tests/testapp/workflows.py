"""Workflows for the worker-process tests."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pikku_django.workflows import WorkflowContext, step, workflow
from tests.testapp import async_workflows  # noqa: F401 (registers the async steps)
from tests.testapp.markers import mark_started


@step(name="testapp.record")
def record(data: dict[str, Any]) -> dict[str, Any]:
    from tests.testapp.models import Effect

    Effect.objects.using(data["db"]).create(
        run_id=data["run"], step=data["step"], attempt_pid=os.getpid()
    )
    return {"step": data["step"], "pid": os.getpid()}


@step(name="testapp.slow")
def slow(data: dict[str, Any]) -> dict[str, Any]:
    """Signals that it started (a file), then works for ``seconds``."""
    mark_started(Path(data["started"]))
    time.sleep(data["seconds"])
    return {"pid": os.getpid()}


@workflow(name="testapp.three_records")
def three_records(ctx: WorkflowContext, input: dict[str, Any]) -> list[Any]:
    out = []
    for name in ("a", "b", "c"):
        out.append(
            ctx.do(name, "testapp.record", {"db": input["db"], "run": input["run"], "step": name})
        )
    return out


@workflow(name="testapp.slow_one")
def slow_one(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("slow", "testapp.slow", input)


@step(name="testapp.block_first", retries=3)
def block_first(data: dict[str, Any]) -> dict[str, Any]:
    """The first attempt marks that it started and blocks; later ones return at once."""
    marker = Path(data["started"])
    if not marker.exists():
        mark_started(marker)
        time.sleep(data.get("block", 120))
    return {"pid": os.getpid()}


@step(name="testapp.tx_block_first", retries=3, transactional=True)
def tx_block_first(data: dict[str, Any]) -> dict[str, Any]:
    """Writes a row inside the step's transaction, then (first attempt only) blocks for
    ``block`` seconds (120 unless told)."""
    from tests.testapp.models import Effect

    Effect.objects.using(data["db"]).create(run_id=data["run"], step="tx", attempt_pid=os.getpid())
    marker = Path(data["started"])
    if not marker.exists():
        mark_started(marker)
        time.sleep(data.get("block", 120))
    return {"pid": os.getpid()}


@workflow(name="testapp.blocked")
def blocked(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("work", input.get("step", "testapp.block_first"), input)


@workflow(name="testapp.webhook_event")
def webhook_event(ctx: WorkflowContext, event: dict[str, Any]) -> Any:
    """The run a stored webhook event starts: it answers with the event's data."""
    return event["data"]


@workflow(name="testapp.blocked_pass")
def blocked_pass(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """The first pass marks that it started and blocks in the workflow body, before any
    step; later passes run one step that answers with its worker's pid."""
    marker = Path(input["started"])
    if not marker.exists():
        mark_started(marker)
        time.sleep(300)
    return ctx.do("work", "testapp.slow", {"started": input["started"] + ".step", "seconds": 0})


@step(name="testapp.whose")
def whose(data: dict[str, Any]) -> dict[str, Any]:
    """Which step this is, and the worker process that ran it."""
    return {"i": data["i"], "pid": os.getpid()}


def _seen(i: int) -> int:
    return i


@workflow(name="testapp.settle_then_pass")
def settle_then_pass(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """``steps`` quick steps, one after another (tests/test_crash_recovery_bounds.py
    kills its worker between a step's settle and the pass after it). An inline step
    after each makes the pass after a step write before it stops, so the step's
    success is recorded on its own, with the pass owed to its worker."""
    results = []
    for i in range(input["steps"]):
        results.append(ctx.do(f"s{i}", "testapp.whose", {"i": i}))
        ctx.do(f"seen{i}", _seen, i)
    return results


# -- a deploy: the old and the new code of one workflow (tests/test_deploy.py) --------

DEPLOYED = os.environ.get("PIKKU_TEST_DEPLOYED_CODE", "old")


@step(name="testapp.deploy_add")
def deploy_add(data: dict[str, Any]) -> int:
    return int(data["n"]) + int(data.get("plus", 0))


if DEPLOYED == "new":

    @workflow(name="testapp.deploy", version="2", replays=("1",))
    def deploy(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
        n = ctx.do("a", deploy_add, {"n": inp["n"]})
        if ctx.patched("add-ten"):
            n = ctx.do("ten", deploy_add, {"n": n, "plus": 10})
            ctx.wait_for_event("go")
            return {"path": "new", "n": ctx.do("b", deploy_add, {"n": n}), "pid": os.getpid()}
        ctx.wait_for_event("go")
        return {"path": "old", "n": ctx.do("b", deploy_add, {"n": n}), "pid": os.getpid()}

else:

    @workflow(name="testapp.deploy", version="1")
    def deploy(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
        n = ctx.do("a", deploy_add, {"n": inp["n"]})
        ctx.wait_for_event("go")
        return {"path": "old", "n": ctx.do("b", deploy_add, {"n": n}), "pid": os.getpid()}


@workflow(name="testapp.keyed_slow")
def keyed_slow(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """One slow step; started with a concurrency key (tests/test_limits_workers.py)."""
    return ctx.do("slow", "testapp.slow", input)


@workflow(name="testapp.slow_twice")
def slow_twice(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """Two slow steps on the run's queue, each signalling its start (a file)."""
    first = dict(input, started=input["started"] + ".1")
    ctx.do("first", "testapp.slow", first)
    return ctx.do("second", "testapp.slow", dict(input, started=input["started"] + ".2"))


from tests.testapp import parallel_workflows  # noqa: E402, F401  (registers the fan-out)
