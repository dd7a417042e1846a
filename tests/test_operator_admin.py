"""The operator's admin: steering a run from its page, the run list's columns, the
run tree, the dashboard (and its query count), worker heartbeats, and the source
page's Enable and Disable buttons. Driven through Django's test client."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pikku_django.admin.formatting import workflow_title
from pikku_django.heartbeats import record_heartbeat
from pikku_django.models import (
    RunStatus,
    StepKind,
    StepStatus,
    WorkflowRun,
)
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, on_databases
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory

RUNS = reverse("admin:pikku_django_workflowrun_changelist")
DASHBOARD = reverse("admin:pikku_django_workflowrun_dashboard")


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    reset_engine()
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


def steer(run: WorkflowRun, operation: str) -> str:
    return reverse("admin:pikku_django_workflowrun_steer", args=[run.pk, operation])


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def said(response: Any) -> list[tuple[str, str]]:
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def entries_for(obj: Any) -> list[LogEntry]:
    ct = ContentType.objects.get_for_model(type(obj))
    return list(
        LogEntry.objects.filter(content_type=ct, object_id=str(obj.pk)).order_by("action_time")
    )


def suspended_run(**extra: Any) -> WorkflowRun:
    run = WorkflowRunFactory(
        workflow="op-approval", status=RunStatus.SUSPENDED, suspend_reason="needs a nod", **extra
    )
    WorkflowStepFactory(
        run=run, name="suspend", kind=StepKind.SUSPEND, status=StepStatus.SUSPENDED, retries=0
    )
    return run


def status_of(run: WorkflowRun) -> str:
    return WorkflowRun.objects.get(pk=run.pk).status


# -- steering from the run page ----------------------------------------------------------


@pytest.mark.django_db
def test_the_run_page_offers_what_fits_the_status(admin_client: Client) -> None:
    suspended = suspended_run()
    failed = WorkflowRunFactory(status=RunStatus.FAILED)
    done = WorkflowRunFactory(status=RunStatus.COMPLETED, output={"ok": 1})
    page = text(admin_client.get(page_of(suspended)))
    assert 'id="pikku-steer-cancel"' in page
    assert 'id="pikku-steer-resume"' in page
    assert 'id="pikku-steer-retry"' not in page
    page = text(admin_client.get(page_of(failed)))
    assert 'id="pikku-steer-retry"' in page
    assert 'id="pikku-steer-cancel"' not in page
    page = text(admin_client.get(page_of(done)))
    assert "pikku-steer-" not in page
    # One status, in the heading, and the output once.
    assert page.count('id="pikku-run-status"') == 1
    assert 'class="pikku-badge pikku-badge-completed"' in page
    assert page.count("&quot;ok&quot;: 1") == 1


@pytest.mark.django_db
def test_resume_asks_for_json_refuses_bad_json_and_logs_who_and_what(
    admin_client: Client, admin_user: Any
) -> None:
    run = suspended_run()
    form = text(admin_client.get(steer(run, "resume")))
    assert 'name="data"' in form
    assert "needs a nod" in form

    bad = admin_client.post(steer(run, "resume"), {"data": "{approved: yes"})
    assert "Enter a valid JSON." in text(bad)
    assert status_of(run) == RunStatus.SUSPENDED
    assert entries_for(run) == []

    done = admin_client.post(steer(run, "resume"), {"data": '{"approved": true, "by": "ops"}'})
    assert done.status_code == 302
    assert done["Location"] == page_of(run)
    assert said(done) == [("success", f"Resumed run {run.pk}.")]
    assert status_of(run) == RunStatus.RUNNING
    [entry] = entries_for(run)
    assert entry.user_id == admin_user.pk
    assert entry.action_flag == CHANGE
    assert entry.change_message == (
        'Resumed from the admin with data: {"approved": true, "by": "ops"}'
    )
    step = run.steps.get(name="suspend")
    assert (step.status, step.result) == (StepStatus.SUCCEEDED, {"approved": True, "by": "ops"})
    history = text(
        admin_client.get(reverse("admin:pikku_django_workflowrun_history", args=[run.pk]))
    )
    assert "Resumed from the admin with data: {&quot;approved&quot;: true" in history
    assert admin_user.username in history


@pytest.mark.django_db
def test_empty_resume_data_is_null(admin_client: Client) -> None:
    run = suspended_run()
    assert admin_client.post(steer(run, "resume"), {"data": ""}).status_code == 302
    assert run.steps.get(name="suspend").result is None
    assert entries_for(run)[0].change_message == "Resumed from the admin with data: null"


@pytest.mark.django_db
def test_cancel_and_retry_confirm_then_act_and_log(admin_client: Client) -> None:
    run = WorkflowRunFactory(status=RunStatus.RUNNING)
    assert "Yes, cancel" in text(admin_client.get(steer(run, "cancel")))
    assert status_of(run) == RunStatus.RUNNING  # a GET only asks
    assert admin_client.post(steer(run, "cancel")).status_code == 302
    assert status_of(run) == RunStatus.CANCELLED
    assert [e.change_message for e in entries_for(run)] == ["Cancelled from the admin"]

    failed = WorkflowRunFactory(status=RunStatus.FAILED, error={"type": "X", "message": "y"})
    charge = WorkflowStepFactory(
        run=failed, name="charge", status=StepStatus.FAILED, attempt=1, retries=0
    )
    StepAttemptFactory(step=charge, attempt=1, status=StepStatus.FAILED)
    assert admin_client.post(steer(failed, "retry")).status_code == 302
    assert status_of(failed) == RunStatus.RUNNING
    assert [e.change_message for e in entries_for(failed)] == ["Retried from the admin"]


@pytest.mark.django_db
def test_an_operation_that_does_not_fit_is_refused_and_not_logged(admin_client: Client) -> None:
    run = WorkflowRunFactory(status=RunStatus.COMPLETED)
    response = admin_client.post(steer(run, "resume"), {"data": "1"})
    assert response.status_code == 302
    assert said(response) == [("error", "This run is completed: it cannot be resumed.")]
    assert entries_for(run) == []
    assert admin_client.get(steer(run, "explode")).status_code == 404
    assert admin_client.get(steer(WorkflowRun(id=uuid.uuid4()), "cancel")).status_code == 404


@pytest.mark.django_db
def test_view_only_users_see_no_buttons_and_are_refused(django_user_model: Any) -> None:
    run = suspended_run()
    client = client_for(django_user_model, "view_workflowrun")
    page = text(client.get(page_of(run)))
    assert "pikku-steer-" not in page
    for operation in ("cancel", "resume", "retry"):
        assert client.get(steer(run, operation)).status_code == 403
        assert client.post(steer(run, operation), {"data": "1"}).status_code == 403
    assert status_of(run) == RunStatus.SUSPENDED
    assert entries_for(run) == []


def live_parts(run: WorkflowRun) -> str:
    return reverse("admin:pikku_django_workflowrun_live", args=[run.pk])


def tree_entry(parts: str, run: WorkflowRun) -> str:
    """The tree's line for ``run`` (up to its children)."""
    entry = parts[parts.index(f'data-run="{run.pk}"') :]
    return entry[: entry.index("</li>")]


