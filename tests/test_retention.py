"""Retention: the workers delete settled runs past ``PIKKU["RETENTION"]`` or their
workflow's ``retention=``, through their cron intake, in batches, by pikku_prune's rule."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from pikku_django import retention
from pikku_django.checks import check_settings, check_workflow_settings
from pikku_django.leases import InMemoryLeaseService
from pikku_django.models import RunStatus, Schedule, WebhookReceipt, WorkflowRun, WorkflowStep
from pikku_django.retention import RETENTION_WORKFLOW, apply_retention
from pikku_django.schedules import sync_schedules
from pikku_django.schedules.ticks import forget_process_state
from pikku_django.workflows import WorkflowEngine, registry, workflow
from pikku_django.workflows.worker.loop import Worker
from tests.conftest import database_alias, on_databases
from tests.factories import WorkflowRunFactory, WorkflowStepFactory

ALL = ("sqlite", "postgres", "mariadb")
SHORT = "tests.retention.short"
KEPT = "tests.retention.kept"
OTHER = "tests.retention.other"


def body(ctx: Any, input: Any) -> Any:
    return input


@pytest.fixture
def declared() -> Iterator[None]:
    """Two workflows with a retention of their own: a day, and for ever."""
    workflow(name=SHORT, retention="1d")(body)
    workflow(name=KEPT, retention="forever")(body)
    yield
    registry.unregister(SHORT)
    registry.unregister(KEPT)


@pytest.fixture(autouse=True)
def fresh_sync() -> Iterator[None]:
    forget_process_state()
    yield
    forget_process_state()


def use(settings: Any, alias: str, **pikku: Any) -> None:
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "LEASE_DATABASE": alias, **pikku}


def run(alias: str, status: str, days: float | None = None, name: str = OTHER) -> WorkflowRun:
    made = WorkflowRunFactory(status=status, workflow=name, database=alias)
    if days is not None:
        WorkflowRun.objects.using(alias).filter(id=made.id).update(
            updated_at=timezone.now() - timedelta(days=days)
        )
    return made


def left(alias: str) -> set[uuid.UUID]:
    return set(WorkflowRun.objects.using(alias).values_list("id", flat=True))


@on_databases(*ALL)
def test_retention_keeps_what_runs_and_what_a_live_parent_needs(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    use(settings, alias, RETENTION="30d")
    old_done = run(alias, "completed", 40)
    old_failed = run(alias, "failed", 40)
    recent = run(alias, "completed", 5)
    old_running = run(alias, "running", 40)
    old_suspended = run(alias, "suspended", 40)
    # A finished child of a running parent is kept while the parent waits on it.
    parent = run(alias, "running")
    child = run(alias, "completed", 40)
    WorkflowStepFactory(run=parent, kind="child", child_run=child, database=alias)
    # A finished parent past retention goes with its finished children.
    old_parent = run(alias, "cancelled", 41)
    old_child = run(alias, "completed", 40)
    WorkflowStepFactory(run=old_parent, kind="child", child_run=old_child, database=alias)
    receipts = WebhookReceipt.objects.using(alias)
    old_receipt = receipts.create(source="s", event="e", provider_id="1")
    receipts.filter(pk=old_receipt.pk).update(received_at=timezone.now() - timedelta(days=40))
    receipts.create(source="s", event="e", provider_id="2")

    report = apply_retention(using=alias)

    assert (report.runs, report.receipts, report.more) == (4, 1, False)
    assert left(alias) == {recent.id, old_running.id, old_suspended.id, parent.id, child.id}
    assert not {old_done.id, old_failed.id, old_parent.id, old_child.id} & left(alias)
    assert list(receipts.values_list("provider_id", flat=True)) == ["2"]


@on_databases(*ALL)
def test_a_workflow_retention_wins_over_the_default(
    vendor: str, settings: Any, declared: None
) -> None:
    alias = database_alias(vendor)
    short_old = run(alias, "completed", 2, SHORT)
    short_new = run(alias, "completed", 0.5, SHORT)
    kept = run(alias, "failed", 400, KEPT)
    other_old = run(alias, "completed", 40)
    other_new = run(alias, "completed", 10)

    use(settings, alias)  # no default: only the workflow's own retention applies
    assert apply_retention(using=alias).runs == 1
    assert left(alias) == {short_new.id, kept.id, other_old.id, other_new.id}
    assert short_old.id not in left(alias)

    use(settings, alias, RETENTION="30d")
    assert apply_retention(using=alias).runs == 1
    assert left(alias) == {short_new.id, kept.id, other_new.id}


@on_databases(*ALL)
def test_the_job_runs_through_a_worker_cron_intake(vendor: str, settings: Any) -> None:
    alias = database_alias(vendor)
    use(settings, alias)
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    worker = Worker(engine, concurrency=1, poll_interval=300)
    # No retention: no schedule, and nothing changes.
    sync_schedules(using=alias)
    assert not Schedule.objects.using(alias).filter(name=RETENTION_WORKFLOW).exists()

    use(settings, alias, RETENTION="30d")
    old = run(alias, "completed", 40)
    recent = run(alias, "completed", 5)
    earlier_job = run(alias, "completed", 8, RETENTION_WORKFLOW)  # its own: kept 7 days
    # Declared an hour and a half ago: its hourly tick is due now.
    sync_schedules(timezone.now() - timedelta(minutes=90), using=alias)
    schedule = Schedule.objects.using(alias).get(name=RETENTION_WORKFLOW)
    assert schedule.cron == "0 * * * *"
    assert schedule.next_tick_at is not None
    assert schedule.next_tick_at <= timezone.now()

    worker._start_waiting_runs()
    (job,) = WorkflowRun.objects.using(alias).filter(
        workflow=RETENTION_WORKFLOW, idempotency_key__startswith="schedule:pikku.retention:"
    )
    worker._start_waiting_runs()  # one run per tick
    assert WorkflowRun.objects.using(alias).filter(workflow=RETENTION_WORKFLOW).count() == 2
    engine.run_until_idle()

    job.refresh_from_db(using=alias)
    assert job.status == RunStatus.COMPLETED
    assert job.output == {"runs": 2, "receipts": 0, "heartbeats": 0, "digests": 0}
    assert left(alias) == {recent.id, job.id}
    assert earlier_job.id not in left(alias)
    assert old.id not in left(alias)


@on_databases(*ALL)
def test_batches_are_bounded(vendor: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    alias = database_alias(vendor)
    use(settings, alias, RETENTION="30d")
    for _ in range(5):
        run(alias, "completed", 40)
    batches: list[int] = []
    delete = retention.delete_runs_and_leases

    def counted(using: str, ids: Any) -> int:
        batches.append(len(ids))
        return delete(using, ids)

    monkeypatch.setattr(retention, "delete_runs_and_leases", counted)
    assert apply_retention(using=alias, batch_size=2).runs == 5
    assert batches == [2, 2, 1]
    assert left(alias) == set()


@on_databases(*ALL)
def test_a_job_out_of_time_goes_on_in_another_step(
    vendor: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alias = database_alias(vendor)
    use(settings, alias, RETENTION="30d")
    for _ in range(5):
        run(alias, "completed", 40)
    # Out of time at once: one batch of each kind of row, and more to do.
    first = apply_retention(using=alias, batch_size=2, seconds=0)
    assert (first.runs, first.more) == (2, True)
    # A step's time is half its lease: none here, so each step deletes one batch.
    monkeypatch.setattr(retention, "engine_config", lambda: SimpleNamespace(step_lease_ms=0))
    engine = WorkflowEngine(alias, leases=InMemoryLeaseService())
    job = engine.start(RETENTION_WORKFLOW, {"batch_size": 2})
    engine.run_until_idle()
    done = engine.get_run(job.id)
    assert done.status == RunStatus.COMPLETED
    assert done.output["runs"] == 3
    steps = WorkflowStep.objects.using(alias).filter(run_id=job.id).order_by("id")
    assert [s.name for s in steps] == ["prune-1", "prune-2"]
    assert left(alias) == {job.id}


@pytest.mark.parametrize("value", ["soon", 0, -1, True, "0d", [30]])
def test_a_bad_workflow_retention_is_refused_at_decoration(value: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="retention"):
        workflow(name="tests.retention.bad", retention=value)(body)
    assert registry.get_workflow("tests.retention.bad") is None


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ("30d", []),
        (None, []),
        (3600, []),
        ("soon", ["pikku_django.E021"]),
        (0, ["pikku_django.E021"]),
        ([30], ["pikku_django.E021"]),
    ],
)
def test_a_bad_default_retention_is_a_system_check_error(
    settings: Any, value: Any, found: list[str]
) -> None:
    settings.PIKKU = {"RETENTION": value}
    messages: list[checks.CheckMessage] = check_settings() + check_workflow_settings()
    assert [m.id for m in messages] == found
    if found:
        assert "RETENTION" in messages[0].msg
