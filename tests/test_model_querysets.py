"""The models' QuerySet methods: each question answered by one method, which the admin,
the commands and the engine share."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from pikku_django.models import (
    RunStatus,
    StepKind,
    StepStatus,
    WebhookReceipt,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.models.workflows import StepAttempt
from pikku_django.webhooks.dispatch import waiting_receipts
from pikku_django.workflows import WorkflowEngine
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory

pytestmark = pytest.mark.django_db


def test_runs_by_where_they_are_in_their_life() -> None:
    now = timezone.now()
    runs = {
        status: WorkflowRunFactory(workflow=f"qs-{status}", status=status)
        for status in RunStatus.values
    }
    WorkflowRun.objects.filter(pk=runs[RunStatus.RUNNING].pk).update(wake_at=now)
    WorkflowRunFactory(workflow="qs-later", wake_at=now + timedelta(hours=1))
    inline = WorkflowRunFactory(workflow="qs-inline", wake_at=now, inline=True)

    def names(qs: object) -> set[str]:
        return set(qs.values_list("workflow", flat=True))  # type: ignore[attr-defined]

    everyone = WorkflowRun.objects.all()
    assert names(everyone.active()) == {"qs-running", "qs-suspended", "qs-later", "qs-inline"}
    assert names(everyone.settled()) == {"qs-completed", "qs-failed", "qs-cancelled"}
    assert names(everyone.failed()) == {"qs-failed"}
    assert names(everyone.stuck()) == {"qs-failed", "qs-suspended"}
    assert names(everyone.due(now)) == {"qs-running"}
    assert names(everyone.due(now + timedelta(hours=2))) == {"qs-running", "qs-later"}
    assert inline.pk not in set(everyone.due(now).values_list("pk", flat=True))
    # They chain, with each other and with using().
    assert names(WorkflowRun.objects.using("default").active().stuck()) == {"qs-suspended"}


def test_runs_with_a_step_on_a_queue() -> None:
    mailing, other = WorkflowRunFactory(), WorkflowRunFactory()
    WorkflowStepFactory(run=mailing, name="a", queue="mail")
    WorkflowStepFactory(run=mailing, name="b", queue="mail")
    WorkflowStepFactory(run=other, name="a", queue="default")
    assert list(WorkflowRun.objects.with_step_on("mail")) == [mailing]
    assert not WorkflowRun.objects.with_step_on("nowhere").exists()


def test_steps_ready_running_and_open() -> None:
    now = timezone.now()
    run = WorkflowRunFactory()

    def step(name: str, **fields: object) -> WorkflowStep:
        return WorkflowStepFactory(run=run, name=name, kind=StepKind.QUEUED, **fields)

    due = step("due", status=StepStatus.SCHEDULED, available_at=now - timedelta(seconds=1))
    pending = step("pending", status=StepStatus.PENDING, available_at=now)
    not_yet = step("not-yet", status=StepStatus.SCHEDULED, available_at=now + timedelta(hours=1))
    running = step("running", status=StepStatus.RUNNING)
    step("done", status=StepStatus.SUCCEEDED)
    WorkflowStepFactory(
        run=run, name="sleep", kind=StepKind.SLEEP, status=StepStatus.SCHEDULED, available_at=now
    )
    steps = WorkflowStep.objects.all()
    assert set(steps.ready(now)) == {due, pending}
    assert set(steps.running()) == {running}
    assert set(steps.open_queued()) == {due, pending, not_yet, running}
    assert steps.of_run(run.pk).count() == 6
    assert not steps.of_run(WorkflowRunFactory().pk).exists()


def test_attempts_of_a_step_a_run_and_a_named_step() -> None:
    run = WorkflowRunFactory()
    charge = WorkflowStepFactory(run=run, name="charge")
    mail = WorkflowStepFactory(run=run, name="mail")
    first = StepAttemptFactory(step=charge, attempt=1, status=StepStatus.FAILED)
    second = StepAttemptFactory(step=charge, attempt=2, status=StepStatus.SUCCEEDED)
    StepAttemptFactory(step=mail, attempt=1, status=StepStatus.SUCCEEDED)
    attempts = StepAttempt.objects.all()
    assert list(attempts.of_attempt(charge.pk, 2)) == [second]
    assert set(attempts.of_step_named(run.pk, "charge")) == {first, second}
    assert attempts.of_run(run.pk).count() == 3
    assert list(attempts.failed()) == [first]


def test_receipts_waiting_dealt_with_and_set_aside() -> None:
    run = WorkflowRunFactory()

    def receipt(provider_id: str, **fields: object) -> WebhookReceipt:
        return WebhookReceipt.objects.create(
            source="qs", event="push", provider_id=provider_id, **fields
        )

    waiting = receipt("waiting", input={"n": 1})
    started = receipt("started", run=run)
    aside = receipt("aside", input={"n": 2}, set_aside="unreadable input")
    receipts = WebhookReceipt.objects.all()
    assert list(receipts.waiting()) == [waiting]
    assert set(receipts.dealt_with()) == {started, aside}
    assert list(receipts.set_aside()) == [aside]
    # The worker's look for waiting receipts is this same question.
    assert list(waiting_receipts(WorkflowEngine("default"))) == [waiting]
