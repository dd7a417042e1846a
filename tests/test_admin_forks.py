"""The run page's "Re-run from this step": offered per step of a finished run to those
who may change runs, confirmed (CSRF-checked) before the fork starts, logged on the
original; the fork's page names its original and the original lists its forks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from pikku_django.models import RunStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows.api import get_engine, reset_engine
from tests.fork_defs import CALLS, ORDER


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    reset_engine()
    CALLS.clear()
    yield
    reset_engine()


def client_for(django_user_model: Any, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(
        f"op-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True
    )
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def page_of(run: WorkflowRun) -> str:
    return reverse("admin:pikku_django_workflowrun_change", args=[run.pk])


def fork_url(run: WorkflowRun, name: str) -> str:
    step = WorkflowStep.objects.get(run_id=run.pk, name=name)
    return reverse("admin:pikku_django_workflowrun_fork", args=[run.pk, step.pk])


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def finished_order() -> WorkflowRun:
    engine = get_engine()
    run = engine.start(ORDER, {"n": 2})
    engine.run_until_idle()
    engine.events.send(run.id, "approve", {"by": "ada"})
    engine.run_until_idle()
    return engine.get_run(run.id)


@pytest.mark.django_db(transaction=True)
def test_rerun_from_a_step_confirms_forks_logs_and_links(admin_client: Client) -> None:
    original = finished_order()
    page = text(admin_client.get(page_of(original)))
    assert page.count("Re-run from this step") == 6  # one per step of the steps table
    assert f'href="{fork_url(original, "child")}"' in page

    confirm = text(admin_client.get(fork_url(original, "child")))
    assert "Re-run this run from step “child”?" in confirm
    assert "Kept, not run again (3 steps)" in confirm
    assert "Run again (3 steps): whatever they do happens again" in confirm
    assert "csrfmiddlewaretoken" in confirm
    assert not WorkflowRun.objects.filter(forked_from=original).exists()  # GET changes nothing

    done = admin_client.post(fork_url(original, "child"))
    assert done.status_code == 302
    assert done["Location"] == page_of(original)
    fork = WorkflowRun.objects.get(forked_from=original)
    assert fork.forked_at_step == "child"
    messages = [str(m) for m in get_messages(done.wsgi_request)]
    assert messages == [
        f'Started a new run from step “child”: <a href="{page_of(fork)}"><code>{fork.pk}</code></a>'
    ]
    entry = LogEntry.objects.get(object_id=str(original.pk))
    assert entry.get_change_message() == (f"Forked from the admin at step child as run {fork.id}")

    fork_page = text(admin_client.get(page_of(fork)))
    assert "Forked from" in fork_page
    assert f'href="{page_of(original)}"' in fork_page
    assert "at step <strong>child</strong>" in fork_page
    assert "Re-run from this step" not in fork_page  # running: not offered yet
    assert fork_page.count("kept from the original run: not run here") == 3
    listing = text(admin_client.get(page_of(original)))
    assert 'id="pikku-fork-list"' in listing
    assert f'href="{page_of(fork)}"' in listing


@pytest.mark.django_db(transaction=True)
def test_rerun_needs_the_change_permission_and_a_csrf_token(django_user_model: Any) -> None:
    original = finished_order()
    viewer = client_for(django_user_model, "view_workflowrun")
    assert "Re-run from this step" not in text(viewer.get(page_of(original)))
    assert viewer.get(fork_url(original, "ship")).status_code == 403
    assert viewer.post(fork_url(original, "ship")).status_code == 403
    assert not WorkflowRun.objects.filter(forked_from=original).exists()

    operator = client_for(django_user_model, "view_workflowrun", "change_workflowrun")
    operator.handler.enforce_csrf_checks = True  # type: ignore[attr-defined]
    assert operator.post(fork_url(original, "ship")).status_code == 403  # no token
    assert not WorkflowRun.objects.filter(forked_from=original).exists()
    assert "Re-run from this step" in text(operator.get(page_of(original)))


@pytest.mark.django_db(transaction=True)
def test_a_refused_fork_says_why(admin_client: Client) -> None:
    engine = get_engine()
    running = engine.start(ORDER, {"n": 1})
    engine.run_until_idle()
    assert "Re-run from this step" not in text(admin_client.get(page_of(running)))
    response = admin_client.post(fork_url(running, "charge"))
    assert response.status_code == 302
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert len(said) == 1
    assert "cannot be forked" in said[0]
    assert "Cancel it first" in said[0]
    assert WorkflowRun.objects.get(pk=running.pk).status == RunStatus.RUNNING
    assert not WorkflowRun.objects.filter(forked_from=running).exists()
    other = finished_order()
    step = WorkflowStep.objects.get(run_id=other.pk, name="ship")
    wrong = reverse("admin:pikku_django_workflowrun_fork", args=[running.pk, step.pk])
    assert admin_client.get(wrong).status_code == 404  # a step of another run
