"""Every query the worker runs on a schedule, and pikku_prune's, is backed by an index
on PostgreSQL.

On tables holding a million bulk-loaded steps, each statement's plan (the generic
plan a prepared statement settles on, and the custom plan) scans no runs or steps
table sequentially, and costs too little for the server to JIT-compile it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from itertools import islice
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from pikku_django.workflows._values import FirstStepAsk, RunLeaseAsk
from pikku_django.workflows.control._deadlines import (
    next_deadline,
    overdue_runs,
    timed_out_suspensions,
)
from pikku_django.workflows.store.postgresql import PostgresStore
from pikku_django.workflows.store.postgresql_rows import claim_due_runs_first_params
from pikku_django.workflows.store.postgresql_sql import statement
from tests.conftest import database_alias, db_mark

pytestmark = pytest.mark.once

RUNS, STEPS = 100_000, 1_000_000
SLEEPING, FAILED = 40_000, 5_000
#: PostgreSQL JIT-compiles plans above this cost by default (jit_above_cost).
JIT_ABOVE_COST = 100_000
TABLES = ("pikku_workflow_run", "pikku_workflow_step", "pikku_step_attempt")
#: The due-run claim that stores first steps: for a worker of every queue, and of one.
ASK = RunLeaseAsk("workflow-run:", "holder", 30_000)
FIRST = FirstStepAsk("host:1:2", (), (), ("bulk",), ("mail",), (5_000,), 60_000)
SERVED = FirstStepAsk("host:1:2", ("default",), (), ("bulk",), (), (), 60_000)


@pytest.fixture(scope="module")
def alias() -> str:
    return database_alias("postgres")


def _load(alias: str) -> None:
    """Completed runs of ten succeeded steps each, sleeping runs and failed runs."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pikku_workflow_run (id, workflow, status, input, output, error,
                suspend_reason, inline, idempotency_key, wake_at, wakes, pass_errors,
                created_at, updated_at)
            SELECT gen_random_uuid(), 'bulk',
                CASE WHEN g <= %s THEN 'running' WHEN g <= %s THEN 'failed'
                     ELSE 'completed' END,
                NULL, NULL, NULL, '', false, NULL,
                CASE WHEN g <= %s THEN now() + interval '1 day' END, 0, 0,
                now() - interval '2 days', now() - interval '1 day'
            FROM generate_series(1, %s) g
            """,
            [SLEEPING, SLEEPING + FAILED, SLEEPING, RUNS],
        )
        cursor.execute(
            """
            INSERT INTO pikku_workflow_step (run_id, name, kind, function, input, status,
                result, error, retries, retry_delay, backoff, attempt, lease_expires_at,
                child_run_id, queue, transactional, available_at, created_at, updated_at)
            SELECT r.id, 's' || n,
                CASE WHEN r.status = 'running' AND n = 10 THEN 'sleep' ELSE 'queued' END,
                'fn', NULL,
                CASE WHEN r.status = 'running' AND n = 10 THEN 'scheduled'
                     WHEN r.status = 'failed' AND n = 10 THEN 'failed'
                     ELSE 'succeeded' END,
                NULL, NULL, 5, 1, 'fixed',
                CASE WHEN r.status = 'failed' AND n = 10 THEN 6 ELSE 1 END,
                NULL, NULL, 'default', false,
                CASE WHEN r.status = 'running' AND n = 10 THEN now() + interval '1 day' END,
                r.created_at, r.updated_at
            FROM pikku_workflow_run r CROSS JOIN generate_series(1, %s) n
            """,
            [STEPS // RUNS],
        )
        cursor.execute("ANALYZE pikku_workflow_run")
        cursor.execute("ANALYZE pikku_workflow_step")


def _plans(alias: str, sql: str, params: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The custom plan of ``sql`` with ``params``, then the generic plan of it prepared."""
    numbered = sql
    for i in range(1, len(params) + 1):
        numbered = numbered.replace("%s", f"${i}", 1)
    with connections[alias].cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        yield "custom", _json(cursor.fetchone()[0])
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        try:
            cursor.execute("PREPARE pikku_explained AS " + numbered)
            try:
                cursor.execute(
                    "EXPLAIN (FORMAT JSON) EXECUTE pikku_explained("
                    + ", ".join(["%s"] * len(params))
                    + ")",
                    params,
                )
                yield "generic", _json(cursor.fetchone()[0])
            finally:
                cursor.execute("DEALLOCATE pikku_explained")
        finally:
            cursor.execute("RESET plan_cache_mode")


