"""Pausing a queue from the admin's queues page (a confirmation, the runs' change
permission, CSRF), from ``manage.py pikku_queues``, and the pause shown on the queues
page and the dashboard; on the default (SQLite) database."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from pikku_django.models import QueuePause, RunStatus, StepKind
from pikku_django.workflows import pause_queue, paused_queues
from pikku_django.workflows.control._pause_conditions import paused_look
from tests.factories import WorkflowRunFactory, WorkflowStepFactory

QUEUES = "admin:pikku_django_workflowrun_queues"
PAUSE = "admin:pikku_django_workflowrun_queues_pause"
RESUME = "admin:pikku_django_workflowrun_queues_resume"
DASHBOARD = "admin:pikku_django_workflowrun_dashboard"


@pytest.fixture(autouse=True)
def _fresh_look() -> Iterator[None]:
    paused_look.forget()
    yield
    paused_look.forget()


def _run(*args: str) -> str:
    out = StringIO()
    call_command("pikku_queues", *args, stdout=out)
    return out.getvalue()


def _row(page: str, queue: str) -> str:
    found = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', page, re.S)
    assert found, f"no row for {queue!r}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(1))).strip()


def _staff(django_user_model: Any, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(
        f"staff-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True
    )
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def _token(client: Client, url: str) -> str:
    page = client.get(url).content.decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found, "no CSRF token on the confirmation page"
    return found.group(1)


# -- the command --------------------------------------------------------------------


@pytest.mark.django_db
def test_the_command_pauses_lists_and_resumes_a_queue() -> None:
    out = _run("pause", "reports", "--reason", "partner API down", "--by", "ops")
    assert out.strip() == "reports: paused"
    assert _run("pause", "reports").startswith("reports: already paused since ")
    [pause] = paused_queues()
    assert (pause.reason, pause.paused_by) == ("partner API down", "ops")
    table = _run("list")
    assert re.search(r"reports\s+yes\s+\S+\s+ops\s+partner API down", table), table
    [row] = json.loads(_run("list", "--json"))
    assert row["queue"] == "reports"
    assert row["paused"] is True
    assert row["reason"] == "partner API down"
    assert row["paused_at"] == pause.paused_at.isoformat()
    assert _run("resume", "reports").strip() == "reports: resumed"
    assert _run("resume", "reports").strip() == "reports: not paused"
    assert json.loads(_run("list", "--json")) == []


@pytest.mark.django_db
def test_the_command_records_who_ran_it_and_refuses_a_bad_name() -> None:
    _run("pause", "mail")
    [pause] = paused_queues()
    assert pause.paused_by.endswith("(pikku_queues)")
    with pytest.raises(CommandError, match="queue name"):
        _run("pause", "x" * 101)
    assert [p.queue for p in paused_queues()] == ["mail"]


def test_the_commands_help_explains_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        call_command("pikku_queues", "--help")
    out = capsys.readouterr().out
    for word in ("pause", "resume", "list", "claims", "restarts"):
        assert word in out
    with pytest.raises(SystemExit):
        call_command("pikku_queues", "pause", "--help")
    out = capsys.readouterr().out
    assert "--reason" in out
    assert "running finish" in out


# -- the admin ------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_queues_page_pauses_and_resumes_through_a_confirmation(
    django_user_model: Any,
) -> None:
    run = WorkflowRunFactory(status=RunStatus.RUNNING)
    WorkflowStepFactory(run=run, name="s", kind=StepKind.QUEUED, queue="reports")
    client = _staff(django_user_model, "view_workflowrun", "change_workflowrun")
    page = client.get(reverse(QUEUES)).content.decode()
    pause_url = f"{reverse(PAUSE)}?queue=reports"
    assert pause_url in page
    assert "paused" not in _row(page, "reports")

    confirm = client.get(pause_url)
    assert confirm.status_code == 200
    assert "Yes, pause" in confirm.content.decode()
    assert not QueuePause.objects.exists()  # nothing changes before the POST
    # The POST must carry the CSRF token.
    refused = client.post(reverse(PAUSE), {"queue": "reports", "reason": "x"})
    assert refused.status_code == 403
    assert not QueuePause.objects.exists()
    token = _token(client, pause_url)
    done = client.post(
        reverse(PAUSE),
        {"queue": "reports", "reason": "partner API down", "csrfmiddlewaretoken": token},
    )
    assert done.status_code == 302
    assert done["Location"] == reverse(QUEUES)
    [pause] = paused_queues()
    assert (pause.queue, pause.reason) == ("reports", "partner API down")
    assert pause.paused_by.startswith("staff-")

    row = _row(client.get(reverse(QUEUES)).content.decode(), "reports")
    assert "paused" in row
    assert "partner API down" in row
    assert pause.paused_by in row
    assert "Resume" in row
    token = _token(client, f"{reverse(RESUME)}?queue=reports")
    client.post(reverse(RESUME), {"queue": "reports", "csrfmiddlewaretoken": token})
    assert paused_queues() == []


@pytest.mark.django_db
def test_pausing_needs_the_change_permission(django_user_model: Any) -> None:
    WorkflowRunFactory(status=RunStatus.RUNNING)
    pause_queue("mail", reason="outage")
    viewer = _staff(django_user_model, "view_workflowrun")
    page = viewer.get(reverse(QUEUES)).content.decode()
    assert "paused" in _row(page, "mail")  # shown, but without the buttons
    assert reverse(RESUME) not in page
    assert reverse(PAUSE) not in page
    assert viewer.get(f"{reverse(PAUSE)}?queue=reports").status_code == 403
    token = viewer.cookies["csrftoken"].value if "csrftoken" in viewer.cookies else "t"
    answer = viewer.post(reverse(RESUME), {"queue": "mail", "csrfmiddlewaretoken": token})
    assert answer.status_code == 403
    assert [p.queue for p in paused_queues()] == ["mail"]


@pytest.mark.django_db
def test_the_dashboard_shows_a_paused_queue(admin_client: Client) -> None:
    pause_queue("partner-api", reason="deploy half done", paused_by="ops")
    row = _row(admin_client.get(reverse(DASHBOARD)).content.decode(), "partner-api")
    assert "paused" in row
    assert "ops" in row
    assert "deploy half done" in row
