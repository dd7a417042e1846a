"""System checks for workflows and webhooks, and pikku_prune."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone

from pikku_django.checks import (
    check_database_state,
    check_migrations_applied,
    check_settings,
    check_urls_included,
    check_workflow_database,
    check_workflow_settings,
)
from pikku_django.models import (
    StepAttempt,
    WebhookReceipt,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.webhooks import credential_name, set_credential
from tests.conftest import database_alias, on_databases
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory


def ids(messages: list[checks.CheckMessage]) -> list[str]:
    return [m.id or "" for m in messages]


@pytest.mark.parametrize(
    ("pikku", "expected"),
    [
        ({}, []),
        ({"STEP_RETRY_DELAY": "soon"}, ["pikku_django.E010"]),
        ({"STEP_BACKOFF": "random"}, ["pikku_django.E011"]),
        ({"STEP_RETRIES": -1}, ["pikku_django.E012"]),
        ({"QUEUE_LEASE_MS": ["reports"]}, ["pikku_django.E013"]),
        ({"STEP_LEASE_MS": 0}, ["pikku_django.E014"]),
        ({"QUEUE_LEASE_MS": {"reports": "5s"}}, ["pikku_django.E014"]),
        ({"ASYNC_CONCURRENCY": 0}, ["pikku_django.E018"]),
        ({"ASYNC_CONCURRENCY": "many"}, ["pikku_django.E018"]),
        ({"ASYNC_CONCURRENCY": 500}, []),
        ({"WORKER_NOTIFIED_POLL_INTERVAL": 0}, ["pikku_django.E019"]),
        ({"WORKER_NOTIFIED_POLL_INTERVAL": "10s"}, ["pikku_django.E019"]),
        ({"WORKER_POLL_INTERVAL": -1}, ["pikku_django.E019"]),
        ({"WORKER_NOTIFIED_POLL_INTERVAL": 30}, []),
    ],
)
def test_workflow_settings_check(settings: Any, pikku: dict, expected: list[str]) -> None:
    settings.PIKKU = pikku
    assert ids(check_settings() + check_workflow_settings()) == expected


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_sqlite_checks(settings: Any) -> None:
    settings.PIKKU = {"WORKER_PROCESSES": 3}
    assert ids(check_workflow_database()) == ["pikku_django.W003"]
    databases = {**settings.DATABASES, "plain": {"ENGINE": "django.db.backends.sqlite3"}}
    with override_settings(DATABASES=databases, PIKKU={"WORKFLOW_DATABASE": "plain"}):
        assert ids(check_workflow_database()) == ["pikku_django.W002"]
    settings.PIKKU = {"WORKFLOW_DATABASE": "nowhere"}
    assert ids(check_workflow_database()) == ["pikku_django.E009"]


def test_urls_check(settings: Any) -> None:
    assert check_urls_included() == []
    settings.ROOT_URLCONF = "tests.urls_without_pikku"
    assert ids(check_urls_included()) == ["pikku_django.W004"]


@pytest.mark.django_db
def test_webhook_source_without_secret_is_reported() -> None:
    from tests import webhook_defs  # noqa: F401  (declares wh-github)

    found = check_database_state(databases=["default"])
    assert "pikku_django.W006" in ids(found)
    assert any("wh-github" in m.msg for m in found)
    set_credential(credential_name("wh-github"), "a secret")
    assert not any("wh-github" in m.msg for m in check_database_state(databases=["default"]))


@pytest.mark.django_db
def test_database_check_only_runs_for_the_workflow_database() -> None:
    assert check_database_state(databases=None) == []
    assert check_database_state(databases=["postgres"]) == []


@pytest.mark.django_db(transaction=True)
def test_unapplied_migrations_are_reported() -> None:
    call_command("migrate", "pikku_django", "0002", verbosity=0)
    try:
        # Reported once: on an SQLite file by the offline check, with or without --database.
        found = check_database_state(databases=["default"]) + check_migrations_applied(
            databases=["default"]
        )
        assert ids(found) == ["pikku_django.W007"]
        assert "manage.py migrate" in found[0].hint
    finally:
        call_command("migrate", "pikku_django", verbosity=0)


# -- pikku_prune ------------------------------------------------------------------------


def aged(run: WorkflowRun, days: int, alias: str = "default") -> WorkflowRun:
    WorkflowRun.objects.using(alias).filter(id=run.id).update(
        updated_at=timezone.now() - timedelta(days=days)
    )
    return run


@on_databases("sqlite", "postgres", "mariadb")
def test_prune_deletes_settled_old_runs_with_their_steps_and_receipts(vendor: str) -> None:
    alias = database_alias(vendor)

    def run(status: str, days: int | None = None) -> WorkflowRun:
        made = WorkflowRunFactory(status=status, database=alias)
        return made if days is None else aged(made, days, alias)

    def step(**fields: Any) -> WorkflowStep:
        return WorkflowStepFactory(database=alias, **fields)

    old_done = run("completed", 40)
    done_step = step(run=old_done, status="succeeded")
    StepAttemptFactory(step=done_step, status="succeeded", database=alias)
    group = step(run=old_done, kind="parallel", status="succeeded")
    step(run=old_done, group=group, status="succeeded")
    WorkflowEvent.objects.using(alias).create(run=old_done, name="e", event_id="1", step=done_step)
    old_failed = run("failed", 40)
    new_done = run("completed", 5)
    old_running = run("running", 40)
    old_suspended = run("suspended", 40)
    parent = run("running")
    child = run("completed", 40)
    step(run=parent, kind="child", child_run=child, status="succeeded")
    # A settled parent and its settled child go together, in either order.
    old_parent = run("cancelled", 41)
    old_child = run("completed", 40)
    step(run=old_parent, kind="child", child_run=old_child, status="succeeded")
    receipts = WebhookReceipt.objects.using(alias)
    old_receipt = receipts.create(source="s", event="e", provider_id="1")
    receipts.filter(pk=old_receipt.pk).update(received_at=timezone.now() - timedelta(days=40))
    receipts.create(source="s", event="e", provider_id="2")
    # An old event whose run has yet to start is kept: it holds the event.
    waiting = receipts.create(
        source="s", event="e", provider_id="3", workflow="w", input={"data": 1}
    )
    receipts.filter(pk=waiting.pk).update(received_at=timezone.now() - timedelta(days=40))
    prune = ["pikku_prune", "--older-than", "30d", "--database", alias]

    out = StringIO()
    call_command(*prune, "--dry-run", stdout=out)
    assert "Would delete 4 settled runs and 1 webhook receipts" in out.getvalue()
    assert WorkflowRun.objects.using(alias).count() == 9

    out = StringIO()
    call_command(*prune, "--batch-size", "1", stdout=out)
    assert "Deleted 4 settled runs and 1 webhook receipts" in out.getvalue()
    left = set(WorkflowRun.objects.using(alias).values_list("id", flat=True))
    assert left == {new_done.id, old_running.id, old_suspended.id, parent.id, child.id}
    gone = [old_done.id, old_failed.id, old_parent.id, old_child.id]
    assert not WorkflowStep.objects.using(alias).filter(run_id__in=gone).exists()
    assert not StepAttempt.objects.using(alias).filter(step_id=done_step.id).exists()
    assert not WorkflowEvent.objects.using(alias).exists()
    assert sorted(receipts.values_list("provider_id", flat=True)) == ["2", "3"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "soon"], "--older-than"),
        (["--older-than", "0"], "more than 0"),
        (["--older-than", "1d", "--batch-size", "0"], "batch-size"),
    ],
)
def test_prune_bad_options(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("pikku_prune", *args)


@pytest.mark.django_db
def test_unreadable_secret_is_reported() -> None:
    from pikku_django.models import CredentialValue
    from tests import webhook_defs  # noqa: F401  (declares wh-github)

    CredentialValue.objects.create(credential="whGithubWebhookSecret", ciphertext="not-fernet")
    found = check_database_state(databases=["default"])
    assert "pikku_django.E016" in ids(found)


@pytest.mark.django_db
def test_unreadable_migration_state_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import DatabaseError
    from django.db.migrations import executor

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("no such table: django_migrations")

    monkeypatch.setattr(executor.MigrationExecutor, "__init__", broken)
    assert ids(check_database_state(databases=["default"])) == ["pikku_django.W005"]