def _json(value: Any) -> dict[str, Any]:
    plan = json.loads(value) if isinstance(value, str) else value
    return plan[0]["Plan"]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _check(name: str, kind: str, plan: dict[str, Any]) -> list[str]:
    problems = []
    for node in _nodes(plan):
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in TABLES:
            problems.append(f"{name} ({kind} plan) scans {node['Relation Name']}")
    if plan["Total Cost"] >= JIT_ABOVE_COST:
        problems.append(f"{name} ({kind} plan) costs {plan['Total Cost']}: JIT-compiled")
    return problems


def _orm_statements(alias: str, store: PostgresStore, now: Any) -> list[tuple[str, str]]:
    """The ORM statements the worker's scheduled calls run, as they ran."""
    found = []
    calls = {
        "lock_ready_steps": lambda: store.lock_ready_steps(now, [], 1),
        "lock_ready_steps_on": lambda: store.lock_ready_steps(now, ["default"], 1),
        "next_due": lambda: store.next_due(now, []),
        "stalled_runs": lambda: store.stalled_runs(now - timedelta(seconds=300), 500),
        "work_pending": lambda: store.work_pending(now, []),
        "overdue_runs": lambda: overdue_runs(store, now, 100),
        "timed_out_suspensions": lambda: timed_out_suspensions(store, now, 100),
        "next_deadline": lambda: next_deadline(store),
    }
    for name, call in calls.items():
        with CaptureQueriesContext(connections[alias]) as captured, store.atomic():
            call()
        for n, query in enumerate(q["sql"] for q in captured.captured_queries):
            if query.startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT")):
                continue
            found.append((f"{name}#{n}", query))
    return found


@pytest.mark.parametrize("vendor", [pytest.param("postgres", marks=db_mark("postgres"))])
def test_the_workers_scheduled_queries_use_indexes_on_a_million_steps(
    vendor: str, alias: str
) -> None:
    _load(alias)
    store = PostgresStore(alias)
    now = timezone.now()
    cases: list[tuple[str, str, list[Any]]] = [
        ("claim_due_runs", statement("claim_due_runs"), [now, now, 10]),
        (
            "claim_due_runs_leased",
            statement("claim_due_runs_leased"),
            [now, now, 1, "workflow-run:", "holder", 30_000, 30_000, 30_000, "workflow-run:"],
        ),
        *(
            (
                f"claim_due_runs_first_{'served' if served else 'all'}",
                statement("claim_due_runs_first" + ("_served" if served else "")),
                claim_due_runs_first_params(now, now, 1, ASK, FIRST if not served else SERVED, now),
            )
            for served in (False, True)
        ),
        (
            "claim_step",
            statement("claim_step"),
            [1, now, now, 1000, now, True, now, "w", now, "{}", now, "{}", now],
        ),
        ("ready_steps_exist", statement("ready_steps_exist"), [now, now]),
        (
            "ready_steps_exist_on",
            statement("ready_steps_exist_on"),
            [now, ["default"], now, ["default"], ["default"]],
        ),
        ("retries_or_lapsed_exist", statement("retries_or_lapsed_exist"), [now]),
        (
            "retries_or_lapsed_exist_on",
            statement("retries_or_lapsed_exist_on"),
            [now, ["default"], ["default"]],
        ),
    ]
    problems: list[str] = []
    seen = []
    for name, sql, params in cases:
        for kind, plan in _plans(alias, sql, params):
            seen.append((name, kind))
            problems += _check(name, kind, plan)
    # The ORM's statements run unprepared: their custom plan is the one they get.
    for name, sql in _orm_statements(alias, store, now):
        with connections[alias].cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + sql.replace("%", "%%"))
            plan = _json(cursor.fetchone()[0])
        seen.append((name, "custom"))
        problems += _check(name, "custom", plan)
    assert ("ready_steps_exist", "generic") in seen
    assert ("claim_step", "generic") in seen
    assert ("claim_due_runs_leased", "generic") in seen
    assert ("claim_due_runs_first_all", "generic") in seen
    assert ("claim_due_runs_first_served", "generic") in seen
    assert ("retries_or_lapsed_exist_on", "generic") in seen
    assert any(name.startswith("stalled_runs") for name, _ in seen)
    assert any(name.startswith("overdue_runs") for name, _ in seen)
    assert any(name.startswith("next_deadline") for name, _ in seen)
    assert problems == [], "\n".join(problems)


