"""Real PostgreSQL and MariaDB errors, raised by the server, are classified as passing
(try again) or not (give up), and the engine's paths act on that: a settle is made
again without spending an attempt, a pass is tried again with backoff, and a pass
that every try would fail fails its run after PASS_ERROR_TRIES."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import (
    DatabaseError,
    DataError,
    IntegrityError,
    OperationalError,
    ProgrammingError,
    connections,
    transaction,
)

from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import AttemptStatus, Lease, RunStatus, StepStatus
from pikku_django.workflows import FakeClock, WorkflowContext, WorkflowEngine, step, workflow
from pikku_django.workflows._dberrors import is_transient
from tests.conftest import database_alias, db_mark, on_databases

SERVERS = ("postgres", "mariadb")


def _pg_raise(sqlstate: str) -> str:
    return (
        f"DO $$ BEGIN RAISE EXCEPTION 'raised as {sqlstate}' USING ERRCODE = '{sqlstate}'; END $$"
    )


def _maria_signal(sqlstate: str, errno: int) -> str:
    return f"SIGNAL SQLSTATE '{sqlstate}' SET MYSQL_ERRNO = {errno}, MESSAGE_TEXT = 'raised'"


#: Statements that make the server raise an error of a kind, by vendor: the SQL, the
#: Django error class it arrives as, the server's code, and whether it passes by itself.
RAISED: dict[str, dict[str, tuple[str, type[DatabaseError], object, bool]]] = {
    "postgres": {
        "deadlock": (_pg_raise("40P01"), OperationalError, "40P01", True),
        "serialization": (_pg_raise("40001"), OperationalError, "40001", True),
        "lock-wait": (_pg_raise("55P03"), OperationalError, "55P03", True),
        "cancelled": (_pg_raise("57014"), OperationalError, "57014", True),
        "data": ("SELECT 'not a number'::integer", DataError, "22P02", False),
        "nul-json": ("SELECT '\"a\\u0000b\"'::jsonb", DataError, "22P05", False),
        "programming": ("SELECT * FROM pikku_no_such_table", ProgrammingError, "42P01", False),
        # A limit every try hits again (54023: more than 100 arguments).
        "program-limit": (
            "SELECT concat(" + ", ".join(["1"] * 101) + ")",
            OperationalError,
            "54023",
            False,
        ),
    },
    "mariadb": {
        "deadlock": (_maria_signal("40001", 1213), OperationalError, 1213, True),
        "lock-wait": (_maria_signal("HY000", 1205), OperationalError, 1205, True),
        "serialization": (_maria_signal("HY000", 1020), OperationalError, 1020, True),
        "table-changed": (_maria_signal("HY000", 1412), OperationalError, 1412, True),
        # A real statement timeout (1969), as PostgreSQL's statement_timeout (57014).
        "cancelled": (
            "SET STATEMENT max_statement_time = 0.01 FOR SELECT COUNT(*) "
            "FROM information_schema.collations a, information_schema.collations b, "
            "information_schema.collations c",
            OperationalError,
            1969,
            True,
        ),
        "data": (
            "INSERT INTO pikku_lease (`key`, holder, token, expires_at) "
            "VALUES (REPEAT('k', 300), 'h', 1, 0)",
            DataError,
            1406,
            False,
        ),
        "programming": ("SELECT * FROM pikku_no_such_table", ProgrammingError, 1146, False),
        # Not JSON in a JSON column: its CHECK (JSON_VALID) constraint refuses it.
        "constraint": (
            "INSERT INTO pikku_worker_heartbeat (worker_id, hostname, version, queues, "
            "concurrency, running, started_at, seen_at) "
            "VALUES ('w', '', '', 'not json', 1, 0, NOW(), NOW())",
            IntegrityError,
            4025,
            False,
        ),
    },
}


def _kinds(passing: bool | None = None) -> list[Any]:
    """(vendor, kind) params of RAISED, those that pass or not (None: all)."""
    return [
        pytest.param(vendor, kind, marks=db_mark(vendor), id=f"{vendor}-{kind}")
        for vendor, kinds in RAISED.items()
        for kind, (*_, passes) in kinds.items()
        if passing is None or passes is passing
    ]


def _code(exc: DatabaseError) -> object:
    """The vendor's code of a Django database error: its SQLSTATE or MariaDB errno."""
    cause = exc.__cause__ or exc  # Django raises MariaDB's CHECK failure itself
    return getattr(cause, "sqlstate", None) or cause.args[0]