@pytest.mark.django_db
def test_the_live_parts_follow_the_runs_state_and_the_users_permissions(
    admin_client: Client, django_user_model: Any
) -> None:
    parent = WorkflowRunFactory(workflow="op-parent")
    child = WorkflowRunFactory(workflow="op-child", status=RunStatus.SUSPENDED)
    WorkflowStepFactory(run=parent, name="kid", kind=StepKind.CHILD, child_run=child)
    url = live_parts(parent)
    assert f'data-parts-url="{url}"' in text(admin_client.get(page_of(parent)))
    parts = text(admin_client.get(url))
    assert 'id="pikku-steer-cancel"' in parts
    assert 'id="pikku-run-delete"' not in parts  # a live run: cancel it first
    assert "pikku-badge-suspended" in tree_entry(parts, child)
    assert 'data-live="true"' in parts  # the child may change without the parent
    WorkflowRun.objects.filter(pk__in=[parent.pk, child.pk]).update(status=RunStatus.COMPLETED)
    parts = text(admin_client.get(url))
    assert "pikku-steer-" not in parts
    assert 'id="pikku-run-delete"' in parts
    assert "pikku-badge-completed" in tree_entry(parts, child)
    assert 'data-live="false"' in parts
    # Without "change" no buttons; without "delete" no Delete; without "view", nothing.
    failed = WorkflowRunFactory(status=RunStatus.FAILED)
    assert 'id="pikku-steer-retry"' in text(admin_client.get(live_parts(failed)))
    viewer = client_for(django_user_model, "view_workflowrun")
    parts = text(viewer.get(live_parts(failed)))
    assert "pikku-steer-" not in parts
    assert 'id="pikku-run-delete"' not in parts
    assert client_for(django_user_model).get(live_parts(failed)).status_code == 403
    assert admin_client.post(live_parts(failed)).status_code == 405
    missing = WorkflowRun(id=uuid.uuid4())
    assert admin_client.get(live_parts(missing)).status_code == 404


