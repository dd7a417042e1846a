"""The workflow admin screens and their actions, and ``WorkflowEngine.retry``.

The admin is driven through Django's test client on the default (SQLite)
database; ``retry`` itself runs on SQLite, PostgreSQL and MariaDB with a
:class:`FakeClock`. Registered names here start with ``adm_``.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from pikku_django.dbclock import process_now_ms
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import (
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows import (
    FakeClock,
    StepFailedError,
    WorkflowContext,
    WorkflowEngine,
    WorkflowRunNotFoundError,
    WorkflowRunStateError,
    retry_workflow,
    step,
    workflow,
)
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, on_databases
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory
from tests.workflow_defs import Calls

VENDORS = ("sqlite", "postgres", "mariadb")
DAY = timedelta(days=1)
RUNS = "admin:pikku_django_workflowrun_changelist"
STEPS = "admin:pikku_django_workflowstep_changelist"
ATTEMPTS = "admin:pikku_django_stepattempt_changelist"

CALLS = Calls()
#: Tags whose ``adm_body_raises`` run may finish now.
HEALED: set[str] = set()


# -- registered workflows ---------------------------------------------------------------


@step(name="adm_flaky")
def flaky(data: dict[str, Any]) -> str:
    """Fails its first ``failures`` calls for the tag, then succeeds."""
    n = CALLS.hit(data["tag"], "flaky")
    if n <= data["failures"]:
        raise RuntimeError(f"flaky call {n} {data['tag']}")
    return f"ok on call {n}"


@step(name="adm_always_fails")
def always_fails(data: dict[str, Any]) -> None:
    CALLS.hit(data["tag"], "always_fails")
    raise ValueError("always")


@step(name="adm_undo")
def undo(data: dict[str, Any]) -> str:
    """A compensation: ``data`` is the failed step and its error, which ends with the tag."""
    CALLS.hit(data["error"]["message"].split()[-1], "undo", data["step"])
    return "undone"


@step(name="adm_record")
def record(data: dict[str, Any]) -> str:
    CALLS.hit(data["tag"], "record")
    return "recorded"


@workflow(name="adm_flaky_wf")
def flaky_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do(
        "charge",
        flaky,
        {"tag": inp["tag"], "failures": inp["failures"]},
        retries=inp["retries"],
        retry_delay=0,
    )


@workflow(name="adm_caught")
def caught_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    with contextlib.suppress(StepFailedError):
        ctx.do("optional", always_fails, {"tag": inp["tag"]}, retries=0)
    return ctx.do("charge", flaky, {"tag": inp["tag"], "failures": 1}, retries=0)


@workflow(name="adm_compensated")
def compensated_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    tag = inp["tag"]
    return ctx.do(
        "charge",
        flaky,
        {"tag": tag, "failures": 1},
        retries=0,
        on_error=lambda failure: undo(failure),  # a plain callable: runs inline
    )


@workflow(name="adm_compensated_queued")
def compensated_queued_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    tag = inp["tag"]
    return ctx.do("charge", flaky, {"tag": tag, "failures": 1}, retries=0, on_error="adm_undo")


@workflow(name="adm_body_raises")
def body_raises_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> str:
    ctx.do("first", record, {"tag": inp["tag"]})
    if inp["tag"] not in HEALED:
        raise LookupError("not healed yet")
    return "healed"


@workflow(name="adm_child")
def child_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.do("work", flaky, {"tag": inp["tag"], "failures": 1}, retries=0)


@workflow(name="adm_parent")
def parent_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return {"child": ctx.do("child", child_wf, {"tag": inp["tag"]})}


@workflow(name="adm_approval")
def approval_wf(ctx: WorkflowContext, inp: dict[str, Any]) -> Any:
    return ctx.suspend("needs a human")


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh_engine() -> Iterator[None]:
    """The admin uses the project engine: build it from this test's settings."""
    reset_engine()
    yield
    reset_engine()


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex


def memory_engine(alias: str = "default") -> WorkflowEngine:
    return WorkflowEngine(alias, leases=InMemoryLeaseService(), clock=FakeClock())


def staff(django_user_model: Any, *codenames: str) -> Any:
    user = django_user_model.objects.create_user(
        f"staff-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True
    )
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, action: str, runs: list[WorkflowRun], **extra: str) -> Any:
    return client.post(
        reverse(RUNS),
        {"action": action, "index": "0", "_selected_action": [str(r.pk) for r in runs], **extra},
    )


def said(response: Any) -> list[tuple[str, str]]:
    """The messages an admin response queued: (level tag, text)."""
    return [(m.level_tag, str(m)) for m in get_messages(response.wsgi_request)]