def _load_limits(alias: str) -> None:
    """Runs with concurrency keys (most ended, some waiting) and rated queues' claims."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pikku_workflow_run (id, workflow, status, input, output, error,
                suspend_reason, inline, idempotency_key, wake_at, wakes, pass_errors,
                concurrency_key, concurrency_limit, key_waiting, created_at, updated_at)
            SELECT gen_random_uuid(), 'bulk',
                CASE WHEN g <= %s THEN 'running' ELSE 'completed' END,
                NULL, NULL, NULL, '', false, NULL, NULL, 0, 0,
                CASE WHEN g %% 3 = 0 THEN 'customer-' || (g %% 5000) END, 1,
                g <= %s AND g %% 3 = 0,
                now() - interval '2 days', now() - interval '1 day'
            FROM generate_series(1, %s) g
            """,
            [3_000, 3_000, RUNS],
        )
        cursor.execute(
            """
            INSERT INTO pikku_queue_claim (queue, slot, claimed_ms)
            SELECT 'q' || (g %% 50), g / 50, floor(extract(epoch FROM now()) * 1000)::bigint - g
            FROM generate_series(1, %s) g
            """,
            [RUNS],
        )
        cursor.execute("ANALYZE pikku_workflow_run")
        cursor.execute("ANALYZE pikku_queue_claim")


@pytest.mark.parametrize("vendor", [pytest.param("postgres", marks=db_mark("postgres"))])
def test_the_limits_queries_use_indexes(vendor: str, alias: str) -> None:
    from pikku_django.workflows.control import _admission, _rates
    from pikku_django.workflows.control.queues import Rate

    _load_limits(alias)
    store = PostgresStore(alias)
    now = timezone.now()
    rate = Rate(100, 60)
    calls = {
        "waiting_exists": lambda: _admission.waiting_runs(store, now).exists(),
        "waiting_keys": lambda: _admission._keys(store, 100, now),
        "key_head": lambda: _admission._head(store, "customer-3", 5, now),
        "key_in_progress": lambda: _admission.key_state(store, "customer-3", 1),
        "rate_take": lambda: _rates.take_slots(store, "q7", rate, 1),
        "rate_take_more": lambda: _rates.take_slots(store, "q7", Rate(RUNS, 60), 4),
        "rate_stamp": lambda: _rates.stamp_slots(store, [1, 2]),
        "rate_prune": lambda: _rates.prune_claims(store, "q7", rate),
        "rate_recent": lambda: _rates.recent_claims(store, "q7", rate),
    }
    problems: list[str] = []
    seen = set()
    for name, call in calls.items():
        with CaptureQueriesContext(connections[alias]) as captured, store.atomic():
            call()
        for n, query in enumerate(q["sql"] for q in captured.captured_queries):
            if query.startswith(("SAVEPOINT", "RELEASE", "BEGIN", "COMMIT")):
                continue
            seen.add(name)
            with connections[alias].cursor() as cursor:
                cursor.execute("EXPLAIN (FORMAT JSON) " + query.replace("%", "%%"))
                plan = _json(cursor.fetchone()[0])
            for node in _nodes(plan):
                if node["Node Type"] == "Seq Scan":
                    problems.append(f"{name}#{n} scans {node.get('Relation Name')}")
    assert seen == set(calls)
    assert problems == [], "\n".join(problems)


