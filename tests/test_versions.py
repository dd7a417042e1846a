"""Workflow versions and ``ctx.patched`` in one process, on SQLite, PostgreSQL and
MariaDB: a deploy is a change of the registered function under the same name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepKind, WorkflowStep
from pikku_django.workflows import (
    EngineConfig,
    FakeClock,
    WorkflowContext,
    WorkflowEngine,
    registry,
    step,
    workflow,
)
from pikku_django.workflows.runs._version_ids import code_version
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")
NAME = "vs_order"


@step(name="vs_add")
def vs_add(data: Any) -> Any:
    return data["n"] + data.get("plus", 0)


def old_code(ctx: WorkflowContext, inp: Any) -> Any:
    n = ctx.do("a", vs_add, {"n": inp["n"]})
    ctx.wait_for_event("go")
    return {"path": "old", "n": ctx.do("b", vs_add, {"n": n})}


def new_code(ctx: WorkflowContext, inp: Any) -> Any:
    n = ctx.do("a", vs_add, {"n": inp["n"]})
    if ctx.patched("add-ten"):
        n = ctx.do("ten", vs_add, {"n": n, "plus": 10})
        ctx.wait_for_event("go")
        return {"path": "new", "n": ctx.do("b", vs_add, {"n": n})}
    ctx.wait_for_event("go")
    return {"path": "old", "n": ctx.do("b", vs_add, {"n": n})}


@step(name="vs_double")
def vs_double(data: Any) -> Any:
    return data["n"] * 2


def renamed_code(ctx: WorkflowContext, inp: Any) -> Any:
    # The step the run recorded as vs_add now calls vs_double, without ctx.patched.
    return {"n": ctx.do("a", vs_double, {"n": inp["n"]})}


workflow(name=NAME, version="1")(old_code)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


@pytest.fixture
def engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


@pytest.fixture
def deploy(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``deploy(fn, version=..., replays=...)``: the code registered as vs_order."""

    def put(fn: Callable[..., Any], version: str, replays: tuple[str, ...] = ()) -> None:
        current = registry.get_workflow(NAME)
        assert current is not None
        monkeypatch.setitem(
            registry._workflows,
            NAME,
            replace(current, fn=fn, version=version, replays=replays),
        )

    put(old_code, "1")
    return put


def _kinds(engine: WorkflowEngine, run_id: Any) -> list[tuple[str, str]]:
    steps = WorkflowStep.objects.using(engine.using).filter(run_id=run_id).order_by("id")
    return [(s.name, s.kind) for s in steps]


def test_patched_is_false_past_the_change_and_true_before_it(
    engine: WorkflowEngine, deploy: Callable[..., None]
) -> None:
    past = engine.start(NAME, {"n": 1})
    engine.run_until_idle()  # at the wait: past the change's point
    assert past.version == "1"

    deploy(new_code, "2", ("1",))
    fresh = engine.start(NAME, {"n": 1})
    assert fresh.version == "2"
    for run in (past, fresh):
        engine.events.send(run.id, "go")
    engine.run_until_idle()
    assert engine.get_run(past.id).output == {"path": "old", "n": 1}
    assert engine.get_run(fresh.id).output == {"path": "new", "n": 11}
    assert ("patch:add-ten", StepKind.PATCH) in _kinds(engine, fresh.id)
    assert all(kind != StepKind.PATCH for _, kind in _kinds(engine, past.id))

    # Replayed from scratch by a fresh engine (no memo): each takes its path again.
    for run in (past, fresh):
        before = engine.get_run(run.id).output
        engine.runs().filter(id=run.id).update(status=RunStatus.RUNNING, output=None)
        WorkflowEngine(engine.using, leases=InMemoryLeaseService()).orchestrate(run.id)
        assert engine.get_run(run.id).output == before