def status_of(run: WorkflowRun) -> str:
    return WorkflowRun.objects.get(pk=run.pk).status


def body(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def failed_run(database: str = "default") -> tuple[WorkflowRun, WorkflowStep]:
    """A failed run whose only (queued) step failed on its last attempt."""
    run = WorkflowRunFactory(
        database=database,
        status=RunStatus.FAILED,
        error={"type": "StepFailedError", "message": "x"},
    )
    failed = WorkflowStepFactory(
        database=database,
        run=run,
        name="charge",
        status=StepStatus.FAILED,
        attempt=1,
        retries=0,
        available_at=None,
    )
    StepAttemptFactory(database=database, step=failed, attempt=1, status=StepStatus.FAILED)
    return run, failed


def change_url(obj: Any) -> str:
    return reverse(f"admin:pikku_django_{obj._meta.model_name}_change", args=[obj.pk])


def listed(client: Client, url: str, objs: list[Any], params: dict[str, str]) -> list[Any]:
    """Which of ``objs`` the list at ``url`` shows (by their change links) with ``params``."""
    page = body(client.get(url, params))
    return [obj for obj in objs if f'href="{change_url(obj)}' in page]


# -- WorkflowEngine.retry, on every database --------------------------------------------------


@on_databases(*VENDORS)
def test_retry_gives_the_exhausted_step_one_more_attempt(vendor: str, tag: str) -> None:
    engine = memory_engine(database_alias(vendor))
    run = engine.start(flaky_wf, {"tag": tag, "failures": 2, "retries": 1})
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert run.status == RunStatus.FAILED
    [charge] = engine.steps().filter(run_id=run.id)
    assert (charge.status, charge.attempt, charge.attempts_allowed) == (StepStatus.FAILED, 2, 2)

    retried = engine.retry(run.id)
    assert (retried.status, retried.error, retried.wake_at) == (
        RunStatus.RUNNING,
        None,
        engine.clock.now(),
    )
    charge.refresh_from_db()
    assert (charge.status, charge.attempt, charge.retries) == (StepStatus.FAILED, 2, 2)
    assert charge.available_at == engine.clock.now()

    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert run.status == RunStatus.COMPLETED
    assert run.output == "ok on call 3"
    history = list(engine.attempts().filter(step_id=charge.id).order_by("attempt"))
    assert [(a.attempt, a.status) for a in history] == [
        (1, StepStatus.FAILED),
        (2, StepStatus.FAILED),
        (3, StepStatus.SUCCEEDED),
    ]
    assert CALLS.count(tag, "flaky") == 3


@on_databases(*VENDORS)
def test_only_a_failed_run_is_retried(vendor: str, tag: str) -> None:
    alias = database_alias(vendor)
    engine = memory_engine(alias)
    running = engine.start(flaky_wf, {"tag": tag, "failures": 0, "retries": 0})
    with pytest.raises(WorkflowRunStateError, match="is running, not failed"):
        engine.retry(running.id)
    assert engine.get_run(running.id).status == RunStatus.RUNNING
    engine.run_until_idle()
    with pytest.raises(WorkflowRunStateError, match="is completed, not failed"):
        engine.retry(running.id)
    with pytest.raises(WorkflowRunNotFoundError):
        engine.retry(uuid.uuid4())

    # Retried once, the run is running: a second retry is refused and changes nothing.
    run, charge = failed_run(database=alias)
    engine.retry(run.id)
    with pytest.raises(WorkflowRunStateError):
        engine.retry(run.id)
    charge.refresh_from_db()
    assert (charge.attempt, charge.retries) == (1, 1)


@on_databases(*VENDORS)
def test_a_failure_the_workflow_caught_is_not_retried(vendor: str, tag: str) -> None:
    engine = memory_engine(database_alias(vendor))
    run = engine.start(caught_wf, {"tag": tag})
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.FAILED

    engine.retry(run.id)
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED
    steps = {s.name: s for s in engine.steps().filter(run_id=run.id)}
    assert (steps["optional"].status, steps["optional"].attempt) == (StepStatus.FAILED, 1)
    assert steps["optional"].attempts_allowed == 1
    assert (steps["charge"].status, steps["charge"].attempt) == (StepStatus.SUCCEEDED, 2)
    assert CALLS.for_tag(tag) == {("always_fails",): 1, ("flaky",): 2}


@on_databases(*VENDORS)
def test_a_run_whose_body_raised_replays(vendor: str, tag: str) -> None:
    engine = memory_engine(database_alias(vendor))
    run = engine.start(body_raises_wf, {"tag": tag})
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert run.status == RunStatus.FAILED
    assert run.error["type"] == "LookupError"

    HEALED.add(tag)
    engine.retry(run.id)
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert (run.status, run.output, run.error) == (RunStatus.COMPLETED, "healed", None)
    assert CALLS.count(tag, "record") == 1  # the succeeded step was not run again


@on_databases(*VENDORS)
def test_retrying_a_parent_retries_the_failed_child(vendor: str, tag: str) -> None:
    engine = memory_engine(database_alias(vendor))
    parent = engine.start(parent_wf, {"tag": tag})
    engine.run_until_idle()
    assert engine.get_run(parent.id).status == RunStatus.FAILED
    child_step = engine.steps().get(run_id=parent.id, name="child")
    child = engine.get_run(child_step.child_run_id)
    assert child.status == RunStatus.FAILED

    engine.retry(parent.id)
    child_step.refresh_from_db()
    assert (child_step.status, child_step.attempt) == (StepStatus.RUNNING, 2)
    assert engine.get_run(child.id).status == RunStatus.RUNNING

    engine.run_until_idle()
    assert engine.get_run(child.id).status == RunStatus.COMPLETED
    parent = engine.get_run(parent.id)
    assert (parent.status, parent.output) == (RunStatus.COMPLETED, {"child": "ok on call 2"})
    history = engine.attempts().filter(step_id=child_step.id).order_by("attempt")
    assert [(a.attempt, a.status) for a in history] == [
        (1, StepStatus.FAILED),
        (2, StepStatus.SUCCEEDED),
    ]


@on_databases(*VENDORS)
def test_a_parent_whose_child_was_retried_alone_takes_its_output(vendor: str, tag: str) -> None:
    engine = memory_engine(database_alias(vendor))
    parent = engine.start(parent_wf, {"tag": tag})
    engine.run_until_idle()
    child_id = engine.steps().get(run_id=parent.id, name="child").child_run_id
    engine.retry(child_id)
    engine.run_until_idle()
    assert engine.get_run(child_id).status == RunStatus.COMPLETED
    assert engine.get_run(parent.id).status == RunStatus.FAILED

    engine.retry(parent.id)
    engine.run_until_idle()
    parent = engine.get_run(parent.id)
    assert (parent.status, parent.output) == (RunStatus.COMPLETED, {"child": "ok on call 2"})


@on_databases(*VENDORS)
def test_retry_keeps_a_compensation_that_ran(vendor: str, tag: str) -> None:
    engine = memory_engine(database_alias(vendor))
    run = engine.start(compensated_queued_wf, {"tag": tag})
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.FAILED
    assert CALLS.count(tag, "undo", "charge") == 1

    engine.retry(run.id)
    engine.run_until_idle()
    run = engine.get_run(run.id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "ok on call 2")
    steps = {s.name: s.status for s in engine.steps().filter(run_id=run.id)}
    assert steps == {"charge": StepStatus.SUCCEEDED, "charge:on_error": StepStatus.SUCCEEDED}
    assert CALLS.count(tag, "undo", "charge") == 1


@on_databases(*VENDORS)
def test_a_parent_whose_child_was_cancelled_is_not_retried(vendor: str, tag: str) -> None:
    engine = memory_engine(database_alias(vendor))
    parent = engine.start(parent_wf, {"tag": tag})
    [due] = engine.claim_due_runs(1)
    engine.orchestrate(due)  # one pass: the parent starts its child and waits
    child_step = engine.steps().get(run_id=parent.id, name="child")
    engine.cancel(child_step.child_run_id)
    engine.run_until_idle()
    assert engine.get_run(parent.id).status == RunStatus.FAILED

    with pytest.raises(WorkflowRunStateError, match="was cancelled: it cannot be retried"):
        engine.retry(parent.id)
    parent = engine.get_run(parent.id)
    assert parent.status == RunStatus.FAILED
    assert parent.error is not None
    child_step.refresh_from_db()
    assert (child_step.status, child_step.attempt) == (StepStatus.FAILED, 1)


@pytest.mark.django_db
def test_retry_of_a_failed_compensation_reopens_it_too(tag: str) -> None:
    engine = memory_engine()
    run, charge = failed_run()
    undo_step = WorkflowStepFactory(
        run=run,
        name="charge:on_error",
        kind=StepKind.INLINE,
        status=StepStatus.FAILED,
        attempt=6,
        retries=5,
    )
    engine.retry(run.id)
    charge.refresh_from_db()
    undo_step.refresh_from_db()
    assert (charge.retries, undo_step.retries) == (1, 6)


@pytest.mark.django_db(transaction=True)
def test_an_inline_run_is_retried_inline(tag: str) -> None:
    engine = memory_engine()
    run = engine.start(compensated_wf, {"tag": tag}, inline=True)
    assert run.status == RunStatus.FAILED
    run = engine.retry(run.id)
    assert (run.status, run.output) == (RunStatus.COMPLETED, "ok on call 2")
    assert CALLS.count(tag, "undo", "charge") == 1


@pytest.mark.django_db(transaction=True)
def test_retry_workflow_uses_the_project_engine(tag: str) -> None:
    run, charge = failed_run()
    assert retry_workflow(run.id).status == RunStatus.RUNNING
    charge.refresh_from_db()
    assert (charge.status, charge.retries) == (StepStatus.FAILED, 1)


# -- who sees and runs the actions ------------------------------------------------------------


@pytest.mark.django_db
def test_superuser_is_offered_every_action(admin_client: Client) -> None:
    WorkflowRunFactory()
    page = body(admin_client.get(reverse(RUNS)))
    for action in ("cancel_runs", "resume_runs", "retry_runs", "delete_selected"):
        assert f'value="{action}"' in page
    assert "needs “Can change workflow run”" in page


@pytest.mark.django_db
def test_view_permission_shows_runs_but_no_actions(django_user_model: Any) -> None:
    run = WorkflowRunFactory(workflow="adm-visible")
    client = client_for(staff(django_user_model, "view_workflowrun"))
    page = body(client.get(reverse(RUNS)))
    assert "adm-visible" in page
    assert 'name="action"' not in page
    assert "cancel_runs" not in page
    assert body(client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk])))


