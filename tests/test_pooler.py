"""Through a real PgBouncer, in transaction mode and in session mode.

``PIKKU["DATABASE_POOLING"]`` states the pooler in front of the database. Behind the
transaction pooler (which here hands each transaction to its server connections in
turn) pikku_django keeps nothing in a server session: starts, claims, settles and
leases run without prepared statements, so nothing fails on the next session. The
store scenario table and the lease contract run through each pooler; the worker
process tests are in ``test_pooler_workers.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core import checks
from django.db import connections
from django.test import override_settings

from pikku_django.leases import LeaseService
from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.pooling import Pooling, keeps_sessions, pooling_of
from pikku_django.testing.leases import LeaseServiceContract, StoreClockLeaseContract
from pikku_django.workflows import WorkflowEngine, start_workflow
from pikku_django.workflows.store import WorkflowStore
from pikku_django.workflows.store.postgresql import PostgresStore
from tests.conftest import fresh_database_lease_service
from tests.pgbouncer import Pooler, open_server_sessions, pooled_mark
from tests.test_workflow_store import (  # the scenario table, on the `store` fixture below
    test_a_claim_is_one_guarded_update_of_a_running_runs_step,  # noqa: F401
    test_a_settle_is_fenced_by_its_attempt_and_claim,  # noqa: F401
    test_claiming_due_runs,  # noqa: F401
    test_creating_runs_links_a_taken_key_to_its_run,  # noqa: F401
    test_finishing_a_run_in_one_statement_leaves_a_waiting_parent_to_the_caller,  # noqa: F401
    test_inserting_a_claimed_step,  # noqa: F401
    test_inserting_a_settled_step,  # noqa: F401
    test_the_stalled_sweep_wakes_only_runs_with_nothing_in_flight,  # noqa: F401
    test_what_falls_due_next,  # noqa: F401
    test_what_is_ready_to_claim,  # noqa: F401
    test_work_pending_sees_due_runs_and_steps,  # noqa: F401
)
from tests.testapp.models import Effect

pytestmark = pooled_mark()


@pytest.fixture
def store(pooled: Pooler) -> WorkflowStore:
    """The scenario table's store on the pooled alias: PostgreSQL's own, whose hot
    statements are the ones prepared without a pooler (the ORM store's are Django's)."""
    return PostgresStore(pooled.alias)


def server_sessions(pooler: Pooler, statements: int) -> set[int]:
    """The server sessions ``statements`` autocommit statements on one connection to
    ``pooler`` ran on."""
    with connections[pooler.alias].cursor() as cursor:
        pids = set()
        for _ in range(statements):
            cursor.execute("SELECT pg_backend_pid()")
            pids.add(int(cursor.fetchone()[0]))
        return pids


def test_a_transaction_pooler_moves_a_connection_between_server_sessions(
    pooled: Pooler,
) -> None:
    """What the other tests stand on: behind the transaction pooler one connection's
    transactions run on several server sessions; behind the session pooler on one."""
    open_server_sessions(connections[pooled.alias].settings_dict, 4)
    pids = server_sessions(pooled, 8)
    assert (len(pids) > 1) == (pooled.mode == "transaction"), pids
    assert keeps_sessions(pooled.alias) == (pooled.mode == "session")
    assert pooling_of(pooled.alias) == Pooling(pooled.mode)
    assert pooling_of("postgres") is Pooling.NONE


def test_starting_and_running_workflows_through_the_pooler(pooled: Pooler) -> None:
    """Without the setting the transaction pooler fails these starts: a statement
    prepared on one server session is run on another ("prepared statement "_pg3_0"
    does not exist")."""
    alias = pooled.alias
    runs = [
        start_workflow(
            "testapp.three_records", {"db": alias, "run": f"r{n}"}, idempotency_key=f"k{n}"
        )
        for n in range(12)
    ]
    again = start_workflow(
        "testapp.three_records", {"db": alias, "run": "r0"}, idempotency_key="k0"
    )
    assert again.id == runs[0].id
    WorkflowEngine(alias).run_until_idle()
    states = dict(WorkflowRun.objects.using(alias).values_list("id", "status"))
    assert states == {run.id: RunStatus.COMPLETED for run in runs}
    effects = Effect.objects.using(alias).values_list("run_id", "step")
    assert sorted(effects) == sorted((f"r{n}", s) for n in range(12) for s in "abc")


def test_the_lease_connections_prepare_nothing_behind_a_transaction_pooler(
    pooled: Pooler,
) -> None:
    service = fresh_database_lease_service(pooled.alias)
    try:
        tokens = []
        for n in range(10):  # enough uses for psycopg to prepare, if it were to
            lease = service.acquire("pooled-key", f"h{n}", 60_000)
            assert lease is not None
            tokens.append(lease.token)
            assert service.refresh(lease, 60_000) is not None
            assert service.release(lease)
        assert tokens == sorted(set(tokens))
        with service._pool.connection() as conn:
            threshold = conn.connection.prepare_threshold
        assert (threshold is None) == (pooled.mode == "transaction")
    finally:
        service.close()


@pooled_mark(transaction=False)  # the lease connections commit on their own
class TestLeasesThroughThePooler(LeaseServiceContract, StoreClockLeaseContract):
    """The lease contract on the pooled database, in each mode."""

    @pytest.fixture
    def lease_service(self, pooled: Pooler) -> Iterator[LeaseService]:
        service = fresh_database_lease_service(pooled.alias)
        yield service
        service.close()


def pooling_messages(pooling: dict[str, object], **database: object) -> list[checks.CheckMessage]:
    """What the pooling check says with ``pooling``, and ``database`` added to
    ``DATABASES["postgres"]``."""
    from django.conf import settings

    databases = {**settings.DATABASES}
    databases["postgres"] = {**databases["postgres"], **database}
    with override_settings(DATABASES=databases, PIKKU={"DATABASE_POOLING": pooling}):
        found = checks.run_checks()
    return [m for m in found if "DATABASE_POOLING" in m.msg]


@pytest.mark.django_db(databases=["default", "postgres"])
def test_the_check_reports_inconsistent_pooling_settings() -> None:
    from tests.conftest import require_service

    require_service("postgres")
    ok = pooling_messages({"postgres": "transaction"}, DISABLE_SERVER_SIDE_CURSORS=True)
    assert ok == []
    assert pooling_messages({"postgres": "session"}) == []
    assert [m.id for m in pooling_messages({"postgres": "transaction"})] == ["pikku_django.E512"]
    assert [m.id for m in pooling_messages({"default": "transaction"})] == ["pikku_django.W510"]
    assert [m.id for m in pooling_messages({"nowhere": "session"})] == ["pikku_django.E511"]
    assert [m.id for m in pooling_messages({"postgres": "statement"})] == ["pikku_django.E511"]
    prepares = pooling_messages(
        {"postgres": "transaction"},
        DISABLE_SERVER_SIDE_CURSORS=True,
        OPTIONS={"server_side_binding": True, "prepare_threshold": 5},
    )
    assert [m.id for m in prepares] == ["pikku_django.W511"]
    assert pooling_messages({"postgres": "none"}) == []
