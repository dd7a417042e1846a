"""``PIKKU["READ_DATABASE"]``: the screens people read draw from it; a worker, a start,
a webhook intake and the admin's actions never reach it.

The replica is the same database under a second alias (a test mirror, see
tests/settings.py), so every query is recorded with the alias it went through.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.db.backends.signals import connection_created
from django.test import Client, override_settings
from django.urls import reverse

from pikku_django.leases import hold_lease, reset_lease_service
from pikku_django.models import (
    RunStatus,
    StepAttempt,
    TriggerSource,
    WebhookReceipt,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.read_database import read_database
from pikku_django.webhooks import credential_name, set_credential
from pikku_django.webhooks.lifecycle import sync
from pikku_django.workflows import start_workflow
from pikku_django.workflows.api import get_engine, reset_engine
from pikku_django.workflows.worker.loop import Worker
from tests import webhook_defs  # noqa: F401  (declares the wh-github source)
from tests.conftest import DATABASE_ALIASES, database_alias
from tests.factories import WorkflowRunFactory

READ_ALIASES: dict[str, str] = settings.READ_REPLICAS
SECRET = "read-database-secret"


def on(*vendors: str) -> pytest.MarkDecorator:
    """Parametrize ``vendor``, each with its primary and replica aliases allowed."""

    def mark(vendor: str) -> pytest.MarkDecorator:
        primary = DATABASE_ALIASES[vendor]
        wanted = {"default", primary, READ_ALIASES[primary]}
        return pytest.mark.django_db(
            databases=sorted(a for a in wanted if a in settings.DATABASES), transaction=True
        )

    return pytest.mark.parametrize(
        "vendor", [pytest.param(v, marks=mark(v), id=v) for v in vendors]
    )


class Traffic:
    """The statements each alias ran, and the connections opened to each, in any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.queries: dict[str, list[str]] = defaultdict(list)
        self.opened: list[str] = []
        self.recording = True

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if self.recording:
            with self._lock:
                self.queries[context["connection"].alias].append(sql)
        return execute(sql, params, many, context)

    def on_connect(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if not self.recording:
            return
        with self._lock:
            self.opened.append(connection.alias)
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)

    def of_tables(self, alias: str) -> list[str]:
        """The statements through ``alias`` that read or write pikku_django's tables."""
        return [sql for sql in self.queries[alias] if "pikku_" in sql.lower()]


@contextmanager
def traffic() -> Iterator[Traffic]:
    """Record every query through every alias (``execute_wrapper``): on this thread's
    connections, and on each connection any thread opens meanwhile."""
    seen = Traffic()
    here = [connections[alias] for alias in connections]
    for connection in here:
        connection.execute_wrappers.append(seen)
    connection_created.connect(seen.on_connect, weak=False)
    try:
        yield seen
    finally:
        seen.recording = False
        connection_created.disconnect(seen.on_connect)
        for connection in here:
            connection.execute_wrappers.remove(seen)


@contextmanager
def reading_from_replica(primary: str) -> Iterator[str]:
    """Workflows and leases on ``primary``, ``READ_DATABASE`` its replica; the replica."""
    replica = READ_ALIASES[primary]
    pikku = {"WORKFLOW_DATABASE": primary, "LEASE_DATABASE": primary, "READ_DATABASE": replica}
    with override_settings(PIKKU=pikku):
        reset_engine()
        reset_lease_service()
        try:
            yield replica
        finally:
            reset_engine()
            reset_lease_service()


def signed_push(client: Client, delivery: str) -> Any:
    body = json.dumps({"ref": delivery}).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return client.post(
        "/pikku/webhooks/wh-github/",
        body,
        content_type="application/json",
        HTTP_X_GITHUB_EVENT="push",
        HTTP_X_GITHUB_DELIVERY=delivery,
        HTTP_X_HUB_SIGNATURE_256=signature,
    )


def test_read_database_is_the_workflow_database_unless_set() -> None:
    with override_settings(PIKKU={"WORKFLOW_DATABASE": "default"}):
        assert read_database() == "default"
    with override_settings(PIKKU={"WORKFLOW_DATABASE": "default", "READ_DATABASE": "replica"}):
        assert read_database() == "replica"
        assert read_database("default") == "replica"
        assert read_database("other") == "other"  # not a replica of that one


@on("sqlite", "postgres")
def test_a_worker_a_start_and_a_webhook_intake_never_reach_the_read_database(
    vendor: str, client: Client
) -> None:
    alias = database_alias(vendor)
    sync()
    TriggerSource.objects.filter(name="wh-github").update(enabled=True)
    set_credential(credential_name("wh-github"), SECRET)
    with reading_from_replica(alias) as replica, traffic() as seen:
        runs = [
            start_workflow("testapp.three_records", {"db": alias, "run": f"read-{n}"})
            for n in range(3)
        ]
        assert signed_push(client, "read-1").status_code == 200
        with hold_lease("read-database-test", ttl_ms=5_000) as held:
            assert held.token >= 1
        Worker(get_engine(), concurrency=2, until_idle=True, poll_interval=0.1).run()

        done = WorkflowRun.objects.using(alias).filter(pk__in=[r.pk for r in runs])
        assert sorted(done.values_list("status", flat=True)) == [RunStatus.COMPLETED] * 3
        receipt = WebhookReceipt.objects.using(alias).get(provider_id="read-1")
        assert WorkflowRun.objects.using(alias).get(pk=receipt.run_id).status == (
            RunStatus.COMPLETED
        )
        assert StepAttempt.objects.using(alias).of_run(runs[0].pk).count() == 3

        # Everything went through the primary, nothing through the replica.
        assert len(seen.of_tables(alias)) > 20
        assert seen.queries[replica] == []
        assert replica not in seen.opened

        # The recorder sees a read of the replica, from any thread.
        reader = threading.Thread(
            target=lambda: (WorkflowRun.objects.using(replica).count(), connections.close_all())
        )
        reader.start()
        reader.join()
        assert len(seen.of_tables(replica)) == 1
        assert replica in seen.opened