@pytest.mark.django_db
def test_bulk_actions_write_a_log_entry_per_run(admin_client: Client) -> None:
    one, two = WorkflowRunFactory(), WorkflowRunFactory()
    done = WorkflowRunFactory(status=RunStatus.COMPLETED)
    admin_client.post(
        RUNS,
        {
            "action": "cancel_runs",
            "index": "0",
            "_selected_action": [str(r.pk) for r in (one, two, done)],
        },
    )
    assert [e.change_message for e in entries_for(one)] == ["Cancelled from the admin"]
    assert [e.change_message for e in entries_for(two)] == ["Cancelled from the admin"]
    assert entries_for(done) == []


# -- the run list and the run page -------------------------------------------------------


@pytest.mark.django_db
def test_the_run_list_shows_what_an_operator_scans(admin_client: Client) -> None:
    parent = WorkflowRunFactory(workflow="op-parent", status=RunStatus.RUNNING)
    child = WorkflowRunFactory(workflow="op-child", status=RunStatus.SUSPENDED)
    WorkflowRun.objects.filter(pk=child.pk).update(suspend_reason="waits for <finance>")
    step = WorkflowStepFactory(
        run=parent, name="op-kid", kind=StepKind.CHILD, child_run=child, queue="reports"
    )
    StepAttemptFactory(step=step, attempt=1, status=StepStatus.FAILED)
    StepAttemptFactory(step=step, attempt=2, status=StepStatus.RUNNING)
    hook = WorkflowRunFactory(
        workflow="pikku.webhooks.dispatch",
        idempotency_key="webhook:github:push:delivery-1",
        status=RunStatus.COMPLETED,
    )
    page = text(admin_client.get(RUNS))
    assert "webhook github: push" in page
    assert "op-kid" in page  # the parent's current step
    assert "waits for &lt;finance&gt;" in page
    assert f'href="{page_of(parent)}" class="pikku-parent"' in page  # the child's parent
    assert "so far" in page  # a live run's duration
    assert 'class="pikku-badge pikku-badge-suspended"' in page
    rows = {r.pk: r for r in admin_client.get(RUNS).context["cl"].result_list}
    assert rows[parent.pk].attempt_count == 2
    assert rows[hook.pk].attempt_count is None
    # Filter by queue; the attempts list shows run and workflow.
    listed = admin_client.get(RUNS, {"queue": "reports"}).context["cl"].result_list
    assert [r.pk for r in listed] == [parent.pk]
    attempts = text(admin_client.get(reverse("admin:pikku_django_stepattempt_changelist")))
    assert "op-parent" in attempts
    assert page_of(parent) in attempts


def test_a_webhook_run_is_named_after_its_source_and_event() -> None:
    key = "webhook:stripe:invoice.paid:evt_1"
    assert workflow_title("pikku.webhooks.dispatch", key) == "webhook stripe: invoice.paid"
    assert workflow_title("pikku.webhooks.dispatch", None) == "pikku.webhooks.dispatch"
    assert workflow_title("orders.ship", key) == "orders.ship"


@pytest.mark.django_db
def test_the_run_page_shows_the_tree_and_times_to_the_second(admin_client: Client) -> None:
    root = WorkflowRunFactory(workflow="op-root")
    middle = WorkflowRunFactory(workflow="op-middle")
    leaf = WorkflowRunFactory(workflow="op-leaf", status=RunStatus.FAILED)
    sibling = WorkflowRunFactory(workflow="op-sibling", status=RunStatus.COMPLETED)
    WorkflowStepFactory(run=root, name="a", kind=StepKind.CHILD, child_run=middle)
    WorkflowStepFactory(run=root, name="b", kind=StepKind.CHILD, child_run=sibling)
    WorkflowStepFactory(run=middle, name="c", kind=StepKind.CHILD, child_run=leaf)
    page = text(admin_client.get(page_of(middle)))
    tree = page[page.index('id="pikku-run-tree"') :]
    tree = tree[: tree.index("</fieldset>")]
    for run in (root, sibling, leaf):
        assert page_of(run) in tree
    assert page_of(middle) not in tree  # this run is shown, not linked
    assert tree.index("op-root") < tree.index("op-middle") < tree.index("op-leaf")
    assert "pikku-badge-failed" in tree
    started = timezone.localtime(WorkflowRun.objects.get(pk=middle.pk).created_at)
    assert started.strftime("%Y-%m-%d %H:%M:%S") in page
    lone = WorkflowRunFactory()
    assert 'id="pikku-run-tree"' not in text(admin_client.get(page_of(lone)))


