"""A step's success written with the pass after it, on SQLite, PostgreSQL and MariaDB.

The writes themselves against every store (the generic one in a transaction, and each
vendor's own: one statement on PostgreSQL): the next step stored claimed or the run
ended with the success, nothing written for a superseded attempt, the pass owed when
the claim is not made. Then workers: a pass that is written with its step is not made
again, and one that would write something else leaves the success to be recorded
alone; what the pass saw of a result is what a read of it returns.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from pikku_django.dbclock import store_now_ms
from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows._values import NewStep, StepDone, StepOptions
from pikku_django.workflows.clock import Clock
from pikku_django.workflows.passes._after_step import PassAfterStep, settle_then_claim
from pikku_django.workflows.passes._replay import NewClaim, Replay
from pikku_django.workflows.runs._django_signals import RunEvents
from pikku_django.workflows.runs._state import RunStates
from pikku_django.workflows.store import MysqlStore, OrmStore, SqliteStore, WorkflowStore
from pikku_django.workflows.worker import _carrying as carrying
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, db_mark, on_databases

VENDORS = ("sqlite", "postgres", "mariadb")


def _vendor_store(vendor: str) -> type[WorkflowStore]:
    if vendor == "postgres":
        from pikku_django.workflows.store.postgresql import PostgresStore

        return PostgresStore
    return SqliteStore if vendor == "sqlite" else MysqlStore


@pytest.fixture(
    params=[
        pytest.param((vendor, kind), marks=db_mark(vendor), id=f"{vendor}-{kind}")
        for vendor in VENDORS
        for kind in ("orm", "vendor")
    ]
)
def store(request: pytest.FixtureRequest) -> WorkflowStore:
    vendor, kind = request.param
    alias = database_alias(vendor)
    return (OrmStore if kind == "orm" else _vendor_store(vendor))(alias)


def _run(store: WorkflowStore, **fields: Any) -> WorkflowRun:
    fields.setdefault("workflow", "wf")
    fields.setdefault("wakes", 3)
    return WorkflowRun.objects.using(store.using).create(**fields)


def _claimed_step(store: WorkflowStore, run: WorkflowRun, attempt: int = 1) -> WorkflowStep:
    """A queued step its worker holds: attempt ``attempt`` running under a live lease."""
    step = WorkflowStep.objects.using(store.using).create(
        run=run,
        name="s0",
        kind="queued",
        function="fn",
        status=StepStatus.RUNNING,
        attempt=attempt,
        lease_expires_at=store_now_ms(store.using) + 60_000,
    )
    StepAttempt.objects.using(store.using).create(
        step=step, attempt=attempt, status=StepStatus.RUNNING, worker="w"
    )
    return step


def _claim(run: WorkflowRun, name: str = "s1") -> NewClaim:
    options = StepOptions("queued", "fn", None, 2, 0.5, "fixed", "default", False)
    new = NewStep(run.id, name, "queued", "fn", {"n": 1}, 2, 0.5, "fixed", "default", False)
    return NewClaim(new, options, lease_ms=60_000, worker="host:1:2", claimed_at=0.0)


def _states(store: WorkflowStore) -> RunStates:
    return RunStates(store, Clock(), RunEvents(None, store.using))


PASS_DUE = timedelta(hours=1)


def _chain(store: WorkflowStore, run: WorkflowRun, done: StepDone, name: str = "s1") -> Any:
    return settle_then_claim(
        store,
        done,
        _claim(run, name),
        park_wakes=3,
        pass_wake_at=timezone.now() + PASS_DUE,
    )


def _due_in(run: WorkflowRun) -> float | None:
    run.refresh_from_db()
    return None if run.wake_at is None else (run.wake_at - timezone.now()).total_seconds()


def test_the_success_and_the_next_step_claimed_in_one_write(store: WorkflowStore) -> None:
    run = _run(store)
    s0 = _claimed_step(store, run)
    result = store.json_as_stored({"bb": 1, "a": [1, 2]})
    chained = _chain(store, run, StepDone(s0.id, 1, result))
    assert chained is not None
    assert chained.same
    assert chained.claimed is not None
    assert chained.result == result
    assert list(chained.result) == list(result)
    s0.refresh_from_db()
    assert (s0.status, s0.result, s0.lease_expires_at) == (StepStatus.SUCCEEDED, result, None)
    first = StepAttempt.objects.using(store.using).get(step=s0, attempt=1)
    assert first.status == StepStatus.SUCCEEDED
    assert first.finished_at is not None
    s1 = WorkflowStep.objects.using(store.using).get(run=run, name="s1")
    assert (s1.id, s1.input, s1.claim_token) == chained.claimed
    assert (s1.status, s1.attempt) == (StepStatus.RUNNING, 1)
    assert s1.lease_expires_at is not None
    attempt = StepAttempt.objects.using(store.using).get(step=s1, attempt=1)
    assert (attempt.status, attempt.worker) == (StepStatus.RUNNING, "host:1:2")
    assert _due_in(run) is None  # parked while its claimed step runs


def test_a_superseded_attempt_writes_nothing(store: WorkflowStore) -> None:
    run = _run(store)
    s0 = _claimed_step(store, run, attempt=2)
    assert _chain(store, run, StepDone(s0.id, 1, {"n": 1})) is None
    s0.refresh_from_db()
    assert (s0.status, s0.attempt, s0.result) == (StepStatus.RUNNING, 2, None)
    assert not WorkflowStep.objects.using(store.using).filter(run=run, name="s1").exists()
    assert _due_in(run) is None


def test_a_stopped_run_keeps_the_success_and_claims_nothing(store: WorkflowStore) -> None:
    run = _run(store, status=RunStatus.CANCELLED)
    s0 = _claimed_step(store, run)
    chained = _chain(store, run, StepDone(s0.id, 1, 7))
    assert chained is not None
    assert chained.claimed is None
    assert chained.run_status == RunStatus.CANCELLED
    s0.refresh_from_db()
    assert (s0.status, s0.result) == (StepStatus.SUCCEEDED, 7)
    assert not WorkflowStep.objects.using(store.using).filter(run=run, name="s1").exists()
    assert _due_in(run) is None


def test_a_step_stored_meanwhile_leaves_the_pass_owed(store: WorkflowStore) -> None:
    run = _run(store)
    s0 = _claimed_step(store, run)
    WorkflowStep.objects.using(store.using).create(run=run, name="s1", kind="queued", function="fn")
    chained = _chain(store, run, StepDone(s0.id, 1, 7))
    assert chained is not None
    assert chained.same
    assert chained.claimed is None
    s0.refresh_from_db()
    assert s0.status == StepStatus.SUCCEEDED
    due = _due_in(run)
    assert due is not None
    assert abs(due - PASS_DUE.total_seconds()) < 60


def test_a_run_woken_meanwhile_stays_due(store: WorkflowStore) -> None:
    woken_at = timezone.now() - timedelta(seconds=1)
    run = _run(store, wakes=4, wake_at=woken_at)
    s0 = _claimed_step(store, run)
    chained = _chain(store, run, StepDone(s0.id, 1, 7))
    assert chained is not None
    assert chained.claimed is not None
    run.refresh_from_db()
    assert (run.wakes, run.wake_at) == (4, woken_at)


def test_a_result_read_back_otherwise_is_not_claimed_past(store: WorkflowStore) -> None:
    """1e16 reads back from ``jsonb`` as an integer: a pass that saw a float is not
    written, and the run is due for a pass that reads it."""
    run = _run(store)
    s0 = _claimed_step(store, run)
    chained = _chain(store, run, StepDone(s0.id, 1, 1e16))
    assert chained is not None
    s0.refresh_from_db()
    assert s0.status == StepStatus.SUCCEEDED
    if not store.chains_in_one_statement:
        # The generic store hands the value back as given (SQLite and MariaDB keep
        # the text; the generic store on PostgreSQL does not look).
        assert chained.same
        assert chained.claimed is not None
        return
    assert (chained.same, chained.claimed, chained.result) == (False, None, 10**16)
    assert type(chained.result) is int
    assert not WorkflowStep.objects.using(store.using).filter(run=run, name="s1").exists()
    due = _due_in(run)
    assert due is not None
    assert abs(due - PASS_DUE.total_seconds()) < 60


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED])
def test_the_success_and_the_run_end_in_one_write(store: WorkflowStore, status: str) -> None:
    run = _run(store, wake_at=None)
    s0 = _claimed_step(store, run)
    output, error = ({"done": True}, None) if status == RunStatus.COMPLETED else (None, {"m": 1})
    chained = _states(store).finish_after(
        StepDone(s0.id, 1, [1]),
        run,
        status,
        output=output,
        error=error,
        pass_wake_at=timezone.now() + PASS_DUE,
    )
    assert chained is not None
    assert chained.finished is True
    s0.refresh_from_db()
    assert (s0.status, s0.result) == (StepStatus.SUCCEEDED, [1])
    run.refresh_from_db()
    assert (run.status, run.output, run.error, run.wake_at) == (status, output, error, None)


def test_a_superseded_attempt_does_not_end_its_run(store: WorkflowStore) -> None:
    run = _run(store)
    s0 = _claimed_step(store, run, attempt=2)
    done = StepDone(s0.id, 1, 1)
    pass_at = timezone.now() + PASS_DUE
    states = _states(store)
    assert states.finish_after(done, run, RunStatus.COMPLETED, pass_wake_at=pass_at) is None
    run.refresh_from_db()
    s0.refresh_from_db()
    assert (run.status, s0.status) == (RunStatus.RUNNING, StepStatus.RUNNING)


def test_a_run_a_parent_step_waits_on_ends_and_settles_the_parent(store: WorkflowStore) -> None:
    parent = _run(store, workflow="parent", wake_at=None)
    run = _run(store, wake_at=None)
    waiting = WorkflowStep.objects.using(store.using).create(
        run=parent, name="child", kind="child", function="wf", status="running", child_run=run
    )
    s0 = _claimed_step(store, run)
    chained = _states(store).finish_after(
        StepDone(s0.id, 1, 5),
        run,
        RunStatus.COMPLETED,
        output=5,
        pass_wake_at=timezone.now() + PASS_DUE,
    )
    assert chained is not None
    assert chained.finished is True
    run.refresh_from_db()
    waiting.refresh_from_db()
    parent.refresh_from_db()
    assert (run.status, run.output) == (RunStatus.COMPLETED, 5)
    assert (waiting.status, waiting.result) == (StepStatus.SUCCEEDED, 5)
    assert parent.wake_at is not None  # woken for the pass that goes on from it


# -- workers ---------------------------------------------------------------------------


@step(name="chained_echo")
def echo(data: Any) -> Any:
    return data


def _note(value: Any) -> Any:
    return value


@workflow(name="chained_one")
def one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("only", echo, inp)


@workflow(name="chained_three")
def three(ctx: WorkflowContext, inp: Any) -> Any:
    return [ctx.do(f"s{i}", echo, i) for i in range(3)]


@workflow(name="chained_then_inline")
def then_inline(ctx: WorkflowContext, inp: Any) -> Any:
    first = ctx.do("first", echo, 1)
    return [first, ctx.do("noted", _note, 2)]


@workflow(name="chained_raises")
def raises(ctx: WorkflowContext, inp: Any) -> Any:
    ctx.do("first", echo, 1)
    raise ValueError("after the step")


@step(name="chained_parse")
def parse(text: str) -> Any:
    """The value ``text`` spells, as this process makes it (not as a database read it)."""
    return json.loads(text)


@workflow(name="chained_keys")
def keys(ctx: WorkflowContext, inp: Any) -> Any:
    """The next step's name comes from the result's key order and its type, as a body
    may: a replay from the database must reach the same names."""
    result = ctx.do("first", parse, inp)
    name = "-".join(result) if isinstance(result, dict) else type(result).__name__
    return [result, ctx.do(f"then-{name}", echo, name)]


def _drain(
    alias: str, monkeypatch: pytest.MonkeyPatch, *starts: tuple[Any, Any]
) -> tuple[list[WorkflowRun], dict[str, int]]:
    """Start runs and work them off: the runs, and the passes made on their own and
    written with a step."""
    made = {"own": 0, "with_step": 0}
    for owner, name, key in ((Replay, "orchestrate", "own"), (PassAfterStep, "run", "with_step")):
        real = getattr(owner, name)

        def counted(self: Any, *args: Any, real: Any = real, key: str = key) -> Any:
            out = real(self, *args)
            if key == "own" or (out is not None and not out.replay):
                made[key] += 1
            return out

        monkeypatch.setattr(owner, name, counted)
    # Each run carried to its end by one thread, however slow the machine.
    monkeypatch.setattr(carrying, "CHAIN_SECONDS", 60.0)
    engine = WorkflowEngine(alias)
    runs = [engine.start(wf, inp) for wf, inp in starts]
    Worker(engine, concurrency=2, until_idle=True, poll_interval=0.05, idle_grace=0).run()
    return [engine.get_run(r.id) for r in runs], made


@on_databases(*VENDORS)
def test_a_run_of_one_step_is_passed_once(vendor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    alias = database_alias(vendor)
    runs, made = _drain(alias, monkeypatch, *[(one, {"n": n}) for n in range(5)])
    assert [(r.status, r.output) for r in runs] == [
        (RunStatus.COMPLETED, {"n": n}) for n in range(5)
    ]
    assert made == {"own": 5, "with_step": 5}


@on_databases(*VENDORS)
def test_a_chain_of_steps_is_passed_once_and_written_with_each_step(
    vendor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    (run,), made = _drain(alias, monkeypatch, (three, None))
    assert (run.status, run.output) == (RunStatus.COMPLETED, [0, 1, 2])
    assert made == {"own": 1, "with_step": 3}
    steps = WorkflowStep.objects.using(alias).filter(run_id=run.id)
    assert sorted(steps.values_list("name", "attempt")) == [("s0", 1), ("s1", 1), ("s2", 1)]


@on_databases(*VENDORS)
def test_a_pass_that_writes_something_else_is_made_on_its_own(
    vendor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    runs, made = _drain(alias, monkeypatch, (then_inline, None), (then_inline, None))
    assert [(r.status, r.output) for r in runs] == [(RunStatus.COMPLETED, [1, 2])] * 2
    assert made == {"own": 4, "with_step": 0}


@on_databases(*VENDORS)
def test_a_body_that_raises_after_its_step_fails_with_the_step_recorded(
    vendor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    (run,), made = _drain(alias, monkeypatch, (raises, None))
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "ValueError"
    first = WorkflowStep.objects.using(alias).get(run_id=run.id, name="first")
    assert (first.status, first.result, first.attempt) == (StepStatus.SUCCEEDED, 1, 1)
    assert made == {"own": 1, "with_step": 1}


@pytest.mark.parametrize(
    "result", ['{"bb": 1, "a": 2, "ccc": 3}', "1e16", "0.5"], ids=["keys", "big-float", "float"]
)
@on_databases(*VENDORS)
def test_the_pass_after_a_step_sees_its_result_as_a_read_returns_it(
    vendor: str, result: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    (run,), made = _drain(alias, monkeypatch, (keys, result))
    assert run.status == RunStatus.COMPLETED, run.error
    stored = WorkflowStep.objects.using(alias).get(run_id=run.id, name="first").result
    name = "-".join(stored) if isinstance(stored, dict) else type(stored).__name__
    names = set(
        WorkflowStep.objects.using(alias).filter(run_id=run.id).values_list("name", flat=True)
    )
    assert names == {"first", f"then-{name}"}
    assert run.output == [stored, name]
    # Both passes after a step are written with it, but where the pass saw the result
    # otherwise than it reads back (1e16 from jsonb): that one is made again.
    reread = vendor == "postgres" and result == "1e16"
    assert made == {"own": 2 if reread else 1, "with_step": 1 if reread else 2}