def test_old_code_leaves_a_patched_run_to_the_new_code(
    engine: WorkflowEngine, deploy: Callable[..., None]
) -> None:
    deploy(new_code, "2", ("1",))
    run = engine.start(NAME, {"n": 2})
    engine.run_until_idle()
    engine.events.send(run.id, "go")

    deploy(old_code, "1")  # a worker still on the old code passes it
    engine.orchestrate(run.id)
    left = engine.get_run(run.id)
    assert left.status == RunStatus.RUNNING, left.error
    assert left.wake_at is not None  # offered to the workers again

    # Nor does it end a run the new code took to its end.
    deploy(new_code, "2", ("1",))
    done = engine.start(NAME, {"n": 3})
    engine.events.send(done.id, "go")
    engine.run_until_idle()
    engine.runs().filter(id=done.id).update(status=RunStatus.RUNNING, output=None)
    deploy(old_code, "1")
    engine.orchestrate(done.id)
    assert engine.get_run(done.id).status == RunStatus.RUNNING

    deploy(new_code, "2", ("1",))
    engine.clock.advance(5)  # type: ignore[attr-defined]
    engine.run_until_idle()
    assert engine.get_run(run.id).output == {"path": "new", "n": 12}
    assert engine.get_run(done.id).output == {"path": "new", "n": 13}


def test_the_non_determinism_error_names_the_step_and_patched(
    engine: WorkflowEngine, deploy: Callable[..., None]
) -> None:
    run = engine.start(NAME, {"n": 1})
    engine.run_until_idle()
    deploy(renamed_code, "3")
    engine.events.send(run.id, "go")
    engine.run_until_idle()
    failed = engine.get_run(run.id)
    assert failed.error is not None
    assert failed.status == RunStatus.FAILED
    assert failed.error["type"].endswith("NonDeterministicWorkflowError")
    assert "Step 'a' was recorded as queued 'vs_add'" in failed.error["message"]
    assert "ctx.patched" in failed.error["message"]


def test_a_worker_limited_to_its_versions_leaves_other_runs(
    alias: str, deploy: Callable[..., None]
) -> None:
    clock = FakeClock()
    limited = WorkflowEngine(
        alias,
        leases=InMemoryLeaseService(),
        clock=clock,
        config=EngineConfig.from_settings(carried_versions_only=True, database=alias),
    )
    run = limited.start(NAME, {"n": 1})  # version 1
    deploy(old_code, "9")  # this process now carries version 9 only
    limited.run_until_idle()
    assert _kinds(limited, run.id) == []  # not passed here
    assert limited.get_run(run.id).status == RunStatus.RUNNING

    deploy(new_code, "10", ("1",))  # carries 10 and replays 1
    clock.advance(5)
    limited.run_until_idle()
    assert [name for name, _ in _kinds(limited, run.id)][:2] == ["a", "patch:add-ten"]


def test_a_run_made_by_an_intake_records_the_version_of_its_first_pass(
    engine: WorkflowEngine,
) -> None:
    made = engine.create_run(NAME, {"n": 1})
    assert made.version == ""
    engine.run_until_idle()
    assert engine.get_run(made.id).version == "1"


@workflow(name="vs_hashed")
def vs_hashed(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.patched("bad#id")


def test_versions_default_to_a_hash_of_the_code_and_are_checked(
    engine: WorkflowEngine,
) -> None:
    hashed = registry.get_workflow("vs_hashed")
    assert hashed is not None
    assert hashed.version == code_version(vs_hashed)
    assert hashed.version.startswith("code-")
    assert code_version(old_code) != code_version(new_code)
    assert engine.start("vs_hashed").version == hashed.version
    engine.run_until_idle()
    [run] = engine.runs().filter(workflow="vs_hashed")
    assert run.status == RunStatus.FAILED
    assert "change id" in run.error["message"]
    with pytest.raises(ImproperlyConfigured):
        workflow(name="vs_bad", version="")
    with pytest.raises(ImproperlyConfigured):
        workflow(name="vs_bad", version="1", replays=("x" * 65,))