@pytest.mark.parametrize("action", ["cancel_runs", "resume_runs", "retry_runs"])
@pytest.mark.django_db
def test_posting_an_action_without_change_permission_changes_nothing(
    django_user_model: Any, action: str
) -> None:
    running = WorkflowRunFactory(status=RunStatus.RUNNING)
    suspended = WorkflowRunFactory(status=RunStatus.SUSPENDED)
    failed, charge = failed_run()
    client = client_for(staff(django_user_model, "view_workflowrun"))
    response = act(client, action, [running, suspended, failed])
    assert response.status_code in (200, 302)
    assert [status_of(r) for r in (running, suspended, failed)] == [
        RunStatus.RUNNING,
        RunStatus.SUSPENDED,
        RunStatus.FAILED,
    ]
    charge.refresh_from_db()
    assert charge.retries == 0


@pytest.mark.django_db
def test_staff_without_view_permission_is_refused(django_user_model: Any) -> None:
    run = WorkflowRunFactory(status=RunStatus.RUNNING)
    client = client_for(staff(django_user_model))
    assert client.get(reverse(RUNS)).status_code == 403
    assert act(client, "cancel_runs", [run]).status_code == 403
    assert status_of(run) == RunStatus.RUNNING


@pytest.mark.django_db
def test_change_permission_offers_the_operator_actions_but_not_delete(
    django_user_model: Any,
) -> None:
    run = WorkflowRunFactory(status=RunStatus.COMPLETED)
    client = client_for(staff(django_user_model, "view_workflowrun", "change_workflowrun"))
    page = body(client.get(reverse(RUNS)))
    for action in ("cancel_runs", "resume_runs", "retry_runs"):
        assert f'value="{action}"' in page
    assert 'value="delete_selected"' not in page
    act(client, "delete_selected", [run], post="yes")
    assert WorkflowRun.objects.filter(pk=run.pk).exists()