@on_databases("postgres")
def test_search_finds_input_text_on_postgresql(vendor: str, admin_user: Any, settings: Any) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    wanted = WorkflowRunFactory(database=alias, input={"customer": "Zebulon Quartz"})
    other = WorkflowRunFactory(database=alias, input={"customer": "Ann"}, idempotency_key="k-9")
    client = Client()
    client.force_login(admin_user)

    def found(term: str) -> list[Any]:
        return [r.pk for r in client.get(RUNS, {"q": term}).context["cl"].result_list]

    assert found("zebulon quartz") == [wanted.pk]
    assert found("k-9") == [other.pk]
    assert found(str(other.pk)) == [other.pk]
    assert found(str(wanted.pk)[:8]) == [wanted.pk]
    assert found("nobody") == []


# -- the dashboard -----------------------------------------------------------------------


def load(using: str = "default", runs: int = 60) -> None:
    """Runs of three workflows in every status, with steps on two queues and attempts."""
    now = timezone.now()
    statuses = list(RunStatus.values)
    for i in range(runs):
        run = WorkflowRunFactory(
            database=using, workflow=f"op-load-{i % 3}", status=statuses[i % len(statuses)]
        )
        step = WorkflowStepFactory(
            database=using,
            run=run,
            name="work",
            queue="fast" if i % 2 else "slow",
            status=StepStatus.SCHEDULED if i % 4 == 0 else StepStatus.RUNNING,
            available_at=now - timedelta(seconds=i),
        )
        StepAttemptFactory(
            database=using,
            step=step,
            attempt=1,
            status=StepStatus.FAILED,
            finished_at=now - timedelta(minutes=i),
        )
    for n in range(3):
        record_heartbeat(f"host:{n}", queues=["fast"], concurrency=4, running=n, using=using)


@pytest.mark.django_db
def test_the_dashboard_shows_counts_queues_workers_and_charts(admin_client: Client) -> None:
    load(runs=20)
    stuck = WorkflowRunFactory(workflow="op-stuck", status=RunStatus.FAILED)
    WorkflowRun.objects.filter(pk=stuck.pk).update(updated_at=timezone.now() - timedelta(days=3))
    page = text(admin_client.get(DASHBOARD))
    assert "Workflow dashboard" in page
    assert page.count('<svg class="pikku-chart"') == 4
    assert "cdn" not in page.lower()
    assert f'href="{RUNS}?status__exact=failed"' in page
    assert f'href="{RUNS}?workflow=op-load-1"' in page
    assert 'data-queue="fast"' in page
    assert 'data-queue="slow"' in page
    assert 'data-worker="host:2"' in page
    assert page.index(f'data-run="{stuck.pk}"') < page.index(
        'data-run="', page.index(f'data-run="{stuck.pk}"') + 1
    )
    assert 'id="pikku-total">21<' in page
    # The panel alone, for the page's refresh.
    panel = text(admin_client.get(DASHBOARD, {"panel": "1"}))
    assert "<html" not in panel
    assert 'id="pikku-dashboard"' in panel
    assert f'href="{DASHBOARD}"' in text(admin_client.get(RUNS))


@pytest.mark.django_db
def test_the_dashboard_needs_the_view_permission(django_user_model: Any) -> None:
    assert client_for(django_user_model).get(DASHBOARD).status_code == 403
    assert client_for(django_user_model, "view_workflowrun").get(DASHBOARD).status_code == 200


@on_databases("sqlite", "postgres", "mariadb")
def test_the_dashboard_reads_a_loaded_database_in_a_bounded_number_of_queries(
    vendor: str, admin_user: Any, settings: Any
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    client = Client()
    client.force_login(admin_user)
    counts = []
    for size in (10, 60):
        load(alias, runs=size)
        with CaptureQueriesContext(connections[alias]) as queries:
            assert client.get(DASHBOARD, {"panel": "1"}).status_code == 200
        ours = [q["sql"] for q in queries.captured_queries if "pikku_" in q["sql"]]
        counts.append(len(ours))
    assert counts[0] == counts[1]  # the same statements, whatever the data
    assert counts[1] <= 10, ours  # 9, and the paused queues


@on_databases("sqlite", "postgres", "mariadb")
def test_the_charts_count_each_minute_in_any_time_zone(vendor: str, settings: Any) -> None:
    from pikku_django.admin.stats import collect

    alias = database_alias(vendor)
    settings.TIME_ZONE = "Europe/Helsinki"
    now = timezone.now().replace(second=30, microsecond=0)
    for minutes_ago in (0, 0, 5, 60 * 25):
        run = WorkflowRunFactory(database=alias, status=RunStatus.COMPLETED)
        at = now - timedelta(minutes=minutes_ago)
        WorkflowRun.objects.using(alias).filter(pk=run.pk).update(created_at=at, updated_at=at)
    started = collect(alias, now=now).series["started"].counts
    assert started[-1] == 2  # this minute
    assert started[-6] == 1  # five minutes ago
    assert sum(started) == 3  # the run of 25 hours ago is outside the window
