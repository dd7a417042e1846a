"""``pikku_prune`` selects each batch of runs off an index, in the index's order, on
SQLite (``pikku_run_settled``, partial) and MariaDB (``pikku_run_settled_status``),
among many recent runs. PostgreSQL's plans are checked in tests/test_explain.py."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from tests.conftest import database_alias, on_databases

RECENT, OLD_SETTLED, OLD_SUSPENDED, BATCH = 20_000, 1_000, 500, 200


def _load(alias: str, vendor: str) -> None:
    """Recent completed runs, and as many runs again of the other statuses, half
    of them last changed 40 days ago."""
    now = timezone.now()
    total = RECENT + OLD_SETTLED + OLD_SUSPENDED
    with connections[alias].cursor() as cursor:
        if vendor == "mariadb":
            numbers, n, new_id = f"seq_1_to_{total}", "seq", "UUID()"
        else:
            cursor.execute(
                "CREATE TEMP TABLE numbers AS WITH RECURSIVE s(n) AS "
                "(SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < %s) SELECT n FROM s",
                [total],
            )
            numbers, n, new_id = "numbers", "n", "lower(hex(randomblob(16)))"
        cursor.execute(
            f"""
            INSERT INTO pikku_workflow_run (id, workflow, status, suspend_reason, inline,
                wakes, pass_errors, priority, queue, concurrency_limit, key_waiting, version,
                created_at, updated_at)
            SELECT {new_id}, 'bulk',
                CASE WHEN {n} > %s THEN 'completed' WHEN {n} > %s THEN 'suspended'
                     WHEN MOD({n}, 3) = 0 THEN 'completed' WHEN MOD({n}, 3) = 1 THEN 'failed'
                     ELSE 'cancelled' END,
                '', 0, 0, 0, 0, '', 1, 0, '', %s,
                CASE WHEN {n} > %s THEN %s ELSE %s END
            FROM {numbers}
            """,
            [
                OLD_SETTLED + OLD_SUSPENDED,
                OLD_SETTLED,
                now - timedelta(days=60),
                OLD_SETTLED + OLD_SUSPENDED,
                now - timedelta(hours=1),
                now - timedelta(days=40),
            ],
        )
        cursor.execute("ANALYZE" if vendor == "sqlite" else "ANALYZE TABLE pikku_workflow_run")


def _sqlite_problems(alias: str, sql: str, params: Any) -> list[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        steps = [row[-1] for row in cursor.fetchall()]
    problems = [] if "INDEX pikku_run_settled " in steps[0] + " " else [f"reads {steps[0]}"]
    return problems + [f"sorts: {s}" for s in steps if "TEMP B-TREE" in s]


def _mariadb_problems(alias: str, sql: str, params: Any) -> list[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute("ANALYZE FORMAT=JSON " + sql, params)
        analyzed = cursor.fetchone()[0]
    outer = json.loads(analyzed)["query_block"]
    outer = outer.get("nested_loop", [outer])[0]
    table = outer.get("table") or outer.get("read_sorted_file", {}).get("filesort", {})
    problems = ["sorts the batch"] if "filesort" in analyzed else []
    if table.get("key") != "pikku_run_settled_status":
        problems.append(f"reads {table.get('key')}")
    if table.get("r_rows", 0) > BATCH + 10:
        problems.append(f"reads {table.get('r_rows')} runs for a batch of {BATCH}")
    return problems


@on_databases("sqlite", "mariadb")
def test_prune_reads_each_batch_off_an_index_in_its_order(vendor: str) -> None:
    alias = database_alias(vendor)
    _load(alias, vendor)
    batches: list[str] = []
    problems: list[str] = []
    checking = False

    def check(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal checking
        if not checking and "LIMIT" in sql and "FROM `pikku_workflow_run`" in sql.replace('"', "`"):
            checking = True
            try:
                batches.append(sql)
                explain = _mariadb_problems if vendor == "mariadb" else _sqlite_problems
                problems.extend(explain(alias, sql, params))
            finally:
                checking = False
        return execute(sql, params, many, context)

    out = StringIO()
    with connections[alias].execute_wrapper(check):
        call_command(
            "pikku_prune",
            "--older-than",
            "30d",
            "--batch-size",
            str(BATCH),
            "--database",
            alias,
            stdout=out,
        )
    assert f"Deleted {OLD_SETTLED} settled runs" in out.getvalue()
    assert len(batches) == OLD_SETTLED // BATCH + 1
    assert problems == [], "\n".join(problems)