# -- the actions --------------------------------------------------------------------------


@pytest.mark.django_db
def test_cancel_action_reports_per_run(django_user_model: Any) -> None:
    running = WorkflowRunFactory(status=RunStatus.RUNNING)
    suspended = WorkflowRunFactory(status=RunStatus.SUSPENDED)
    completed = WorkflowRunFactory(status=RunStatus.COMPLETED)
    client = client_for(staff(django_user_model, "view_workflowrun", "change_workflowrun"))
    response = act(client, "cancel_runs", [running, suspended, completed])
    assert response.status_code == 302
    assert said(response) == [("warning", "Cancelled 2 runs; 1 was already completed.")]
    assert [status_of(r) for r in (running, suspended, completed)] == [
        RunStatus.CANCELLED,
        RunStatus.CANCELLED,
        RunStatus.COMPLETED,
    ]


@pytest.mark.django_db
def test_cancel_action_success_only(admin_client: Client) -> None:
    run = WorkflowRunFactory(status=RunStatus.RUNNING)
    response = act(admin_client, "cancel_runs", [run])
    assert said(response) == [("success", "Cancelled 1 run.")]
    assert status_of(run) == RunStatus.CANCELLED


@pytest.mark.django_db
def test_resume_action_resumes_suspended_runs_only(admin_client: Client) -> None:
    suspended = WorkflowRunFactory(
        status=RunStatus.SUSPENDED, suspend_reason="needs a human", workflow="adm_approval"
    )
    waiting = WorkflowStepFactory(
        run=suspended,
        name="suspend",
        kind=StepKind.SUSPEND,
        status=StepStatus.SUSPENDED,
        retries=0,
        input={"reason": "needs a human"},
    )
    running = WorkflowRunFactory(status=RunStatus.RUNNING)
    cancelled = WorkflowRunFactory(status=RunStatus.CANCELLED)
    response = act(admin_client, "resume_runs", [suspended, running, cancelled])
    assert said(response) == [
        (
            "warning",
            "Resumed 1 run; 1 was cancelled, not suspended; 1 was running, not suspended.",
        )
    ]
    suspended.refresh_from_db()
    assert (suspended.status, suspended.suspend_reason) == (RunStatus.RUNNING, "")
    waiting.refresh_from_db()
    assert (waiting.status, waiting.result) == (StepStatus.SUCCEEDED, None)
    assert status_of(running) == RunStatus.RUNNING
    assert status_of(cancelled) == RunStatus.CANCELLED