def _raised(alias: str, sql: str) -> DatabaseError:
    """The error the server raised for ``sql`` on ``alias``'s connection."""
    with pytest.raises(DatabaseError) as caught, connections[alias].cursor() as cursor:
        cursor.execute(sql)
    return caught.value


@pytest.mark.parametrize(("vendor", "kind"), _kinds())
def test_a_server_error_is_classified_by_its_code(vendor: str, kind: str) -> None:
    alias = database_alias(vendor)
    sql, cls, code, passing = RAISED[vendor][kind]
    exc = _raised(alias, sql)
    assert (type(exc), _code(exc)) == (cls, code), exc
    assert is_transient(exc) is passing


@on_databases("postgres")
def test_a_prerequisite_error_every_try_hits_does_not_pass_on_postgresql(vendor: str) -> None:
    alias = database_alias(vendor)
    try:
        with connections[alias].cursor() as cursor:
            cursor.execute("CREATE TEMPORARY SEQUENCE pikku_unused_sequence")
        exc = _raised(alias, "SELECT currval('pikku_unused_sequence')")
    finally:
        connections[alias].close()  # and its temporary sequence
    assert (type(exc), _code(exc)) == (OperationalError, "55000")
    assert is_transient(exc) is False


# -- errors two connections really make ----------------------------------------------


def _other_connection(alias: str) -> Any:
    """A second driver connection to ``alias``'s test database, in a transaction."""
    wrapper = connections[alias]
    conn = wrapper.get_new_connection(wrapper.get_connection_params())
    if wrapper.vendor == "postgresql":
        conn.autocommit = False
    else:
        conn.autocommit(False)
    return conn


def _leases(alias: str, *keys: str) -> None:
    for key in keys:
        Lease.objects.using(alias).create(key=key, holder="h", token=1, expires_at=0)


def _lock_sql(alias: str) -> str:
    quote = connections[alias].ops.quote_name
    return f"UPDATE pikku_lease SET token = token + 1 WHERE {quote('key')} = %s"


@contextmanager
def _lock_timeout(alias: str) -> Iterator[None]:
    """Lock waits on ``alias``'s connection give up at once (PostgreSQL: after 100 ms),
    until the connection is closed at the end."""
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "postgresql":
            cursor.execute("SET lock_timeout = '100ms'")
        else:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 0")
    try:
        yield
    finally:
        connections[alias].close()


