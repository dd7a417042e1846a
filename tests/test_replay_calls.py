"""Replaying a step that succeeded on an earlier pass costs a few calls of pikku_django
code, however many steps the run has: counted per pass (Python calls into the
package, and built-in calls made from it) over a long run's passes, with runs
carried from pass to pass and with carrying off, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from django.test import override_settings

import pikku_django
from pikku_django.models import RunStatus
from pikku_django.workflows import WorkflowEngine, step, workflow
from pikku_django.workflows.passes._after_step import PassAfterStep
from pikku_django.workflows.passes._replay import Replay
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases

STEPS = 120
PACKAGE = str(Path(pikku_django.__file__).resolve().parent)

#: Calls a replayed ``ctx.do`` may cost: the call, its naming, the look-up and the
#: copy of its result (about 11 with this dict result; some 66 when each pass
#: resolved the step's options, deep-copied its result and copied the memo).
PER_REPLAYED_STEP = 12


@step(name="replay_calls_echo")
def echo(data: dict[str, Any]) -> dict[str, Any]:
    return data


@workflow(name="replay_calls_long")
def long_run(ctx: WorkflowContext, inp: Any) -> int:
    total = 0
    for n in range(STEPS):
        total += ctx.do(f"s{n}", echo, {"n": n, "tags": ["a", "b"]})["n"]
    return total


class CallCount:
    """Calls per pass, in pass order: Python calls of package code, and built-in
    calls made from package code (a loop over every step shows as either)."""

    def __init__(self) -> None:
        self.passes: list[int] = []
        self._lock = threading.Lock()

    def count(self, fn: Any, *args: Any) -> Any:
        calls = 0

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            nonlocal calls
            if event in ("call", "c_call"):
                calls += 1

        sys.setprofile(profile)
        try:
            return fn(*args)
        finally:
            sys.setprofile(None)
            with self._lock:
                self.passes.append(calls)


@pytest.mark.parametrize("carry", [True, False], ids=["carried", "carrying_off"])
@on_databases("sqlite", "postgres", "mariadb")
def test_a_replayed_step_costs_a_few_calls_however_long_the_run(
    vendor: str, carry: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    counter = CallCount()
    # A pass is either a pass of its own, or one written with the step before it.
    for owner, name in ((Replay, "orchestrate"), (PassAfterStep, "run")):
        real = getattr(owner, name)

        def counted(self: Any, *args: Any, real: Any = real) -> Any:
            return counter.count(real, self, *args)

        monkeypatch.setattr(owner, name, counted)
    with override_settings(PIKKU={"WORKFLOW_DATABASE": alias, "CARRY_RUNS": carry}):
        engine = WorkflowEngine(alias)
        run = engine.start(long_run)
        Worker(engine, concurrency=1, until_idle=True, poll_interval=0.02, idle_grace=0).run()
        done = engine.get_run(run.id)
    assert (done.status, done.output) == (RunStatus.COMPLETED, sum(range(STEPS)))
    passes = counter.passes
    assert len(passes) >= STEPS  # a pass per step, and the last one
    # Pass k replays the k steps before it. The median of ten neighbouring passes
    # evens out the passes that start a chain (a run read, a lease taken).
    early = sorted(passes[20:30])[5]
    late = sorted(passes[-30:-20])[5]
    replayed_more = len(passes) - 50
    per_step = (late - early) / replayed_more
    assert per_step <= PER_REPLAYED_STEP, (
        f"{per_step:.1f} calls per replayed step (passes from {early} to {late} calls)"
    )
    assert per_step > 0  # the count sees the replay at all