@pytest.mark.django_db
def test_retry_action_reopens_failed_runs(admin_client: Client) -> None:
    failed, charge = failed_run()
    completed = WorkflowRunFactory(status=RunStatus.COMPLETED)
    response = act(admin_client, "retry_runs", [failed, completed])
    assert said(response) == [("warning", "Retried 1 run; 1 was completed, not failed.")]
    failed.refresh_from_db()
    assert (failed.status, failed.error) == (RunStatus.RUNNING, None)
    assert failed.wake_at is not None
    charge.refresh_from_db()
    assert (charge.status, charge.attempt, charge.retries) == (StepStatus.FAILED, 1, 1)
    assert charge.available_at is not None


@pytest.mark.django_db
def test_an_action_reports_runs_it_could_not_handle(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = WorkflowRunFactory(status=RunStatus.RUNNING)

    def broken(self: WorkflowEngine, run_id: Any) -> None:
        raise RuntimeError("database on fire")

    monkeypatch.setattr(WorkflowEngine, "cancel", broken)
    response = act(admin_client, "cancel_runs", [run])
    assert said(response) == [
        ("error", f"1 run could not be cancelled: {run.pk} (RuntimeError: database on fire)"),
    ]
    assert status_of(run) == RunStatus.RUNNING


@pytest.mark.django_db
def test_a_run_that_moved_on_meanwhile_is_reported_as_skipped(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = WorkflowRunFactory(status=RunStatus.RUNNING)
    real_cancel = WorkflowEngine.cancel

    def finishes_first(self: WorkflowEngine, run_id: Any) -> Any:
        WorkflowRun.objects.filter(pk=run_id).update(status=RunStatus.COMPLETED)
        return real_cancel(self, run_id)

    monkeypatch.setattr(WorkflowEngine, "cancel", finishes_first)
    response = act(admin_client, "cancel_runs", [run])
    assert said(response) == [("warning", "Cancelled 0 runs; 1 was already completed.")]


@pytest.mark.django_db
def test_a_retry_the_engine_refuses_is_reported_as_an_error(admin_client: Client) -> None:
    cancelled_child = WorkflowRunFactory(status=RunStatus.CANCELLED)
    parent = WorkflowRunFactory(status=RunStatus.FAILED)
    WorkflowStepFactory(
        run=parent,
        name="child",
        kind=StepKind.CHILD,
        status=StepStatus.FAILED,
        attempt=1,
        retries=0,
        child_run=cancelled_child,
    )
    response = act(admin_client, "retry_runs", [parent])
    [(level, text)] = said(response)
    assert level == "error"
    assert text.startswith(f"1 run could not be retried: {parent.pk} (Step 'child' of run")
    assert "was cancelled: it cannot be retried; start a new run)" in text
    assert status_of(parent) == RunStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_retry_from_the_admin_then_the_run_completes(admin_client: Client, tag: str) -> None:
    engine = memory_engine()
    run = engine.start(flaky_wf, {"tag": tag, "failures": 1, "retries": 0})
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.FAILED
    response = act(admin_client, "retry_runs", [run])
    assert said(response) == [("success", "Retried 1 run.")]
    engine.clock.advance(60)  # past the real-time stamps of the admin's engine
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.COMPLETED


# -- deleting ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_deleting_a_finished_run_takes_its_steps_and_attempts(admin_client: Client) -> None:
    run, charge = failed_run()
    url = reverse("admin:pikku_django_workflowrun_delete", args=[run.pk])
    confirm = body(admin_client.get(url))
    assert "Workflow step: charge" in confirm
    assert "Attempt 1 (failed)" in confirm
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not WorkflowRun.objects.filter(pk=run.pk).exists()
    assert not WorkflowStep.objects.filter(pk=charge.pk).exists()
    assert not StepAttempt.objects.filter(step_id=charge.pk).exists()


@pytest.mark.django_db
def test_a_live_run_cannot_be_deleted(admin_client: Client) -> None:
    running = WorkflowRunFactory(status=RunStatus.RUNNING)
    completed = WorkflowRunFactory(status=RunStatus.COMPLETED)
    url = reverse("admin:pikku_django_workflowrun_delete", args=[running.pk])
    assert admin_client.get(url).status_code == 403
    assert admin_client.post(url, {"post": "yes"}).status_code == 403

    response = act(admin_client, "delete_selected", [running, completed], post="yes")
    assert said(response) == [
        (
            "error",
            "Nothing was deleted: 1 selected run is still running or suspended. Cancel it first.",
        )
    ]
    assert WorkflowRun.objects.filter(pk__in=[running.pk, completed.pk]).count() == 2


@pytest.mark.django_db
def test_bulk_delete_of_finished_runs_confirms_then_deletes(admin_client: Client) -> None:
    runs = [WorkflowRunFactory(status=s) for s in (RunStatus.COMPLETED, RunStatus.CANCELLED)]
    confirm = body(act(admin_client, "delete_selected", runs))
    assert "Are you sure" in confirm
    assert WorkflowRun.objects.count() == 2
    response = act(admin_client, "delete_selected", runs, post="yes")
    assert said(response) == [("success", "Successfully deleted 2 workflow runs.")]
    assert not WorkflowRun.objects.exists()


@pytest.mark.django_db
def test_delete_needs_the_delete_permission(django_user_model: Any) -> None:
    run = WorkflowRunFactory(status=RunStatus.COMPLETED)
    viewer = client_for(staff(django_user_model, "view_workflowrun", "change_workflowrun"))
    url = reverse("admin:pikku_django_workflowrun_delete", args=[run.pk])
    assert viewer.post(url, {"post": "yes"}).status_code == 403
    deleter = client_for(staff(django_user_model, "view_workflowrun", "delete_workflowrun"))
    assert deleter.post(url, {"post": "yes"}).status_code == 302
    assert not WorkflowRun.objects.filter(pk=run.pk).exists()


# -- read-only screens ------------------------------------------------------------------------


@pytest.mark.django_db
def test_nothing_is_added_or_edited_here(admin_client: Client) -> None:
    run, charge = failed_run()
    attempt = StepAttempt.objects.get(step=charge)
    for model in ("workflowrun", "workflowstep", "stepattempt"):
        assert admin_client.get(reverse(f"admin:pikku_django_{model}_add")).status_code == 403
    change = reverse("admin:pikku_django_workflowrun_change", args=[run.pk])
    page = body(admin_client.get(change))
    assert 'name="_save"' not in page
    assert admin_client.post(change, {"status": "completed"}).status_code == 403
    assert status_of(run) == RunStatus.FAILED
    for model, obj in (("workflowstep", charge), ("stepattempt", attempt)):
        url = reverse(f"admin:pikku_django_{model}_change", args=[obj.pk])
        assert 'name="_save"' not in body(admin_client.get(url))
        assert admin_client.post(url, {"status": "succeeded"}).status_code == 403
        delete = reverse(f"admin:pikku_django_{model}_delete", args=[obj.pk])
        assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    charge.refresh_from_db()
    assert charge.status == StepStatus.FAILED
    assert StepAttempt.objects.filter(pk=attempt.pk).exists()


@pytest.mark.django_db
def test_run_page_shows_the_step_timeline_with_attempts(admin_client: Client) -> None:
    t0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    run = WorkflowRunFactory(
        workflow="adm-shop",
        status=RunStatus.RUNNING,
        input={"note": "<script>alert('in')</script>", "amount": 1999},
        idempotency_key="order-42",
    )
    charged = WorkflowStepFactory(
        run=run,
        name="charge",
        function="shop.charge",
        status=StepStatus.SUCCEEDED,
        attempt=2,
        retries=5,
        result={"charge_id": "ch_<1>"},
    )
    StepAttemptFactory(
        step=charged,
        attempt=1,
        status=StepStatus.FAILED,
        worker="host-a:1",
        error={"type": "TimeoutError", "message": "gateway <timeout>", "traceback": "TB line"},
        finished_at=t0 + timedelta(seconds=1),
    )
    StepAttemptFactory(
        step=charged,
        attempt=2,
        status=StepStatus.SUCCEEDED,
        worker="host-b:2",
        finished_at=t0 + timedelta(seconds=3),
    )
    WorkflowStep.objects.filter(pk=charged.pk).update(
        created_at=t0, updated_at=t0 + timedelta(milliseconds=2500)
    )
    shipping = WorkflowStepFactory(
        run=run,
        name="ship",
        status=StepStatus.RUNNING,
        attempt=1,
        retries=2,
        lease_expires_at=process_now_ms() + 45_000,
    )
    StepAttemptFactory(step=shipping, attempt=1, worker="host-c:3")
    child = WorkflowRunFactory(workflow="adm-child", status=RunStatus.FAILED)
    WorkflowStepFactory(
        run=run,
        name="child",
        kind=StepKind.CHILD,
        function="adm-child",
        status=StepStatus.FAILED,
        attempt=1,
        retries=0,
        child_run=child,
        error={"type": "ValueError", "message": "child <b>broke</b>"},
    )

    page = body(admin_client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk])))
    timeline = page[page.index('id="pikku-timeline"') :]
    # Steps in order, with kind, status, attempt/allowed and duration.
    assert timeline.index(">charge<") < timeline.index(">ship<") < timeline.index(">child<")
    assert "shop.charge" in timeline
    assert "2/6" in timeline
    assert "1/3" in timeline
    assert "1/1" in timeline
    assert "2.5 s" in timeline
    assert "child workflow" in timeline
    # The running step's lease, in milliseconds left.
    left = re.search(r"<td>(\d\d),(\d{3}) ms</td>", timeline)
    assert left is not None
    assert 40_000 < int(left[1] + left[2]) <= 45_000
    # Each step's attempts.
    for text in ("host-a:1", "host-b:2", "host-c:3", "TimeoutError", "gateway &lt;timeout&gt;"):
        assert text in timeline
    # A link to the child run; the child's page links back to its parent.
    assert reverse("admin:pikku_django_workflowrun_change", args=[child.pk]) in timeline
    child_page = body(
        admin_client.get(reverse("admin:pikku_django_workflowrun_change", args=[child.pk]))
    )
    assert reverse("admin:pikku_django_workflowrun_change", args=[run.pk]) in child_page
    # JSON is indented and escaped everywhere; nothing from the data is markup.
    assert "&lt;script&gt;alert(&#x27;in&#x27;)&lt;/script&gt;" in page
    assert "<script>alert" not in page
    assert "child &lt;b&gt;broke&lt;/b&gt;" in page
    assert "<b>broke</b>" not in page
    assert "  &quot;amount&quot;: 1999,\n" in page
    assert "ch_&lt;1&gt;" in page
    assert "order-42" in page


