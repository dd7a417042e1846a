"""``manage.py pikku_runs``: every subcommand, in text and JSON, and bad input."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from pikku_django.models import RunStatus, StepKind, StepStatus, WorkflowRun
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, on_databases
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    reset_engine()
    yield
    reset_engine()


def run_command(*args: str) -> str:
    out = io.StringIO()
    call_command("pikku_runs", *args, stdout=out)
    return out.getvalue()


def as_json(*args: str) -> Any:
    return json.loads(run_command(*args, "--json"))


def status_of(run: WorkflowRun, using: str = "default") -> str:
    return WorkflowRun.objects.using(using).get(pk=run.pk).status


def family(using: str = "default") -> tuple[WorkflowRun, WorkflowRun]:
    """A running parent on queue "reports" whose child waits suspended."""
    parent = WorkflowRunFactory(database=using, workflow="cli-parent")
    child = WorkflowRunFactory(
        database=using, workflow="cli-child", status=RunStatus.SUSPENDED, input={"who": "Ada"}
    )
    WorkflowRun.objects.using(using).filter(pk=child.pk).update(suspend_reason="sign-off")
    kid = WorkflowStepFactory(
        database=using,
        run=parent,
        name="kid",
        kind=StepKind.CHILD,
        child_run=child,
        queue="reports",
        status=StepStatus.RUNNING,
    )
    StepAttemptFactory(
        database=using,
        step=kid,
        attempt=1,
        status=StepStatus.FAILED,
        worker="host-a:1",
        error={"type": "OSError", "message": "disk"},
    )
    WorkflowStepFactory(
        database=using,
        run=child,
        name="wait",
        kind=StepKind.SUSPEND,
        status=StepStatus.SUSPENDED,
        retries=0,
    )
    return parent, child


@pytest.mark.django_db
def test_list_shows_the_admin_columns_and_filters_like_it() -> None:
    parent, child = family()
    old = WorkflowRunFactory(workflow="cli-old", status=RunStatus.COMPLETED, idempotency_key="k-7")
    WorkflowRun.objects.filter(pk=old.pk).update(created_at=datetime(2020, 1, 15, tzinfo=UTC))
    hook = WorkflowRunFactory(
        workflow="pikku.webhooks.dispatch", idempotency_key="webhook:github:push:d-1"
    )
    table = run_command("list")
    header = table.splitlines()[0].split()
    assert header[:7] == ["ID", "WORKFLOW", "STATUS", "STEP", "STARTED", "DURATION", "ATTEMPTS"]
    assert str(child.pk)[:8] in table
    assert "webhook github: push" in table
    assert "sign-off" in table
    child_line = next(line for line in table.splitlines() if line.startswith(str(child.pk)[:8]))
    assert child_line.rstrip().endswith(str(parent.pk)[:8])  # its parent

    def ids(*args: str) -> list[str]:
        return [row["id"] for row in as_json("list", *args)]

    assert ids() == [str(hook.pk), str(child.pk), str(parent.pk), str(old.pk)]
    assert ids("--status", "suspended") == [str(child.pk)]
    assert ids("--workflow", "cli-parent") == [str(parent.pk)]
    assert ids("--queue", "reports") == [str(parent.pk)]
    assert ids("--until", "2020-01-15") == [str(old.pk)]
    assert ids("--since", "2020-01-16") == [str(hook.pk), str(child.pk), str(parent.pk)]
    assert ids("--search", "k-7") == [str(old.pk)]
    assert ids("--limit", "1") == [str(hook.pk)]
    [row] = as_json("list", "--workflow", "cli-parent")
    assert row["attempts"] == 1
    assert row["current_step"] == "kid"
    assert run_command("list", "--workflow", "nothing") == "No workflow runs match.\n"


@pytest.mark.django_db
def test_show_prints_steps_and_attempts() -> None:
    parent, child = family()
    text = run_command("show", str(parent.pk))
    assert f"id  {parent.pk}" in text
    assert "kid" in text
    assert "attempt 1" in text
    assert "host-a:1" in text
    assert "OSError: disk" in text
    data = as_json("show", str(parent.pk)[:8])  # a prefix names the run too
    assert data["id"] == str(parent.pk)
    [step] = data["steps"]
    assert (step["name"], step["child_run"], step["queue"]) == ("kid", str(child.pk), "reports")
    assert step["attempts"][0]["error"] == {"type": "OSError", "message": "disk"}
    child_data = as_json("show", str(child.pk))
    assert child_data["parent"] == str(parent.pk)
    assert child_data["input"] == {"who": "Ada"}
    assert "suspend reason  sign-off" in run_command("show", str(child.pk))


@pytest.mark.django_db
def test_resume_hands_the_data_to_the_run() -> None:
    _, child = family()
    out = run_command("resume", str(child.pk), "--data", '{"approved": true}')
    assert out == f"Resumed run {child.pk}; it is now running.\n"
    assert child.steps.get(name="wait").result == {"approved": True}
    with pytest.raises(CommandError, match="is running: it cannot be resumed"):
        run_command("resume", str(child.pk))


@pytest.mark.django_db
def test_cancel_and_retry_with_json_output() -> None:
    parent, child = family()
    data = as_json("cancel", str(parent.pk))
    assert (data["id"], data["status"]) == (str(parent.pk), "cancelled")
    assert status_of(child) == RunStatus.CANCELLED  # the child it waited for, too
    with pytest.raises(CommandError, match="is cancelled: it cannot be cancelled"):
        run_command("cancel", str(parent.pk))

    failed = WorkflowRunFactory(status=RunStatus.FAILED, error={"type": "X", "message": "y"})
    step = WorkflowStepFactory(
        run=failed, name="charge", status=StepStatus.FAILED, attempt=1, retries=0
    )
    StepAttemptFactory(step=step, attempt=1, status=StepStatus.FAILED)
    assert run_command("retry", str(failed.pk)) == f"Retried run {failed.pk}; it is now running.\n"
    step.refresh_from_db()
    assert step.retries == 1  # one more attempt


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "nope"], "'nope' is not a run id"),
        (["show", "1234"], "at least its first 8 characters"),
        (["show", str(uuid.UUID(int=7))], "No workflow run has id"),
        (["cancel", "abcdef12"], "No workflow run has id 'abcdef12'"),
        (["list", "--limit", "0"], "--limit must be at least 1"),
        (["list", "--since", "2024-02-02", "--until", "2024-02-01"], "--since is after --until"),
    ],
)
@pytest.mark.django_db
def test_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    WorkflowRunFactory(status=RunStatus.SUSPENDED)
    with pytest.raises(CommandError, match=message):
        run_command(*args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["resume", "abcdef12", "--data", "{not json"], "is not JSON"),
        (["list", "--since", "yesterday"], "is not a day"),
        (["list", "--status", "sleeping"], "invalid choice"),
        (["explode"], "invalid choice"),
    ],
)
def test_bad_arguments_are_refused_by_the_parser(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("pikku_runs", *args)


@pytest.mark.django_db
def test_an_ambiguous_prefix_is_refused() -> None:
    a = WorkflowRunFactory(id=uuid.UUID("abcdef12-0000-4000-8000-000000000001"))
    WorkflowRunFactory(id=uuid.UUID("abcdef12-0000-4000-8000-000000000002"))
    with pytest.raises(CommandError, match="More than one run id starts with"):
        run_command("show", "abcdef12")
    assert as_json("show", str(a.pk))["id"] == str(a.pk)


def test_help_explains_each_subcommand() -> None:
    from pikku_django.management.commands.pikku_runs import Command

    parser = Command().create_parser("manage.py", "pikku_runs")
    text = parser.format_help()
    for word in ("list", "show", "resume", "cancel", "retry", "--json"):
        assert word in text


@on_databases("postgres", "mariadb")
def test_the_command_reads_the_workflow_database(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    parent, child = family(alias)
    WorkflowRunFactory(database=alias, input={"customer": "Zebulon"})
    assert [r["id"] for r in as_json("list", "--queue", "reports")] == [str(parent.pk)]
    assert as_json("show", str(child.pk)[:8])["parent"] == str(parent.pk)
    # A prefix past the first dash names it too, whatever the database stores.
    assert as_json("show", str(child.pk)[:13])["id"] == str(child.pk)
    if vendor == "postgres":
        assert len(as_json("list", "--search", "zebulon")) == 1
    run_command("resume", str(child.pk), "--data", "42")
    assert status_of(child, alias) == RunStatus.RUNNING
    run_command("cancel", str(parent.pk))
    assert status_of(parent, alias) == RunStatus.CANCELLED
    assert timedelta(0) <= timedelta(seconds=as_json("show", str(parent.pk))["duration_seconds"])