def admin_pages(run: WorkflowRun, step: WorkflowStep) -> dict[str, str]:
    """The admin's pages that only show, by name."""

    def url(name: str, *args: Any) -> str:
        return reverse(f"admin:pikku_django_{name}", args=args)

    return {
        "runs": url("workflowrun_changelist"),
        "runs by queue": url("workflowrun_changelist") + "?queue=default",
        "run": url("workflowrun_change", run.pk),
        "run live parts": url("workflowrun_change", run.pk).replace("/change/", "/live/"),
        "steps": url("workflowstep_changelist"),
        "step": url("workflowstep_change", step.pk),
        "attempts": url("stepattempt_changelist"),
        "receipts": url("webhookreceipt_changelist") + "?state=waiting",
        "schedules": url("schedule_changelist"),
        "leases": url("lease_changelist"),
        "heartbeats": url("workerheartbeat_changelist"),
        "queues": url("workflowrun_queues"),
        "dashboard": url("workflowrun_dashboard"),
        "dashboard panel": url("workflowrun_dashboard") + "?panel=1",
    }


@on("sqlite", "postgres")
def test_the_admin_pages_the_status_endpoint_and_pikku_runs_read_the_replica(
    vendor: str, admin_client: Client
) -> None:
    alias = database_alias(vendor)
    with reading_from_replica(alias) as replica:
        run = start_workflow("testapp.three_records", {"db": alias, "run": "shown"})
        get_engine().run_until_idle()
        failed = WorkflowRunFactory(database=alias, workflow="read-failed", status="failed")
        step = WorkflowStep.objects.using(alias).of_run(run.pk).first()
        assert step is not None

        for name, url in admin_pages(run, step).items():
            with traffic() as seen:
                response = admin_client.get(url)
            assert response.status_code == 200, (name, response.status_code)
            assert seen.of_tables(replica), f"{name} read nothing from the replica"
            assert seen.of_tables(alias) == [], (name, seen.of_tables(alias))

        page = admin_client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
        assert "testapp.three_records" in page.content.decode()
        listed = admin_client.get(reverse("admin:pikku_django_workflowrun_changelist"))
        assert str(failed.pk)[:8] in listed.content.decode()

        with traffic() as seen:
            status = admin_client.get(f"/pikku/runs/{run.pk}/status")
        assert status.status_code == 200
        assert status.json()["status"] == RunStatus.COMPLETED
        assert seen.of_tables(replica)
        assert seen.of_tables(alias) == []

        for args in (("list", "--json"), ("show", str(run.pk)[:8], "--json")):
            out = io.StringIO()
            with traffic() as seen:
                call_command("pikku_runs", *args, stdout=out)
            assert str(run.pk) in out.getvalue()
            assert seen.of_tables(replica), args
            assert seen.of_tables(alias) == [], (args, seen.of_tables(alias))


@on("sqlite", "postgres")
def test_admin_actions_and_steering_read_and_write_the_primary(
    vendor: str, admin_client: Client
) -> None:
    alias = database_alias(vendor)
    with reading_from_replica(alias) as replica:
        runs = [
            WorkflowRunFactory(database=alias, workflow="read-steered", status="suspended")
            for _ in range(2)
        ]
        changelist = reverse("admin:pikku_django_workflowrun_changelist")
        with traffic() as seen:
            response = admin_client.post(
                changelist, {"action": "cancel_runs", "_selected_action": [str(runs[0].pk)]}
            )
        assert response.status_code == 302
        assert seen.of_tables(replica) == []
        assert seen.of_tables(alias)

        steer = reverse("admin:pikku_django_workflowrun_steer", args=[runs[1].pk, "cancel"])
        with traffic() as seen:
            confirm = admin_client.post(steer, {})
        assert confirm.status_code == 302
        assert seen.of_tables(replica) == []

        statuses = WorkflowRun.objects.using(alias).filter(pk__in=[r.pk for r in runs])
        assert list(statuses.values_list("status", flat=True)) == [RunStatus.CANCELLED] * 2
        assert not statuses.active().exists()


@on("sqlite")
def test_an_unknown_read_database_is_a_system_check_error(vendor: str) -> None:
    from pikku_django.checks import check_read_database

    with override_settings(PIKKU={"READ_DATABASE": "nowhere"}):
        errors = check_read_database()
    assert [e.id for e in errors] == ["pikku_django.E030"]
    assert "'nowhere'" in errors[0].msg
    with override_settings(PIKKU={"READ_DATABASE": "replica"}):
        assert check_read_database() == []
    with override_settings(PIKKU={}):
        assert check_read_database() == []
