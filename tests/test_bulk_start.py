"""Bulk starts (``start_workflows``): many runs of one workflow written a batch per
statement in one transaction, each batch announced once, on SQLite, PostgreSQL and
MariaDB; each run as a single start would have made it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.db import connections, transaction
from django.test import override_settings

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import (
    BulkStartOptions,
    FakeClock,
    NotSerializableError,
    WorkflowContext,
    WorkflowEngine,
    WorkflowNotFoundError,
    astart_workflows,
    start_workflows,
    step,
    workflow,
)
from pikku_django.workflows.api import reset_engine
from pikku_django.workflows.control._admission import admit
from pikku_django.workflows.registry import (
    OpeningStep,
    WorkflowDefinition,
    register_workflow_prefix,
)
from pikku_django.workflows.runs import _bulk_start
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")

#: The PostgreSQL channel new work is announced on.
CHANNEL = "pikku_work"


@step(name="bulk.echo")
def bulk_echo(value: Any) -> Any:
    return value


@workflow(name="bulk.one")
def bulk_one(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("echo", bulk_echo, inp)


@workflow(name="bulk.keyed", concurrency_key=lambda inp: f"acct:{inp['acct']}")
def bulk_keyed(ctx: WorkflowContext, inp: Any) -> Any:
    return ctx.do("echo", bulk_echo, inp)


def _opening(run_id: uuid.UUID, inp: Any) -> OpeningStep:
    return OpeningStep("open", "bulk.echo", {"run": str(run_id), "n": inp})


def _opened(ctx: WorkflowContext, inp: Any) -> Any:
    opening = _opening(ctx.run_id, inp)
    return ctx.do(opening.name, opening.function, opening.data, **opening.options)


register_workflow_prefix(
    "bulkopen.", lambda name: WorkflowDefinition(name, _opened, opening=_opening)
)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    alias = database_alias(request.param)
    with override_settings(PIKKU={"WORKFLOW_DATABASE": alias}):
        reset_engine()
        yield alias
    reset_engine()


@pytest.fixture
def engine(alias: str) -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(_bulk_start, "BATCH", 10)
    return 10


def test_every_run_started_together_completes_under_a_worker(
    engine: WorkflowEngine, small_batches: int
) -> None:
    runs = engine.start_many(bulk_one, [{"n": n} for n in range(15)])
    assert [run.input for run in runs] == [{"n": n} for n in range(15)]
    assert len({run.id for run in runs}) == 15
    assert engine.runs().count() == 15
    engine.run_until_idle()
    done = {run.id: run for run in engine.runs()}
    assert {run.status for run in done.values()} == {RunStatus.COMPLETED}
    assert [done[run.id].output for run in runs] == [{"n": n} for n in range(15)]


def test_a_run_started_together_is_the_row_a_single_start_makes(engine: WorkflowEngine) -> None:
    alone = engine.start(bulk_one, {"n": 1}, priority=3, queue="mail")
    (together,) = engine.start_many(bulk_one, [{"n": 1}], priority=3, queue="mail")
    alone.refresh_from_db()
    together.refresh_from_db()
    same = ("workflow", "input", "status", "priority", "queue", "first_step", "version")
    assert {f: getattr(together, f) for f in same} == {f: getattr(alone, f) for f in same}
    assert together.wake_at is not None


def test_each_runs_opening_step_is_stored_with_it(engine: WorkflowEngine) -> None:
    runs = engine.start_many("bulkopen.x", [1, 2, 3])
    steps = {s.run_id: s for s in engine.steps().filter(run_id__in=[r.id for r in runs])}
    assert set(steps) == {r.id for r in runs}
    for run in runs:
        first = steps[run.id]
        assert (first.name, first.status) == ("open", StepStatus.SCHEDULED)
        assert first.input == {"run": str(run.id), "n": run.input}
        run.refresh_from_db()
        assert run.wake_at is None  # its step is claimed from the queue
    engine.run_until_idle()
    outputs = sorted(r.output["n"] for r in engine.runs().filter(id__in=[r.id for r in runs]))
    assert outputs == [1, 2, 3]


def test_a_taken_key_returns_its_run_and_a_repeated_key_shares_one(
    engine: WorkflowEngine, small_batches: int
) -> None:
    existing = engine.start(bulk_one, "old", idempotency_key="a")
    keys = ["a", "b", "b", None, *[f"k{n}" for n in range(20)], "b"]
    runs = engine.start_many(bulk_one, list(range(len(keys))), idempotency_keys=keys)
    assert runs[0].id == existing.id
    assert runs[0].input == "old"
    assert runs[1].id == runs[2].id == runs[-1].id
    assert runs[1].input == 1  # the first input of a repeated key
    assert len({r.id for r in runs}) == 23  # a, b, the keyless one and k0 to k19
    assert engine.runs().count() == 23
    again = engine.start_many(bulk_one, ["x"] * len(keys), idempotency_keys=keys)
    assert [r.id for r in again[:3]] == [r.id for r in runs[:3]]
    assert engine.runs().count() == 24  # only the keyless one is new


def test_a_rolled_back_block_leaves_nothing(engine: WorkflowEngine, small_batches: int) -> None:
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic(using=engine.using):
        runs = engine.start_many("bulkopen.x", list(range(25)), idempotency_keys=None)
        assert engine.runs().count() == 25
        raise Abort
    assert not engine.runs().exists()
    assert not engine.steps().exists()
    assert len(runs) == 25
    assert engine.claim_due_runs(100) == []
    assert engine.run_until_idle() == 0


def test_priority_queue_and_delay_apply_to_every_run(engine: WorkflowEngine) -> None:
    runs = engine.start_many(bulk_one, [1, 2, 3], priority=9, queue="mail", delay="5min")
    now = engine.clock.now()
    for run in engine.runs():
        assert (run.priority, run.queue) == (9, "mail")
        assert run.start_at == now + timedelta(minutes=5)
    engine.clock.advance(timedelta(minutes=5) - timedelta(milliseconds=1))
    assert engine.claim_due_runs(10) == []
    engine.clock.advance(timedelta(milliseconds=1))
    assert set(engine.claim_due_runs(10)) == {r.id for r in runs}


def test_higher_priority_runs_are_claimed_first(engine: WorkflowEngine) -> None:
    low = engine.start_many(bulk_one, [1, 2], priority=-5)
    high = engine.start_many(bulk_one, [3, 4], priority=5)
    assert set(engine.claim_due_runs(2)) == {r.id for r in high}
    assert set(engine.claim_due_runs(2)) == {r.id for r in low}


def test_keyed_runs_wait_and_the_keys_limit_holds(engine: WorkflowEngine) -> None:
    runs = engine.start_many(bulk_keyed, [{"acct": 1, "n": n} for n in range(4)])
    other = engine.start_many(bulk_one, [0, 1, 2], concurrency_key="k", concurrency_limit=2)
    for run in engine.runs():
        assert run.key_waiting
        assert run.wake_at is None
    assert {r.concurrency_key for r in runs} == {"acct:1"}
    assert admit(engine.store, 100, engine.clock.now()) == 3  # one of acct:1, two of k
    engine.run_until_idle()
    assert set(engine.runs().values_list("status", flat=True)) == {RunStatus.COMPLETED}
    order = WorkflowStep.objects.using(engine.using).filter(run__concurrency_key="acct:1")
    assert list(order.order_by("id").values_list("run_id", flat=True)) == [r.id for r in runs]
    assert len(other) == 3


def test_each_batch_is_announced_once(
    engine: WorkflowEngine, small_batches: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connections[engine.using].vendor == "postgresql":
        # PostgreSQL delivers a transaction's identical notifications once, at commit:
        # count the statements that send one, and what a listener gets.
        sent: list[str] = []

        def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            if "pg_notify" in sql:
                sent.append(sql)
            return execute(sql, params, many, context)

        def start() -> None:
            with connections[engine.using].execute_wrapper(count):
                engine.start_many(bulk_one, list(range(25)))

        assert _listened(engine, start) == 1
        told = len(sent)
    else:
        calls: list[None] = []
        monkeypatch.setattr(engine.store, "notify", lambda: calls.append(None))
        engine.start_many(bulk_one, list(range(25)))
        told = len(calls)
    assert told == 3  # 10 + 10 + 5


@db_mark("postgres")
def test_a_rolled_back_block_announces_nothing() -> None:
    using = database_alias("postgres")
    engine = WorkflowEngine(using, leases=InMemoryLeaseService(), clock=FakeClock())

    def start() -> None:
        engine.start_many(bulk_one, [1, 2])
        transaction.set_rollback(True, using=using)

    assert _listened(engine, start) == 0
    assert not engine.runs().exists()


def _listened(engine: WorkflowEngine, start: Any) -> int:
    """How many announcements of new work a listener gets for ``start``, run in an
    atomic block that then ends."""
    settings = connections[engine.using].settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        password=settings["PASSWORD"],
        dbname=settings["NAME"],
        autocommit=True,
    ) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with transaction.atomic(using=engine.using):
            start()
        return len(list(listener.notifies(timeout=1.0)))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda e: e.start_many("bulk.nope", [1]), WorkflowNotFoundError, "bulk.nope"),
        (lambda e: e.start_many(bulk_one, [1, {2}]), NotSerializableError, "index 1"),
        (
            lambda e: e.start_many(bulk_one, [1, 2], idempotency_keys=["a"]),
            ValueError,
            "1 keys for 2 inputs",
        ),
        (lambda e: e.start_many(bulk_one, [1], idempotency_keys=[""]), ValueError, "1 to 255"),
        (lambda e: e.start_many(bulk_one, [1], idempotency_key="a"), TypeError, "idempotency_keys"),
        (lambda e: e.start_many(bulk_one, [1], inline=True), TypeError, "'inline'"),
        (lambda e: e.start_many(bulk_one, "abc"), TypeError, "not a str"),
        (lambda e: e.start_many(bulk_one, [1, 2], priority=500), ValueError, "priority"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    engine: WorkflowEngine, call: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call(engine)
    assert not engine.runs().exists()


def test_the_public_and_async_forms_start_in_the_projects_database(alias: str) -> None:
    runs = start_workflows(bulk_one, [1, 2], idempotency_keys=["p", "q"], priority=2)
    more = async_to_sync(astart_workflows)(bulk_one, [3, 4], idempotency_keys=["q", "r"])
    assert more[0].id == runs[1].id
    stored = WorkflowRun.objects.using(alias).order_by("idempotency_key")
    assert [(r.idempotency_key, r.priority) for r in stored] == [("p", 2), ("q", 2), ("r", 0)]
    assert all(run._state.db == alias for run in [*runs, *more])


def test_the_options_are_the_ones_start_workflows_documents() -> None:
    doc = start_workflows.__doc__ or ""
    for key in BulkStartOptions.__annotations__:
        assert f"``{key}``" in doc, key