@on_databases(*SERVERS)
def test_a_real_deadlock_between_two_connections_passes(vendor: str) -> None:
    alias = database_alias(vendor)
    first, second = f"dl-{uuid.uuid4().hex}", f"dl-{uuid.uuid4().hex}"
    _leases(alias, first, second)
    both_locked = threading.Barrier(2, timeout=60)
    errors: list[BaseException] = []

    def lock(one: str, other: str) -> None:
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                if vendor == "postgres":
                    cursor.execute("SET LOCAL deadlock_timeout = '50ms'")
                cursor.execute(_lock_sql(alias), [one])
                both_locked.wait()
                cursor.execute(_lock_sql(alias), [other])
        except DatabaseError as exc:
            errors.append(exc)
        finally:
            connections[alias].close()

    threads = [
        threading.Thread(target=lock, args=(first, second)),
        threading.Thread(target=lock, args=(second, first)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert len(errors) == 1, errors  # the server chose one victim; the other committed
    [exc] = errors
    assert isinstance(exc, OperationalError)
    assert _code(exc) in ("40P01", 1213)
    assert is_transient(exc)
    tokens = sorted(
        Lease.objects.using(alias).filter(key__in=(first, second)).values_list("token", flat=True)
    )
    assert tokens == [2, 2]


@on_databases(*SERVERS)
def test_a_real_lock_wait_timeout_passes(vendor: str) -> None:
    alias = database_alias(vendor)
    key = f"lw-{uuid.uuid4().hex}"
    _leases(alias, key)
    holder = _other_connection(alias)
    try:
        holder.cursor().execute(_lock_sql(alias), [key])
        with _lock_timeout(alias):
            exc = _raised(alias, _lock_sql(alias).replace("%s", "'" + key + "'"))
    finally:
        holder.rollback()
        holder.close()
    assert isinstance(exc, OperationalError)
    assert _code(exc) in ("55P03", 1205)
    assert is_transient(exc)


@on_databases(*SERVERS)
def test_a_real_serialization_failure_passes(vendor: str) -> None:
    """A REPEATABLE READ transaction updating a row changed since its snapshot: 40001
    on PostgreSQL, 1020 on MariaDB with ``innodb_snapshot_isolation``."""
    alias = database_alias(vendor)
    key = f"sf-{uuid.uuid4().hex}"
    _leases(alias, key)
    if vendor == "mariadb":
        with connections[alias].cursor() as cursor:
            cursor.execute("SET SESSION innodb_snapshot_isolation = ON")
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        with (
            pytest.raises(OperationalError) as caught,
            transaction.atomic(using=alias),
            connections[alias].cursor() as cursor,
        ):
            if vendor == "postgres":
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT token FROM pikku_lease")  # the snapshot is taken
            other = _other_connection(alias)
            try:
                other.cursor().execute(_lock_sql(alias), [key])
                other.commit()
            finally:
                other.close()
            cursor.execute(_lock_sql(alias), [key])
    finally:
        connections[alias].close()  # the session's settings go with it
    assert _code(caught.value) in ("40001", 1020)
    assert is_transient(caught.value)


# -- the paths that act on them ------------------------------------------------------


@step(name="dbv_ok")
def ok() -> str:
    return "ok"


#: What the body of dbv_pass raises, and how many of its passes still raise it.
FAILING: dict[str, Any] = {"sql": "", "passes": 0}


@workflow(name="dbv_pass")
def raising_pass(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    if FAILING["passes"] > 0:
        FAILING["passes"] -= 1
        with connections[inp["alias"]].cursor() as cursor:
            cursor.execute(FAILING["sql"])
    return ctx.do("queued", "dbv_ok")


def _engine(vendor: str) -> tuple[WorkflowEngine, FakeClock]:
    clock = FakeClock()
    return WorkflowEngine(database_alias(vendor), leases=InMemoryLeaseService(), clock=clock), clock


def _settled_after(
    engine: WorkflowEngine, before: Callable[[int, int], None]
) -> tuple[list[DatabaseError], uuid.UUID]:
    """Run a one-step run, calling ``before(call, step_id)`` before each try of its
    step's settle (call 1, 2, ...): the errors the settle raised, and the run."""
    FAILING["passes"] = 0
    run = engine.start(raising_pass, {"alias": engine.using})
    engine.orchestrate(run.id)
    made = engine.steps().get(run_id=run.id)
    claimed = engine.claim_step(made.id)
    assert claimed is not None
    real = engine.store.settle
    calls: list[int] = []
    raised: list[DatabaseError] = []

    def settle(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        try:
            before(len(calls), made.id)
            return real(*args, **kwargs)
        except DatabaseError as exc:
            raised.append(exc)
            raise

    engine.store.settle = settle  # type: ignore[method-assign]
    try:
        engine.execute_step(claimed)
    finally:
        del engine.store.settle
    return raised, run.id


@on_databases(*SERVERS)
def test_a_real_lock_wait_on_a_settle_is_retried_without_spending_an_attempt(
    vendor: str,
) -> None:
    engine, _ = _engine(vendor)
    alias = engine.using
    holder = _other_connection(alias)

    def step_row_locked(call: int, step_id: int) -> None:
        if call == 1:
            holder.cursor().execute(
                "SELECT id FROM pikku_workflow_step WHERE id = %s FOR UPDATE", [step_id]
            )
        else:
            holder.rollback()  # the lock passes, as lock waits do

    try:
        with _lock_timeout(alias):
            raised, run_id = _settled_after(engine, step_row_locked)
    finally:
        holder.close()
    assert len(raised) == 1
    assert _code(raised[0]) in ("55P03", 1205)
    assert is_transient(raised[0])
    row = engine.steps().get(run_id=run_id)
    assert (row.status, row.attempt) == (StepStatus.SUCCEEDED, 1)
    attempts = list(engine.attempts().filter(step_id=row.id).values_list("status", flat=True))
    assert attempts == [AttemptStatus.SUCCEEDED]


@pytest.mark.parametrize("kind", ["deadlock", "serialization"])
@on_databases(*SERVERS)
def test_a_raised_passing_error_on_a_settle_is_retried_without_spending_an_attempt(
    vendor: str, kind: str
) -> None:
    engine, _ = _engine(vendor)
    sql = RAISED[vendor][kind][0]

    def server_raises(call: int, step_id: int) -> None:
        if call == 1:
            with connections[engine.using].cursor() as cursor:
                cursor.execute(sql)

    raised, run_id = _settled_after(engine, server_raises)
    assert len(raised) == 1
    assert is_transient(raised[0])
    row = engine.steps().get(run_id=run_id)
    assert (row.status, row.attempt) == (StepStatus.SUCCEEDED, 1)
    engine.run_until_idle()
    assert engine.get_run(run_id).status == RunStatus.COMPLETED


@pytest.mark.parametrize(("vendor", "kind"), _kinds(passing=True))
def test_a_pass_meeting_a_passing_server_error_is_retried_with_backoff(
    vendor: str, kind: str
) -> None:
    engine, clock = _engine(vendor)
    FAILING.update(sql=RAISED[vendor][kind][0], passes=4)
    run = engine.start(raising_pass, {"alias": engine.using})
    delays = []
    while FAILING["passes"]:
        assert engine.claim_due_runs(1) == [run.id]
        engine.orchestrate(run.id)
        current = engine.get_run(run.id)
        assert (current.status, current.pass_errors) == (RunStatus.RUNNING, 0)
        delays.append((current.wake_at - clock.now()).total_seconds())
        clock.advance(delays[-1])
    assert delays == [1.0, 2.0, 4.0, 8.0]  # backoff, never failing the run
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED


@pytest.mark.parametrize(("vendor", "kind"), _kinds(passing=False))
def test_a_pass_meeting_a_lasting_server_error_fails_its_run(
    vendor: str, kind: str, settings: Any
) -> None:
    settings.PIKKU = {**settings.PIKKU, "PASS_ERROR_TRIES": 3}
    engine, clock = _engine(vendor)
    sql, cls, *_ = RAISED[vendor][kind]
    FAILING.update(sql=sql, passes=10)
    run = engine.start(raising_pass, {"alias": engine.using})
    for counted in (1, 2):
        engine.orchestrate(run.id)
        current = engine.get_run(run.id)
        assert (current.status, current.pass_errors) == (RunStatus.RUNNING, counted)
        clock.advance(timedelta(seconds=60))
    engine.orchestrate(run.id)
    current = engine.get_run(run.id)
    assert (current.status, current.pass_errors) == (RunStatus.FAILED, 3)
    assert current.error["type"] == f"django.db.utils.{cls.__name__}"
    assert "3 time(s) in a row" in current.error["message"]
    assert FAILING["passes"] == 7