@pytest.mark.django_db
def test_run_page_shows_a_failed_run_error_and_traceback(admin_client: Client) -> None:
    run = WorkflowRunFactory(
        status=RunStatus.FAILED,
        error={"type": "KeyError", "message": "'<missing>'", "traceback": "Traceback <here>"},
    )
    page = body(admin_client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk])))
    assert "&quot;type&quot;: &quot;KeyError&quot;" in page
    assert '<pre class="pikku-traceback">Traceback &lt;here&gt;</pre>' in page
    assert "This run has no steps yet." in page


# -- lists, filters and search ------------------------------------------------------------------


@pytest.mark.django_db
def test_run_list_columns_filters_and_search(admin_client: Client) -> None:
    old = WorkflowRunFactory(workflow="adm-alpha", status=RunStatus.FAILED, idempotency_key="k-1")
    WorkflowRun.objects.filter(pk=old.pk).update(created_at=datetime(2020, 1, 15, tzinfo=UTC))
    new = WorkflowRunFactory(workflow="adm-beta", status=RunStatus.RUNNING, inline=True)
    url = reverse(RUNS)

    page = body(admin_client.get(url))
    for text in (str(old.pk), str(new.pk), "adm-alpha", "adm-beta", "pikku-badge-failed"):
        assert text in page

    def shown(params: dict[str, str]) -> list[WorkflowRun]:
        return listed(admin_client, url, [old, new], params)

    assert shown({}) == [old, new]
    assert shown({"status__exact": "failed"}) == [old]
    assert shown({"status__exact": "running"}) == [new]
    assert shown({"workflow": "adm-beta"}) == [new]
    assert shown({"created_at__year": "2020"}) == [old]
    assert shown({"created_at__year": "2020", "created_at__month": "1"}) == [old]
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    since_today = {"created_at__gte": str(midnight), "created_at__lt": str(midnight + DAY)}
    assert shown(since_today) == [new]
    assert shown({"q": str(old.pk)}) == [old]
    assert shown({"q": str(new.pk)[:8]}) == [new]
    assert shown({"q": "k-1"}) == [old]
    assert shown({"q": "no-such-thing"}) == []
    # The workflow filter offers each workflow name.
    assert "?workflow=adm-alpha" in page


