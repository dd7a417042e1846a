"""The admin's queues page and the runs' scheduling columns (queue, priority, key,
start time), through Django's test client on the default (SQLite) database."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from pikku_django.dbclock import process_now_ms
from pikku_django.models import QueueClaim, RunStatus, StepKind, StepStatus
from tests.factories import WorkflowRunFactory, WorkflowStepFactory

QUEUES = "admin:pikku_django_workflowrun_queues"
RUNS = "admin:pikku_django_workflowrun_changelist"
LIMITS = {"reports": {"concurrency": 2, "rate": "10/1m", "lease_ms": 90_000}}


def _page(client: Client, name: str, *args: Any) -> str:
    response = client.get(reverse(name, args=args))
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def _row(page: str, attr: str, value: str) -> str:
    found = re.search(rf'<tr {attr}="{re.escape(value)}">(.*?)</tr>', page, re.S)
    assert found, f"no row {attr}={value!r}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(1))).strip()


@pytest.mark.django_db
def test_the_queues_page_shows_running_waiting_and_limits(
    admin_client: Client, settings: Any
) -> None:
    settings.PIKKU = {"QUEUES": LIMITS}
    run = WorkflowRunFactory(status=RunStatus.RUNNING)
    now = timezone.now()
    for n, status in enumerate(["running", "scheduled", "scheduled", "succeeded"]):
        WorkflowStepFactory(
            run=run,
            name=f"s{n}",
            kind=StepKind.QUEUED,
            queue="reports",
            status=status,
            available_at=now - timedelta(seconds=30),
            lease_expires_at=process_now_ms() + 60_000 if status == StepStatus.RUNNING else None,
        )
    QueueClaim.objects.create(queue="reports", slot=0, claimed_ms=process_now_ms())
    QueueClaim.objects.create(queue="reports", slot=1, claimed_ms=0)  # long out of the period
    for n in range(3):
        WorkflowRunFactory(concurrency_key="acct-9", key_waiting=n > 0)
    page = _page(admin_client, QUEUES)
    row = _row(page, "data-queue", "reports")
    assert row.split(" ")[:3] == ["reports", "1", "2"]  # one running, two waiting
    assert "1 of 10 per 1 min" in row
    assert "1 min 30 s" in row  # the queue's lease
    assert " 2 " in f" {row} "  # its concurrency
    assert _row(page, "data-key", "acct-9") == "acct-9 1 2 1"


@pytest.mark.django_db
def test_the_queues_page_is_linked_from_the_runs_list_and_the_dashboard(
    admin_client: Client,
) -> None:
    url = reverse(QUEUES)
    assert url in _page(admin_client, RUNS)
    assert url in _page(admin_client, "admin:pikku_django_workflowrun_dashboard")
    assert "No run with a concurrency key" in _page(admin_client, QUEUES)


@pytest.mark.django_db
def test_the_queues_page_needs_the_view_permission(django_user_model: Any) -> None:
    user = django_user_model.objects.create_user(
        f"staff-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True
    )
    client = Client()
    client.force_login(user)
    assert client.get(reverse(QUEUES)).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    assert client.get(reverse(QUEUES)).status_code == 200


@pytest.mark.django_db
def test_runs_show_their_queue_priority_key_and_start_time(admin_client: Client) -> None:
    start = timezone.now() + timedelta(hours=2)
    run = WorkflowRunFactory(
        queue="reports",
        priority=42,
        start_at=start,
        concurrency_key="acct-7",
        concurrency_limit=3,
        key_waiting=True,
    )
    listing = _page(admin_client, RUNS)
    for text in ("reports", "42", "acct-7 (waiting)"):
        assert text in listing
    assert "By waiting for its key" in listing  # the filter
    page = _page(admin_client, "admin:pikku_django_workflowrun_change", run.pk)
    for text in ("Scheduling", "reports", "42", "acct-7", "Concurrency limit"):
        assert text in page
    keyed = admin_client.get(reverse(RUNS), {"key_waiting__exact": "1"})
    assert keyed.status_code == 200
    assert str(run.pk)[:8] in keyed.content.decode()
