"""Real worker processes whose database connections go through the fault proxy, on
PostgreSQL and MariaDB: the database is away for 30 s, or stops answering past the
step lease. The worker lives through it and carries on, and every guarantee of the
chaos test holds: every run completes, every stored result comes from the attempt
that succeeded, and every transactional step's effect happened exactly once.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connections
from django.utils import timezone

from pikku_django.models import RunStatus, StepAttempt, WorkflowRun
from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases
from tests.faultproxy import FaultProxy
from tests.test_chaos import problems_in, running_in
from tests.test_worker import wait_for, worker_process

pytestmark = [pytest.mark.once, pytest.mark.long]

LEASE_MS = 3_000
RUNS = 8
#: The outage the issue asks a worker to live through.
OUTAGE_S = 30
#: Past the step lease, so another worker takes the stalled one's step over.
STALL_S = LEASE_MS / 1000 + 3
URL_VARIABLES = {"postgres": "PIKKU_TEST_POSTGRES_URL", "mariadb": "PIKKU_TEST_MARIADB_URL"}


class Worker:
    """A pikku_worker process whose output is read as it comes (an outage makes it
    log more than a pipe holds)."""

    def __init__(self, alias: str, vendor: str, proxy: FaultProxy | None = None) -> None:
        env = {
            "DJANGO_SETTINGS_MODULE": "tests.chaosapp.worker_settings",
            "PIKKU_TEST_STEP_LEASE_MS": str(LEASE_MS),
            "PIKKU_TEST_POLL": "0.2",
        }
        if proxy is not None:
            env[URL_VARIABLES[vendor]] = proxied_url(vendor, proxy.port)
        self.proc: subprocess.Popen[str] = worker_process(alias, "--concurrency", "2", **env)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> tuple[int, str]:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(10)
        return code, "".join(self.lines[-200:])


def proxied_url(vendor: str, port: int) -> str:
    """The service's URL with its host and port replaced by the proxy's."""
    url = urlsplit(settings.SERVICE_URLS[vendor])
    auth = url.netloc.rpartition("@")[0]
    return url._replace(netloc=f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}").geturl()


@pytest.fixture
def proxy_for() -> Iterator[Any]:
    proxies: list[FaultProxy] = []

    def make(vendor: str) -> FaultProxy:
        url = urlsplit(settings.SERVICE_URLS[vendor])
        proxies.append(FaultProxy(url.hostname or "127.0.0.1", url.port or 0).start())
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


def start_runs(alias: str, seed: int) -> list[Any]:
    rng = random.Random(seed)
    engine = WorkflowEngine(alias)
    return [
        engine.start(
            "chaosapp.chaos", {"db": alias, "ms": [rng.randint(100, 300) for _ in range(5)]}
        ).id
        for _ in range(RUNS)
    ]


def all_ended(alias: str, run_ids: list[Any]) -> bool:
    return (
        not WorkflowRun.objects.using(alias)
        .filter(id__in=run_ids, status=RunStatus.RUNNING)
        .exists()
    )


@on_databases("postgres", "mariadb")
def test_worker_rides_out_a_30s_database_outage(vendor: str, proxy_for: Any) -> None:
    alias = database_alias(vendor)
    proxy = proxy_for(vendor)
    worker = Worker(alias, vendor, proxy)
    try:
        run_ids = start_runs(alias, 14)
        wait_for(lambda: running_in(alias, worker.pid), 60, "the worker to run a step")
        proxy.outage()
        deadline = time.monotonic() + OUTAGE_S
        while time.monotonic() < deadline:
            assert worker.alive(), "the worker died in the outage"
            time.sleep(0.5)
        accepted = proxy.accepted
        proxy.restore()
        wait_for(lambda: all_ended(alias, run_ids), 60, "every run to end after the outage")
        assert worker.alive(), "the worker died after the outage"
    finally:
        code, out = worker.stop()
    assert problems_in(alias, run_ids) == [], out
    assert proxy.accepted > accepted, "the worker never reconnected"
    assert code == 0, out


@on_databases("postgres", "mariadb")
def test_worker_carries_on_after_its_connection_stalls(vendor: str, proxy_for: Any) -> None:
    alias = database_alias(vendor)
    proxy = proxy_for(vendor)
    stalled = Worker(alias, vendor, proxy)
    other = Worker(alias, vendor)  # straight to the database: takes the stalled steps over
    try:
        run_ids = start_runs(alias, 15)
        wait_for(lambda: running_in(alias, stalled.pid), 60, "the proxied worker to run a step")
        proxy.slow(0.02)  # a slow network first: everything still works, later
        time.sleep(1)
        proxy.stall()
        time.sleep(STALL_S)
        assert stalled.alive(), "the stalled worker died"
        proxy.restore()
        restored_at = timezone.now()
        wait_for(lambda: all_ended(alias, run_ids), 60, "every run to end after the stall")
        # The stalled worker is back at work: it claims steps again.
        more = start_runs(alias, 16)
        wait_for(lambda: all_ended(alias, more), 60, "the second batch to end")
        assert stalled.alive()
        assert other.alive()
    finally:
        outputs = [w.stop()[1] for w in (stalled, other)]
    assert problems_in(alias, run_ids + more) == [], outputs
    after = StepAttempt.objects.using(alias).filter(
        worker__contains=f":{stalled.pid}:", started_at__gt=restored_at
    )
    assert after.exists(), f"the stalled worker did no work after the stall:\n{outputs[0]}"


@on_databases("postgres")
def test_worker_listens_again_once_its_session_is_ended(vendor: str) -> None:
    alias = database_alias(vendor)
    worker = Worker(alias, vendor)
    try:
        wait_for(lambda: len(listeners(alias)) == 1, 60, "the worker to listen")
        (session,) = listeners(alias)
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [session])
        wait_for(
            lambda: len(listeners(alias)) == 1 and session not in listeners(alias),
            30,
            "the worker to listen on a new session",
        )
        run_ids = start_runs(alias, 17)
        wait_for(lambda: all_ended(alias, run_ids), 60, "the runs to end")
        assert worker.alive()
    finally:
        code, out = worker.stop()
    assert problems_in(alias, run_ids) == [], out
    assert code == 0, out


def listeners(alias: str) -> set[int]:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query ILIKE 'LISTEN pikku_work%%'"
        )
        return {int(row[0]) for row in cursor.fetchall()}
