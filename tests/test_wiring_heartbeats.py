"""Workers record their heartbeats; pikku_prune removes those of workers long gone."""

from __future__ import annotations

import signal
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from pikku_django.heartbeats import is_alive, recent_workers, record_heartbeat
from pikku_django.models import WorkerHeartbeat
from pikku_django.workflows import WorkflowEngine
from pikku_django.workflows.worker._heartbeat import WorkerHeartbeats
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases
from tests.test_worker import finish, wait_for, worker_process


@on_databases("postgres")
def test_a_worker_process_shows_up_alive_then_stopped_after_sigterm(vendor: str) -> None:
    alias = database_alias(vendor)
    proc = worker_process(alias, "--concurrency", "2", "--queue", "beats")
    try:
        wait_for(lambda: recent_workers(using=alias).exists(), 60, "the worker's heartbeat")
        row = recent_workers(using=alias).get()
        assert row.pid == proc.pid
        assert row.queues == ["beats"]
        assert row.concurrency == 2
        assert row.running == 0
        assert is_alive(row)
    finally:
        proc.send_signal(signal.SIGTERM)
        code, out = finish(proc, 60)
    assert code == 0, out
    row.refresh_from_db(using=alias)
    assert row.stopped_at is not None
    assert not is_alive(row)


@pytest.mark.django_db(transaction=True)
def test_an_in_process_worker_records_start_and_stop() -> None:
    worker = Worker(WorkflowEngine(), concurrency=1, until_idle=True, idle_grace=0.1)
    worker.run()
    row = WorkerHeartbeat.objects.get(worker_id=worker.name)
    assert row.stopped_at is not None
    assert row.started_at <= row.stopped_at


@pytest.mark.django_db(transaction=True)
def test_a_failed_heartbeat_write_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    beats = WorkerHeartbeats("w", queues=(), concurrency=1, using="no-such-alias")
    assert beats.beat(0) is False
    assert "could not record its heartbeat" in caplog.text
    assert not beats.due()


@pytest.mark.django_db
def test_pikku_prune_deletes_the_heartbeats_of_workers_long_gone() -> None:
    record_heartbeat("gone", queues=[], concurrency=1, now=timezone.now() - timedelta(days=40))
    record_heartbeat("here", queues=[], concurrency=1)
    out = StringIO()
    call_command("pikku_prune", "--older-than", "30d", "--dry-run", stdout=out)
    assert "Would delete 1 heartbeats of workers" in out.getvalue()
    assert WorkerHeartbeat.objects.count() == 2
    out = StringIO()
    call_command("pikku_prune", "--older-than", "30d", stdout=out)
    assert "Deleted 1 heartbeats of workers" in out.getvalue()
    assert list(WorkerHeartbeat.objects.values_list("worker_id", flat=True)) == ["here"]