@pytest.mark.django_db
def test_step_list_columns_filters_and_search(admin_client: Client) -> None:
    run_a = WorkflowRunFactory(workflow="adm-a")
    run_b = WorkflowRunFactory(workflow="adm-b")
    queued = WorkflowStepFactory(
        run=run_a,
        name="adm-pay",
        function="shop.pay",
        queue="payments",
        status=StepStatus.RUNNING,
        attempt=2,
        retries=3,
        lease_expires_at=process_now_ms() + 30_000,
    )
    sleeping = WorkflowStepFactory(
        run=run_b, name="adm-nap", kind=StepKind.SLEEP, function="", retries=0
    )
    url = reverse(STEPS)
    page = body(admin_client.get(url))
    assert "adm-pay" in page
    assert "2/4" in page
    assert "payments" in page
    assert re.search(r"\d\d,\d{3} ms", page)
    assert reverse("admin:pikku_django_workflowrun_change", args=[run_a.pk]) in page

    def shown(params: dict[str, str]) -> list[str]:
        return [s.name for s in listed(admin_client, url, [queued, sleeping], params)]

    assert shown({}) == ["adm-pay", "adm-nap"]
    assert shown({"status__exact": "running"}) == ["adm-pay"]
    assert shown({"kind__exact": "sleep"}) == ["adm-nap"]
    assert shown({"queue": "payments"}) == ["adm-pay"]
    assert shown({"q": "adm-nap"}) == ["adm-nap"]
    assert shown({"q": "shop.pay"}) == ["adm-pay"]
    assert shown({"q": str(run_b.pk)}) == ["adm-nap"]
    assert shown({"q": str(run_a.pk)[:8]}) == ["adm-pay"]

    # The step page lists its attempts.
    StepAttemptFactory(step=queued, attempt=1, status=StepStatus.FAILED, worker="host-x:9")
    step_page = body(
        admin_client.get(reverse("admin:pikku_django_workflowstep_change", args=[queued.pk]))
    )
    assert "host-x:9" in step_page


