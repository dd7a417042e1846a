"""pikku_django's hot-path statements: prepared on PostgreSQL, Django's cursor elsewhere,
seen by execute wrappers and the query log either way, and failing as Django's errors."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connections
from django.test.utils import CaptureQueriesContext

from pikku_django.prepared import fetch, fetch_one
from tests.conftest import database_alias, db_mark

VENDORS = ("sqlite", "postgres", "mariadb")


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def alias(request: pytest.FixtureRequest) -> str:
    return database_alias(request.param)


def test_a_statement_is_seen_by_execute_wrappers_and_the_query_log(alias: str) -> None:
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    connection = connections[alias]
    connection.ensure_connection()
    with connection.execute_wrapper(wrapper), CaptureQueriesContext(connection) as captured:
        assert [tuple(row) for row in fetch(alias, "SELECT %s, %s", [7, "x"])] == [(7, "x")]
        assert fetch_one(alias, "SELECT 1 WHERE 1 = %s", [2]) is None
    assert seen == ["SELECT %s, %s", "SELECT 1 WHERE 1 = %s"]
    assert len(captured) == 2


def test_a_failing_statement_raises_djangos_error(alias: str) -> None:
    with pytest.raises(DatabaseError):
        fetch(alias, "SELECT * FROM pikku_no_such_table WHERE 1 = %s", [1])
    # The connection is still usable afterwards.
    assert tuple(fetch_one(alias, "SELECT %s", [1])) == (1,)


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "not-prepared"])
@pytest.mark.parametrize(
    "alias", [pytest.param("postgres", marks=db_mark("postgres"), id="postgres")], indirect=True
)
def test_postgresql_prepares_unless_turned_off(alias: str, prepared: bool, settings: Any) -> None:
    settings.PIKKU = {**settings.PIKKU, "PREPARED_STATEMENTS": prepared}
    connections[alias].close()
    fetch(alias, "SELECT %s::int + 41", [1])
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert (cursor.fetchone()[0] > 0) is prepared