def _load_backlog(alias: str, steps: int) -> None:
    """``steps`` running runs, each with one queued step ready to be claimed."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            """
            CREATE TEMP TABLE backlog AS
            SELECT gen_random_uuid() AS id, g FROM generate_series(1, %s) g
            """,
            [steps],
        )
        cursor.execute(
            """
            INSERT INTO pikku_workflow_run (id, workflow, status, input, output, error,
                suspend_reason, inline, idempotency_key, wake_at, wakes, pass_errors,
                created_at, updated_at)
            SELECT id, 'bulk', 'running', NULL, NULL, NULL, '', false, NULL, NULL, 0, 0,
                now() - interval '1 hour', now() - interval '1 hour'
            FROM backlog
            """
        )
        cursor.execute(
            """
            INSERT INTO pikku_workflow_step (run_id, name, kind, function, input, status,
                result, error, retries, attempt, retry_delay, backoff, lease_expires_at,
                child_run_id, queue, transactional, available_at, created_at, updated_at)
            SELECT id, 's', 'queued', 'fn', NULL, 'scheduled', NULL, NULL, 0, 0, 1, 'fixed',
                NULL, NULL, CASE WHEN g % 2 = 0 THEN 'default' ELSE 'other' END, false,
                now() - interval '1 minute', now(), now()
            FROM backlog
            """
        )
        cursor.execute("DROP TABLE backlog")


@pytest.mark.parametrize("vendor", [pytest.param("postgres", marks=db_mark("postgres"))])
def test_the_claim_reads_a_backlog_of_ready_steps_in_claim_order(vendor: str, alias: str) -> None:
    """The claim of a ready step reads pikku_step_claim_order up to its first ready
    steps: no sort over the backlog and no join over every running run."""
    _load_backlog(alias, 10_000)
    with connections[alias].cursor() as cursor:
        cursor.execute("ANALYZE pikku_workflow_run")
        cursor.execute("ANALYZE pikku_workflow_step")
    store = PostgresStore(alias)
    now = timezone.now()
    problems: list[str] = []
    for served in ([], ["default"]):
        with CaptureQueriesContext(connections[alias]) as captured, store.atomic():
            assert len(store.lock_ready_steps(now, served, 1)) == 1
        [query] = [q["sql"] for q in captured.captured_queries if "FOR UPDATE" in q["sql"]]
        with connections[alias].cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query.replace("%", "%%"))
            plan = _json(cursor.fetchone()[0])
        nodes = list(_nodes(plan))
        scans = {n.get("Index Name") for n in nodes if n.get("Relation Name") in TABLES}
        if "pikku_step_claim_order" not in scans:
            problems.append(f"{served}: reads {scans}, not pikku_step_claim_order")
        for node in nodes:
            if node["Node Type"] in ("Sort", "Hash Join", "Merge Join", "Seq Scan"):
                problems.append(f"{served}: {node['Node Type']} in the claim's plan")
            if node.get("Relation Name") == "pikku_workflow_step" and node["Actual Rows"] > 5:
                problems.append(f"{served}: reads {node['Actual Rows']} steps for one claim")
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("vendor", [pytest.param("postgres", marks=db_mark("postgres"))])
def test_the_fresh_claims_read_a_backlog_of_ready_steps_in_claim_order(
    vendor: str, alias: str
) -> None:
    """The one-statement claims of fresh steps (all queues, some, one limited queue)
    and the look at the first one's queue read pikku_step_claim_order up to their
    first ready steps, as the worker runs them: no sort over the backlog and no
    join over every running run."""
    from django.db import transaction

    from pikku_django.workflows.control.queues import Rate

    _load_backlog(alias, 10_000)
    with connections[alias].cursor() as cursor:
        cursor.execute("ANALYZE pikku_workflow_run")
        cursor.execute("ANALYZE pikku_workflow_step")
    store = PostgresStore(alias)
    now = timezone.now()
    seen: list[tuple[str, Any]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "SKIP LOCKED" in sql or "LIMIT 1" in sql:
            seen.append((sql, params))
        return execute(sql, params, many, context)

    leases = {"default": 60_000}
    calls = {
        "all queues": lambda: store.claim_fresh_steps(
            now, [], 1, worker="w", leases=leases, default_lease_ms=60_000
        ),
        "some queues": lambda: store.claim_fresh_steps(
            now, ["default"], 1, worker="w", leases=leases, default_lease_ms=60_000
        ),
        "concurrency and rate": lambda: store.claim_fresh_limited(
            now, "default", 1, worker="w", lease_ms=60_000, concurrency=8, rate=Rate(100, 60)
        ),
        "first queue": lambda: store.first_fresh_queue(now, ["default", "other"]),
    }
    problems: list[str] = []
    for name, call in calls.items():
        seen.clear()
        with connections[alias].execute_wrapper(record):
            call()
        assert seen, name
        for sql, params in seen:
            # As prepared, after five runs its generic plan may be the one it gets.
            with transaction.atomic(using=alias):
                for kind, planned in _plans(alias, sql, list(params)):
                    problems += _check(name, kind, planned)
                transaction.set_rollback(True, using=alias)
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                plan = _json(cursor.fetchone()[0])
                transaction.set_rollback(True, using=alias)
            nodes = list(_nodes(plan))
            steps = [n for n in nodes if n.get("Relation Name") == "pikku_workflow_step"]
            if "pikku_step_claim_order" not in {n.get("Index Name") for n in steps}:
                problems.append(f"{name}: reads {[n.get('Index Name') for n in steps]}")
            for node in nodes:
                if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in TABLES:
                    problems.append(f"{name}: scans {node['Relation Name']}")
                # A sort or join of the rows claimed is fine; one over the backlog is not.
                read = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                if node.get("Relation Name") in TABLES and read > 5:
                    problems.append(f"{name}: reads {read} rows of {node['Relation Name']}")
    assert problems == [], "\n".join(problems)


OLD_SETTLED, OLD_SUSPENDED, PRUNE_BATCH = 2_000, 1_000, 500


def _load_prunable(alias: str) -> None:
    """Besides the recent runs of :func:`_load`: settled runs last changed 40 days ago
    (steps, attempts and run leases too), suspended runs as old, and an old settled
    child whose parent still runs. Every step has an attempt."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pikku_workflow_run (id, workflow, status, input, output, error,
                suspend_reason, inline, idempotency_key, wake_at, wakes, pass_errors,
                created_at, updated_at)
            SELECT gen_random_uuid(), 'old',
                CASE WHEN g > %s THEN 'suspended'
                     ELSE (ARRAY['completed', 'failed', 'cancelled'])[g %% 3 + 1] END,
                NULL, NULL, NULL, '', false, NULL, NULL, 0, 0,
                now() - interval '60 days', now() - interval '40 days'
            FROM generate_series(1, %s) g
            """,
            [OLD_SETTLED, OLD_SETTLED + OLD_SUSPENDED],
        )
        cursor.execute(
            """
            INSERT INTO pikku_workflow_step (run_id, name, kind, function, input, status,
                result, error, retries, retry_delay, backoff, attempt, child_run_id, queue,
                transactional, created_at, updated_at)
            SELECT r.id, 's' || n, 'queued', 'fn', NULL, 'succeeded', NULL, NULL, 5, 1,
                'fixed', 1, NULL, 'default', false, r.created_at, r.updated_at
            FROM pikku_workflow_run r CROSS JOIN generate_series(1, 5) n
            WHERE r.workflow = 'old'
            """
        )
        cursor.execute(
            """
            INSERT INTO pikku_workflow_step (run_id, name, kind, function, input, status,
                result, error, retries, retry_delay, backoff, attempt, child_run_id, queue,
                transactional, created_at, updated_at)
            SELECT (SELECT id FROM pikku_workflow_run WHERE status = 'running' LIMIT 1),
                'child', 'child', '', NULL, 'succeeded', NULL, NULL, 0, 0, 'fixed', 0,
                (SELECT id FROM pikku_workflow_run WHERE workflow = 'old'
                 AND status = 'completed' LIMIT 1), 'default', false, now(), now()
            """
        )
        cursor.execute(
            """
            INSERT INTO pikku_step_attempt (step_id, attempt, status, result, error, worker,
                started_at, finished_at)
            SELECT id, 1, status, NULL, NULL, 'w', created_at, updated_at
            FROM pikku_workflow_step
            """
        )
        cursor.execute(
            """
            INSERT INTO pikku_lease (key, holder, token, expires_at)
            SELECT 'workflow-run:' || id, 'w', 1, 0 FROM pikku_workflow_run
            """
        )
        for table in (*TABLES, "pikku_lease"):
            cursor.execute(f"ANALYZE {table}")


def _count(alias: str, sql: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql)
        return int(cursor.fetchone()[0])


def _is_batch(sql: str) -> bool:
    """Whether ``sql`` is pikku_prune's selection of a batch of runs."""
    return sql.startswith('SELECT "pikku_workflow_run"."id"') and "LIMIT" in sql


