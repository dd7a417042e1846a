"""A PostgreSQL cluster the test starts itself, restarted mid-run behind PgBouncer.

Two ``pikku_worker`` processes reach a private cluster (``tests/pg_clusters.py``) only
through a PgBouncer in front of it, in transaction mode and in session mode. While they
run two-step runs the cluster is restarted (``pg_ctl restart -m fast``, which ends every
server session): the pooler reconnects, the workers carry on, and every run completes
with each step succeeded by exactly one attempt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, connections

from pikku_django.models import (
    AttemptStatus,
    RunStatus,
    StepAttempt,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows import WorkflowEngine
from tests import pgbouncer
from tests.pg_clusters import Cluster, private_cluster, require_clusters
from tests.test_worker import ROOT, finish, wait_for

# A cluster and two poolers of its own: the main job runs it, the newest-Django job not.
# No django_db mark: the test's database is the cluster's, which no test case wraps
# (the fixture below lets the test reach databases).
pytestmark = [pytest.mark.once, pytest.mark.long]

ALIAS = "pooled_restart"
DATABASE = "pikku_restart"
RUNS = 12


@pytest.fixture
def cluster(django_db_setup: None, django_db_blocker: Any) -> Iterator[Cluster]:
    require_clusters()
    if pgbouncer.executable() is None:
        from tests.conftest import skip_unless_ci

        skip_unless_ci(pgbouncer.ENABLE)
    with django_db_blocker.unblock(), private_cluster("pooled") as pg:
        pg.execute(f'CREATE DATABASE "{DATABASE}"')
        yield pg


def _environ(pooler: pgbouncer.Pooler) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.pooler_worker_settings",
        "PIKKU_TEST_ALIAS": ALIAS,
        "PIKKU_TEST_DB_NAME": DATABASE,
        "PIKKU_TEST_DEFAULT_NAME": str(connections["default"].settings_dict["NAME"]),
        "PIKKU_TEST_POOLER_PORT": str(pooler.port),
        "PIKKU_TEST_POOLER_MODE": pooler.mode,
        "PIKKU_TEST_STEP_LEASE_MS": "3000",
        "PIKKU_TEST_RUN_LEASE_MS": "3000",
        "PIKKU_TEST_POLL": "0.1",
    }


def _django(pooler: pgbouncer.Pooler, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=_environ(pooler),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def pooled_cluster(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[pgbouncer.Pooler]:
    """A pooler in front of the cluster, its database migrated, and an alias to it."""
    mode = request.param
    server = {"HOST": "127.0.0.1", "PORT": cluster.port, "USER": "postgres"}
    pooler = pgbouncer.start(mode, server)
    try:
        code, out = finish(_django(pooler, "migrate", "--database", ALIAS, "-v", "0"), 300)
        assert code == 0, out
        entry = pgbouncer.pooled_settings({**pgbouncer.POSTGRESQL, "NAME": DATABASE}, pooler.port)
        default = dict(connections["default"].settings_dict)
        entry = connections.configure_settings({"default": default, ALIAS: entry})[ALIAS]
        settings.DATABASES[ALIAS] = connections.settings[ALIAS] = entry
        yield pooler
    finally:
        if ALIAS in connections.settings:
            connections[ALIAS].close()
            del connections[ALIAS]
        settings.DATABASES.pop(ALIAS, None)
        connections.settings.pop(ALIAS, None)
        pooler.stop()


def _completed() -> int:
    """Runs completed; -1 while the pooler answers with an error (the server restarting:
    the workers' own errors are what the test is about, not the test's reads)."""
    try:
        return WorkflowRun.objects.using(ALIAS).filter(status=RunStatus.COMPLETED).count()
    except DatabaseError:
        connections[ALIAS].close()
        return -1


@pytest.mark.parametrize("pooled_cluster", pgbouncer.MODES, indirect=True)
def test_runs_complete_across_a_restart_of_the_cluster(
    pooled_cluster: pgbouncer.Pooler, cluster: Cluster, tmp_path: Path, settings: Any
) -> None:
    settings.PIKKU = pgbouncer.pooled_pikku(ALIAS, pooled_cluster.mode)
    engine = WorkflowEngine(ALIAS)
    runs = [
        engine.start("testapp.slow_twice", {"started": str(tmp_path / f"r{n}"), "seconds": 0.3})
        for n in range(RUNS)
    ]
    first_start = cluster.scalar("SELECT pg_postmaster_start_time()")
    workers = [_django(pooled_cluster, "pikku_worker", "--concurrency", "2") for _ in "ab"]
    try:
        wait_for(lambda: _completed() >= 1, 180, "a run completed before the restart")
        completed_before = _completed()
        cluster.restart("fast")  # every server session ends, in-flight steps' too
        connections[ALIAS].close()
        assert cluster.scalar("SELECT pg_postmaster_start_time()") > first_start
        wait_for(lambda: _completed() == RUNS, 240, "every run completed after the restart")
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        outputs = [finish(proc, 60)[1] for proc in workers]
    assert completed_before < RUNS, "every run completed before the restart"
    steps = WorkflowStep.objects.using(ALIAS).filter(run_id__in=[r.id for r in runs])
    assert steps.count() == 2 * RUNS
    assert set(steps.values_list("status", flat=True)) == {StepStatus.SUCCEEDED}, outputs
    succeeded = StepAttempt.objects.using(ALIAS).filter(status=AttemptStatus.SUCCEEDED)
    per_step = list(succeeded.values_list("step_id", flat=True))
    assert sorted(per_step) == sorted(steps.values_list("id", flat=True))  # once each