@pytest.mark.django_db
def test_attempt_list_is_read_only_and_searchable(admin_client: Client) -> None:
    step_a = WorkflowStepFactory(name="adm-step-a")
    step_b = WorkflowStepFactory(name="adm-step-b")
    one = StepAttemptFactory(
        step=step_a,
        worker="host-one:1",
        status=StepStatus.FAILED,
        error={"type": "OSError", "message": "disk <full>"},
    )
    two = StepAttemptFactory(step=step_b, worker="host-two:2", status=StepStatus.SUCCEEDED)
    url = reverse(ATTEMPTS)
    page = body(admin_client.get(url))
    assert "host-one:1" in page
    assert "OSError" in page
    assert "disk &lt;full&gt;" in page
    assert 'name="action"' not in page  # no delete action either

    def shown(params: dict[str, str]) -> list[StepAttempt]:
        return listed(admin_client, url, [one, two], params)

    assert shown({}) == [one, two]
    assert shown({"status__exact": "failed"}) == [one]
    assert shown({"q": "host-two"}) == [two]
    assert shown({"q": "adm-step-a"}) == [one]
    assert shown({"q": str(step_b.run_id)}) == [two]


@on_databases("postgres", "mariadb")
def test_the_admin_reads_the_workflow_database(vendor: str, admin_user: Any, settings: Any) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    run = WorkflowRunFactory(database=alias, workflow="adm-elsewhere", status=RunStatus.RUNNING)
    WorkflowStepFactory(database=alias, run=run, name="adm-remote-step")
    client = client_for(admin_user)
    assert "adm-elsewhere" in body(client.get(reverse(RUNS)))
    assert "adm-remote-step" in body(client.get(reverse(STEPS)))
    page = body(client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk])))
    assert "adm-remote-step" in page
    response = act(client, "cancel_runs", [run])
    assert said(response) == [("success", "Cancelled 1 run.")]
    assert WorkflowRun.objects.using(alias).get(pk=run.pk).status == RunStatus.CANCELLED
