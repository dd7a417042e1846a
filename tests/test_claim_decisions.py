"""The claim decision for one step, one table against every workflow store on every
database: PostgreSQL decides in its one statement, the ORM stores in Python, and both
come to the same verdict and write the same rows. Every named PostgreSQL statement is
also checked to be one the server accepts, so that a typo in one rarely run cannot
hide."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from pikku_django.dbclock import EpochMs, store_now_ms
from pikku_django.models import (
    AttemptStatus,
    QueuePause,
    StepAttempt,
    StepStatus,
    WorkflowStep,
)
from pikku_django.workflows.store import WorkflowStore
from pikku_django.workflows.store.decisions import Verdict
from pikku_django.workflows.store.postgresql_sql import BUILDERS, statement, unlimited_claim
from tests.conftest import database_alias, db_mark
from tests.test_workflow_store import _run, _step, store  # noqa: F401 (the fixture)

PAST, FUTURE = -60, 3600
RUN = AttemptStatus.RUNNING

#: (case, step fields, run status, paused queue?, pausable, verdict, won, step after:
#: (status, attempt), the attempts' statuses after)
CASES: list[tuple[str, dict[str, Any], str, bool, bool, Verdict, bool, Any, list[str]]] = [
    (
        "scheduled and due",
        {"status": "scheduled", "due": PAST},
        "running",
        False,
        True,
        Verdict.CLAIM,
        True,
        ("running", 1),
        ["running"],
    ),
    (
        "scheduled without a time",
        {"status": "scheduled", "due": None},
        "running",
        False,
        True,
        Verdict.CLAIM,
        True,
        ("running", 1),
        ["running"],
    ),
    (
        "scheduled, not yet due",
        {"status": "scheduled", "due": FUTURE},
        "running",
        False,
        True,
        Verdict.NONE,
        False,
        ("scheduled", 0),
        [],
    ),
    (
        "failed, an attempt left, due",
        {"status": "failed", "attempt": 1, "retries": 2, "due": PAST, "attempts": ["failed"]},
        "running",
        False,
        True,
        Verdict.CLAIM,
        True,
        ("running", 2),
        ["failed", "running"],
    ),
    (
        "failed, attempts spent",
        {"status": "failed", "attempt": 3, "retries": 2, "due": PAST},
        "running",
        False,
        True,
        Verdict.NONE,
        False,
        ("failed", 3),
        [],
    ),
    (
        "running, lease live",
        {"status": "running", "attempt": 1, "lease": "live", "attempts": ["running"]},
        "running",
        False,
        True,
        Verdict.NONE,
        False,
        ("running", 1),
        ["running"],
    ),
    (
        "running, parked",
        {"status": "running", "attempt": 1, "lease": None, "attempts": ["running"]},
        "running",
        False,
        True,
        Verdict.NONE,
        False,
        ("running", 1),
        ["running"],
    ),
    (
        "running, lease lapsed, an attempt left",
        {
            "status": "running",
            "attempt": 1,
            "retries": 1,
            "lease": "lapsed",
            "attempts": ["running"],
        },
        "running",
        False,
        True,
        Verdict.CLAIM,
        True,
        ("running", 2),
        [AttemptStatus.SUPERSEDED, "running"],
    ),
    (
        "running, lease lapsed, no attempt left",
        {
            "status": "running",
            "attempt": 1,
            "retries": 0,
            "lease": "lapsed",
            "attempts": ["running"],
        },
        "running",
        False,
        True,
        Verdict.EXPIRED,
        True,
        ("failed", 1),
        ["failed"],
    ),
    (
        "running, lease lapsed past its timeout",
        {
            "status": "running",
            "attempt": 1,
            "retries": 1,
            "lease": "lapsed",
            "timeout": 5.0,
            "attempts": ["running"],
        },
        "running",
        False,
        True,
        Verdict.TIMED_OUT,
        False,
        ("running", 1),
        ["running"],
    ),
    (
        "running, lease lapsed within its timeout",
        {
            "status": "running",
            "attempt": 1,
            "retries": 1,
            "lease": "lapsed",
            "timeout": 600.0,
            "attempts": ["running"],
        },
        "running",
        False,
        True,
        Verdict.CLAIM,
        True,
        ("running", 2),
        [AttemptStatus.SUPERSEDED, "running"],
    ),
    (
        "succeeded",
        {"status": "succeeded", "due": PAST},
        "running",
        False,
        True,
        Verdict.NONE,
        False,
        ("succeeded", 0),
        [],
    ),
    (
        "suspended",
        {"status": "suspended", "due": PAST},
        "running",
        False,
        True,
        Verdict.NONE,
        False,
        ("suspended", 0),
        [],
    ),
    (
        "of a cancelled run",
        {"status": "scheduled", "due": PAST},
        "cancelled",
        False,
        True,
        Verdict.CLAIM,
        False,
        ("scheduled", 0),
        [],
    ),
    (
        "on a paused queue",
        {"status": "scheduled", "due": PAST},
        "running",
        True,
        True,
        Verdict.CLAIM,
        False,
        ("scheduled", 0),
        [],
    ),
    (
        "on a paused queue, not pausable (an inline run's)",
        {"status": "scheduled", "due": PAST},
        "running",
        True,
        False,
        Verdict.CLAIM,
        True,
        ("running", 1),
        ["running"],
    ),
    (
        "an inline step on a paused queue",
        {"status": "scheduled", "due": PAST, "kind": "inline"},
        "running",
        True,
        True,
        Verdict.CLAIM,
        True,
        ("running", 1),
        ["running"],
    ),
]


@pytest.mark.parametrize(
    ("case", "fields", "run_status", "paused", "pausable", "verdict", "won", "after", "history"),
    CASES,
    ids=[case[0] for case in CASES],
)
def test_the_claim_decision(
    store: WorkflowStore,  # noqa: F811
    case: str,
    fields: dict[str, Any],
    run_status: str,
    paused: bool,
    pausable: bool,
    verdict: Verdict,
    won: bool,
    after: tuple[str, int],
    history: list[str],
) -> None:
    now = timezone.now()
    fields = dict(fields)
    due, lease = fields.pop("due", None), fields.pop("lease", "none")
    attempts = fields.pop("attempts", [])
    if due is not None:
        fields["available_at"] = now + timedelta(seconds=due)
    store_now = store_now_ms(store.using)
    fields["lease_expires_at"] = {"lapsed": store_now - 60_000, "live": store_now + 60_000}.get(
        lease
    )
    step = _step(store, _run(store, status=run_status), **fields)
    for n, status in enumerate(attempts, start=1):
        StepAttempt.objects.using(store.using).create(step=step, attempt=n, status=status)
    # Every attempt began a minute ago.
    StepAttempt.objects.using(store.using).update(started_at=now - timedelta(seconds=60))
    if paused:
        QueuePause.objects.using(store.using).create(queue=step.queue)
    read = WorkflowStep.objects.using(store.using).annotate(store_now=EpochMs()).get(id=step.id)
    with store.atomic():
        got = store.decide_claim(read, lease_ms=30_000, worker="w", pausable=pausable, now=now)
    assert (got.verdict, got.won) == (verdict, won), case
    row = WorkflowStep.objects.using(store.using).get(id=step.id)
    assert (row.status, row.attempt) == after, case
    rows = StepAttempt.objects.using(store.using).filter(step_id=step.id).order_by("attempt")
    assert [a.status for a in rows] == history, case
    if verdict is Verdict.CLAIM and won:
        assert got.attempt + 1 == row.attempt
        assert got.reclaimed == (fields["status"] == StepStatus.RUNNING)
        assert got.started_at == rows.last().started_at  # type: ignore[union-attr]
        assert row.lease_expires_at > store_now_ms(store.using)
    if verdict is Verdict.EXPIRED:
        assert row.error["type"].endswith(".WorkflowStepLeaseExpiredError")
        assert rows.last().error == row.error  # type: ignore[union-attr]


def _numbered(sql: str) -> str:
    n = 0
    while "%s" in sql:
        n += 1
        sql = sql.replace("%s", f"${n}", 1)
    return sql


@pytest.mark.parametrize("vendor", [pytest.param("postgres", marks=db_mark("postgres"))])
def test_every_named_postgresql_statement_is_prepared_by_the_server(vendor: str) -> None:
    alias = database_alias(vendor)
    shapes = {name: statement(name) for name in BUILDERS}
    for served in (False, True):
        for excluding in (False, True):
            shapes[f"unlimited_claim({served}, {excluding})"] = unlimited_claim(
                served, excluding, 10
            )
    problems = []
    prepared = set()
    with connections[alias].cursor() as cursor:
        for name, sql in shapes.items():
            try:
                with transaction.atomic(using=alias):
                    cursor.execute(f"PREPARE pikku_checked AS {_numbered(sql)}")
                    cursor.execute(
                        "SELECT cardinality(parameter_types) FROM pg_prepared_statements "
                        "WHERE name = 'pikku_checked'"
                    )
                    assert cursor.fetchone()[0] == sql.count("%s"), name
                    cursor.execute("DEALLOCATE pikku_checked")
                prepared.add(name)
            except DatabaseError as exc:
                problems.append(f"{name}: {exc}")
    assert problems == [], "\n".join(problems)
    assert {"claim_step", "settle", "finish_run", "start_run"} <= prepared
    assert len(prepared) == len(BUILDERS) + 4


@pytest.mark.parametrize("vendor", [pytest.param("mariadb", marks=db_mark("mariadb"))])
def test_every_named_mariadb_statement_is_prepared_by_the_server(vendor: str) -> None:
    from pikku_django.workflows.store import mysql_sql

    alias = database_alias(vendor)
    with connections[alias].cursor() as cursor:
        for name in mysql_sql.BUILDERS:
            cursor.execute(
                "PREPARE pikku_checked FROM %s", [mysql_sql.statement(name).replace("%s", "?")]
            )
            cursor.execute("DEALLOCATE PREPARE pikku_checked")
