"""Worker heartbeats: record_heartbeat, the helpers around it, and their admin list."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from pikku_django.heartbeats import is_alive, prune_heartbeats, recent_workers, record_heartbeat
from pikku_django.models import WorkerHeartbeat


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# -- heartbeats --------------------------------------------------------------------------


@pytest.mark.django_db
def test_record_heartbeat_creates_then_updates_one_row_per_worker() -> None:
    t0 = timezone.now() - timedelta(minutes=30)
    first = record_heartbeat("web-1:42", queues=["b", "a", "a"], concurrency=8, now=t0)
    assert (first.queues, first.concurrency, first.running) == (["a", "b"], 8, 0)
    assert first.started_at == first.seen_at == t0
    assert first.pid
    assert first.hostname
    assert first.version
    later = record_heartbeat("web-1:42", queues=["a"], concurrency=8, running=3)
    assert WorkerHeartbeat.objects.count() == 1
    assert later.started_at == t0
    assert later.seen_at > t0
    assert later.running == 3
    assert is_alive(later)
    stopped = record_heartbeat("web-1:42", queues=["a"], concurrency=8, stopping=True)
    assert stopped.stopped_at is not None
    assert not is_alive(stopped)
    record_heartbeat("web-1:42", queues=["a"], concurrency=8)  # started again
    assert WorkerHeartbeat.objects.get().stopped_at is None
    record_heartbeat("old:1", queues=[], concurrency=1, now=t0 - timedelta(days=2))
    assert [w.worker_id for w in recent_workers()] == ["web-1:42"]
    assert prune_heartbeats() == 1
    assert not is_alive(
        record_heartbeat("quiet:1", queues=[], concurrency=1, now=t0), now=timezone.now()
    )


@pytest.mark.parametrize(
    ("worker", "kwargs", "message"),
    [
        ("", {"concurrency": 1}, "worker_id"),
        ("w", {"concurrency": 0}, "concurrency"),
        ("w", {"concurrency": 1, "running": -1}, "running"),
    ],
)
@pytest.mark.django_db
def test_record_heartbeat_refuses_bad_input(worker: str, kwargs: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        record_heartbeat(worker, queues=[], **kwargs)
    assert WorkerHeartbeat.objects.count() == 0


@pytest.mark.django_db
def test_the_heartbeat_list_shows_each_worker_and_whether_it_is_alive(
    admin_client: Client,
) -> None:
    record_heartbeat("live:1", queues=["fast", "slow"], concurrency=4, running=2)
    record_heartbeat("gone:2", queues=["fast"], concurrency=1, stopping=True)
    record_heartbeat(
        "quiet:3", queues=["fast"], concurrency=1, now=timezone.now() - timedelta(minutes=5)
    )
    page = text(admin_client.get(reverse("admin:pikku_django_workerheartbeat_changelist")))
    assert "fast, slow" in page
    for worker, badge in (("live:1", "alive"), ("gone:2", "stopped"), ("quiet:3", "silent")):
        row = page[page.index(f">{worker}<") :]
        assert f">{badge}</span>" in row[: row.index("</tr>")]
    assert 'name="_save"' not in page