def _batch_problems(kind: str, plan: dict[str, Any]) -> list[str]:
    nodes = list(_nodes(plan))
    runs = [n.get("Index Name") for n in nodes if n.get("Relation Name") == "pikku_workflow_run"]
    problems = [] if "pikku_run_settled" in runs else [f"a batch ({kind} plan) reads {runs}"]
    if any(n["Node Type"] == "Sort" for n in nodes):
        problems.append(f"a batch ({kind} plan) is sorted")
    return problems


def _batch_read(alias: str, sql: str, params: Any) -> tuple[int, int]:
    """How many runs the batch selection ``sql`` selects, and how many it reads."""
    with connections[alias].cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        nodes = list(_nodes(_json(cursor.fetchone()[0])))
    runs = [n for n in nodes if n.get("Relation Name") == "pikku_workflow_run"]
    read = sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in runs
    )
    return nodes[0]["Actual Rows"], read


@pytest.mark.parametrize("vendor", [pytest.param("postgres", marks=db_mark("postgres"))])
def test_prune_reads_its_batches_off_an_index(vendor: str, alias: str) -> None:
    """Among 100,000 recent runs, pikku_prune reads each batch of old settled runs off
    pikku_run_settled (no sort, about a batch of rows read), and every statement it
    runs, custom and generic plan, scans no runs, steps or attempts table sequentially
    and stays below the JIT threshold. Steps, attempts and run leases go with the runs."""
    from django.core.management import call_command
    from django.test import override_settings

    _load(alias)
    _load_prunable(alias)
    before = _count(alias, "SELECT count(*) FROM pikku_workflow_run")
    problems: list[str] = []
    planned: set[str] = set()
    reads: list[tuple[int, int]] = []
    planning = False

    def plan(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal planning
        if planning or many or "pikku_" not in sql:
            return execute(sql, params, many, context)
        planning = True
        try:
            if sql not in planned:
                planned.add(sql)
                # A dry run's count runs once per command, so it is never prepared:
                # its custom plan is the one it gets. What runs per batch may be.
                once = sql.startswith("SELECT COUNT(*)")
                for kind, planned_as in islice(
                    _plans(alias, sql, list(params or ())), 1 if once else 2
                ):
                    problems.extend(_check(sql[:60], kind, planned_as))
                    if _is_batch(sql):
                        problems.extend(_batch_problems(kind, planned_as))
            if _is_batch(sql):
                reads.append(_batch_read(alias, sql, params))
        finally:
            planning = False
        return execute(sql, params, many, context)

    pikku = {"WORKFLOW_DATABASE": alias, "LEASE_DATABASE": alias}
    with override_settings(PIKKU=pikku), connections[alias].execute_wrapper(plan):
        for extra in (["--dry-run"], ["--batch-size", str(PRUNE_BATCH)]):
            prune = ["pikku_prune", "--older-than", "30d", "--database", alias, *extra]
            call_command(*prune, stdout=StringIO())
    # 1,999 runs to delete (one old child is kept): four batches, then none.
    assert [selected for selected, _ in reads] == [500, 500, 500, 499, 0]
    assert all(read <= selected + 10 for selected, read in reads), f"(selected, read): {reads}"
    assert problems == [], "\n".join(problems)
    # The old settled runs went (their steps and attempts by their foreign keys) with
    # their run leases; the suspended runs and the child of a running run stayed.
    assert _count(alias, "SELECT count(*) FROM pikku_workflow_run") == before - OLD_SETTLED + 1
    kept = "SELECT count(*) FROM pikku_workflow_run WHERE workflow = 'old'"
    assert _count(alias, kept) == OLD_SUSPENDED + 1
    assert _count(alias, "SELECT count(*) FROM pikku_lease") == before - OLD_SETTLED + 1
