"""A pass of a long run reads only the steps that can have changed, not all of the
run's steps: the rows and queries per pass of a 200-step run do not grow with the
step it reaches, with runs carried from pass to pass and with carrying off, on
SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from statistics import median
from typing import Any

import pytest
from django.db import connections
from django.db.models.signals import post_init
from django.test import override_settings

from pikku_django.models import RunStatus, WorkflowStep
from pikku_django.workflows import WorkflowEngine, step, workflow
from pikku_django.workflows.passes._after_step import PassAfterStep
from pikku_django.workflows.passes._replay import Replay
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases

STEPS = 200


@step(name="replay_cost_add")
def add(data: dict[str, int]) -> int:
    return data["n"] + 1


@workflow(name="replay_cost_long")
def long_run(ctx: WorkflowContext, inp: Any) -> int:
    total = 0
    for n in range(STEPS):
        total += ctx.do(f"s{n}", add, {"n": n})
    return total


class PassCost:
    """Rows of steps built and queries sent by each pass, in pass order."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, int]] = []
        self._local = threading.local()
        self._lock = threading.Lock()

    def _row(self, sender: Any, **kwargs: Any) -> None:
        if getattr(self._local, "counting", False):
            self._local.rows += 1

    def _query(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if getattr(self._local, "counting", False):
            self._local.queries += 1
        return execute(sql, params, many, context)

    @contextmanager
    def one_pass(self, alias: str) -> Iterator[None]:
        self._local.counting, self._local.rows, self._local.queries = True, 0, 0
        try:
            with connections[alias].execute_wrapper(self._query):
                yield
        finally:
            self._local.counting = False
            with self._lock:
                self.passes.append((self._local.rows, self._local.queries))


def _measure(alias: str, monkeypatch: pytest.MonkeyPatch) -> PassCost:
    cost = PassCost()
    # A pass is either a pass of its own, or one written with the step before it.
    for owner, name in ((Replay, "orchestrate"), (PassAfterStep, "run")):
        real = getattr(owner, name)

        def counted(self: Any, *args: Any, real: Any = real) -> Any:
            with cost.one_pass(alias):
                return real(self, *args)

        monkeypatch.setattr(owner, name, counted)
    post_init.connect(cost._row, sender=WorkflowStep, weak=False)
    try:
        engine = WorkflowEngine(alias)
        run = engine.start(long_run)
        Worker(engine, concurrency=1, until_idle=True, poll_interval=0.02, idle_grace=0).run()
        done = engine.get_run(run.id)
        assert (done.status, done.output) == (RunStatus.COMPLETED, sum(range(1, STEPS + 1)))
    finally:
        post_init.disconnect(cost._row, sender=WorkflowStep)
    return cost


@pytest.mark.parametrize("carry", [True, False], ids=["carried", "carrying_off"])
@on_databases("sqlite", "postgres", "mariadb")
def test_rows_and_queries_per_pass_do_not_grow_with_the_step(
    vendor: str, carry: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    with override_settings(PIKKU={"WORKFLOW_DATABASE": alias, "CARRY_RUNS": carry}):
        cost = _measure(alias, monkeypatch)
    passes = cost.passes
    assert len(passes) >= STEPS  # a pass per step, and the last one
    rows = [r for r, _ in passes]
    queries = [q for _, q in passes]
    # Reading every step would make the last passes read ~200 rows each.
    assert max(rows) <= 3, f"rows of steps read per pass: {rows}"
    early, late = queries[5:45], queries[-41:-1]
    assert median(late) <= median(early), f"queries per pass grew: {early} then {late}"
    # A pass that starts a new chain also reads its run and takes the run lease.
    assert max(queries) <= median(early) + 4, f"queries per pass: {queries}"
    assert sum(rows) <= 3 * len(passes)
