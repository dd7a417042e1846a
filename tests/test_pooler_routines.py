"""The store's hot statements as PL/pgSQL functions behind a transaction pooler.

``migrate`` creates them on PostgreSQL (``pikku_django.workflows.store.routines``);
behind the transaction pooler the worker calls them in place of the statements (each
server session plans a function's statement once), behind the session pooler and on
a direct connection the statements run prepared as before. A database without a
statement's function runs the statement itself. The store scenario table and the
worker processes through the pooler (``test_pooler.py``, ``test_pooler_workers.py``)
run through the functions as well.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.workflows import WorkflowEngine
from pikku_django.workflows.store import routines
from pikku_django.workflows.store.postgresql_sql import statement
from tests.pgbouncer import Pooler, pooled_mark
from tests.testapp.models import Effect

pytestmark = pooled_mark()


def installed(alias: str) -> set[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'pikku\\_q\\_%%'")
        return {row[0] for row in cursor.fetchall()}


@pytest.fixture
def reinstalled() -> Iterator[None]:
    """The functions as ``migrate`` left them, after the test."""
    routines.forget()
    yield
    routines.install("postgres")
    routines.forget()


def run_three_records(alias: str, run: str) -> list[str]:
    """A run of three recording steps on ``alias``, to its end: the SQL it ran there."""
    engine = WorkflowEngine(alias)
    with CaptureQueriesContext(connections[alias]) as captured:
        started = engine.start("testapp.three_records", {"db": alias, "run": run})
        engine.run_until_idle()
    assert WorkflowRun.objects.using(alias).get(id=started.id).status == RunStatus.COMPLETED
    steps = sorted(Effect.objects.using(alias).filter(run_id=run).values_list("step", flat=True))
    assert steps == ["a", "b", "c"]  # each step once
    return [query["sql"] for query in captured.captured_queries]


def test_migrate_creates_a_function_per_hot_statement(pooled: Pooler) -> None:
    names = installed(pooled.alias)
    assert {routines.function_name(statement(name)) for name in routines.HOT} <= names


@pytest.mark.usefixtures("reinstalled")
def test_behind_the_transaction_pooler_the_hot_statements_run_as_functions(
    pooled: Pooler,
) -> None:
    ran = run_three_records(pooled.alias, f"fn-{pooled.mode}")
    calls = [sql for sql in ran if sql.startswith(f"SELECT * FROM {routines.PREFIX}")]
    if pooled.mode == "transaction":
        assert calls, ran
        assert not any(sql == statement("settle_then_claim") for sql in ran)
    else:  # the session pooler keeps prepared statements: the statements themselves
        assert not calls, calls


@pytest.mark.usefixtures("reinstalled")
@pytest.mark.parametrize("pooled", ["transaction"], indirect=True)  # only there they serve
def test_a_statement_without_its_function_runs_as_it_is(pooled: Pooler) -> None:
    """A database migrated by a version whose statements differ: the statements whose
    functions it lacks run themselves, the others through their functions."""
    by_function = {routines.function_name(statement(n)): statement(n) for n in routines.HOT}
    called = [
        name
        for sql in run_three_records(pooled.alias, "all")
        if sql.startswith(f"SELECT * FROM {routines.PREFIX}")
        for name in [sql.split()[3].split("(")[0]]
    ]
    dropped = called[0]
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f"DROP FUNCTION {dropped}")
    routines.forget()
    ran = run_three_records(pooled.alias, "one dropped")
    # Django's query log has the statement with its parameters in place.
    assert any(sql.startswith(by_function[dropped].split("%s")[0]) for sql in ran), ran
    assert any(sql.startswith(f"SELECT * FROM {routines.PREFIX}") for sql in ran)


@pytest.mark.usefixtures("reinstalled")
def test_install_replaces_the_functions_and_leaves_those_of_old_statements(
    pooled: Pooler,
) -> None:
    """An older version's workers, still running during a deploy, call its functions
    until they stop: a migrate by the new version leaves them in place."""
    old = f"{routines.PREFIX}0000000000"
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f"CREATE OR REPLACE FUNCTION {old}() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    try:
        assert routines.install("postgres") == len(routines.HOT)
        assert routines.install("postgres") == len(routines.HOT)
        names = installed("postgres")
        assert old in names
        assert len(names - {old}) == len(routines.HOT)
    finally:
        with connections["postgres"].cursor() as cursor:
            cursor.execute(f"DROP FUNCTION {old}()")
