"""Contract of pikku_django.tasks.PikkuBackend: what django.tasks asks of a database backend.

Modelled on the scenarios of Django's tests/tasks and the backport's database backend
tests, on each database, with the framework that is installed (django.tasks on Django
6.0+, the django-tasks backport on 5.2). Workers here run in this process
(``run_until_idle``); tests/test_tasks_worker.py runs real ``pikku_worker`` processes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import django
import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.utils import timezone

from pikku_django.models import RunStatus, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.tasks import PikkuBackend, compat
from pikku_django.tasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
)
from pikku_django.workflows.api import cancel_workflow, get_engine, reset_engine, start_workflow
from tests import test_tasks_defs as defs
from tests.conftest import database_alias, on_databases

ALL = ("sqlite", "postgres", "mariadb")


@pytest.fixture
def alias(vendor: str, settings: Any) -> Iterator[str]:
    """Task runs on ``vendor``'s database, leases in memory, a fresh engine."""
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias, "LEASE_BACKEND": "memory"}
    reset_engine()
    yield alias
    reset_engine()


def work(queues: list[str] | None = None) -> int:
    """What a worker does now: every due pass and step, in this thread."""
    return get_engine().run_until_idle(queues)


def run_of(alias: str, result: Any) -> WorkflowRun:
    return WorkflowRun.objects.using(alias).get(id=result.id)


def step_of(alias: str, result: Any) -> WorkflowStep:
    return WorkflowStep.objects.using(alias).get(run_id=result.id, name="task")


class Signals:
    """The task signals received, as (signal name, sender, status)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, type, str, Any]] = []

    def __enter__(self) -> Signals:
        for name in ("task_enqueued", "task_started", "task_finished"):
            getattr(compat, name).connect(self._receiver(name), weak=False, dispatch_uid=name)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("task_enqueued", "task_started", "task_finished"):
            getattr(compat, name).disconnect(dispatch_uid=name)

    def _receiver(self, name: str) -> Any:
        def receive(sender: type, task_result: Any, **kwargs: Any) -> None:
            self.received.append((name, sender, str(task_result.status), task_result))

        return receive

    def names(self) -> list[tuple[str, str]]:
        return [(name, status) for name, _, status, _ in self.received]


# -- the backend and its capabilities ----------------------------------------------------


def test_the_configured_backend_is_pikku_on_the_installed_framework() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, PikkuBackend)
    assert backend.alias == "default"
    assert backend.queues == {"default", "emails"}
    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert expected == compat.FRAMEWORK
    assert type(backend).__mro__[1].__module__.startswith(expected)
    assert backend.supports_get_result is True
    assert backend.supports_async_task is True


def test_defer_and_priority_are_supported() -> None:
    backend = task_backends["default"]
    assert backend.supports_defer is True
    assert backend.supports_priority is True


@on_databases(*ALL)
def test_run_after_is_not_claimed_before_its_time(vendor: str, alias: str) -> None:
    later = timezone.now() + timedelta(hours=1)
    result = defs.add.using(run_after=later).enqueue(1, 2)
    work()
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 0
    run = WorkflowRun.objects.using(alias).get(pk=result.id)
    assert run.start_at == later


@on_databases(*ALL)
def test_a_run_after_already_past_runs_at_once(vendor: str, alias: str) -> None:
    result = defs.add.using(run_after=timezone.now() - timedelta(seconds=1)).enqueue(1, 2)
    work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3


@on_databases(*ALL)
def test_priority_orders_claims(vendor: str, alias: str) -> None:
    low = defs.add.using(priority=-10).enqueue(1)
    high = defs.add.using(priority=10).enqueue(2)
    engine = get_engine()
    while engine.work_once():
        low.refresh()
        high.refresh()
        if low.status == TaskResultStatus.SUCCESSFUL:
            break
    assert high.status == TaskResultStatus.SUCCESSFUL
    assert high.finished_at <= low.finished_at


# -- validating tasks ------------------------------------------------------------------


@pytest.mark.django_db
def test_an_unknown_queue_is_refused_clearly() -> None:
    with pytest.raises(InvalidTask, match=r"'reports' is not one of the QUEUES.*default, emails"):
        defs.add.using(queue_name="reports")
    assert defs.send_email.queue_name == "emails"


def test_tasks_are_validated_as_the_base_backend_does() -> None:
    def local(a: int) -> int:
        return a

    with pytest.raises(InvalidTask, match="module level"):
        compat.task()(local)
    with pytest.raises(InvalidTask, match="context"):
        compat.task(takes_context=True)(defs.add.func)
    with pytest.raises(InvalidTask, match="priority"):
        defs.add.using(priority=101)


def test_bad_task_options_are_refused_when_the_task_is_declared() -> None:
    with pytest.raises(InvalidTask, match="retries must be an int"):
        compat.task(retries=-1)(defs.add.func)
    with pytest.raises(InvalidTask, match="backoff must be"):
        compat.task(backoff="sometimes")(defs.add.func)
    with pytest.raises(InvalidTask, match="retry_delay"):
        compat.task(retry_delay="soon")(defs.add.func)


def test_bad_backend_options_are_a_clear_error() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"TASKS\['x'\]\['OPTIONS'\].*unknown keys"):
        PikkuBackend("x", {"OPTIONS": {"retires": 3}})
    with pytest.raises(ImproperlyConfigured, match="retries must be an int"):
        PikkuBackend("x", {"OPTIONS": {"retries": "3"}})


# -- enqueue and results -----------------------------------------------------------------


@on_databases(*ALL)
def test_enqueue_returns_a_ready_result_whose_id_is_the_run(vendor: str, alias: str) -> None:
    for task in (defs.noop, defs.add_async):
        with Signals() as signals:
            result = task.enqueue(1, two=3)
        run = run_of(alias, result)
        assert uuid.UUID(result.id) == run.id
        assert run.workflow == f"task:{task.module_path}"
        assert run.status == RunStatus.RUNNING
        assert result.status == TaskResultStatus.READY
        assert not result.is_finished
        # When enqueue() was called, as every later read of the result says.
        assert result.enqueued_at <= run.created_at
        assert task.get_result(result.id).enqueued_at == result.enqueued_at
        assert result.started_at is None
        assert result.last_attempted_at is None
        assert result.finished_at is None
        assert result.attempts == 0
        assert result.worker_ids == []
        assert result.errors == []
        assert result.args == [1]
        assert result.kwargs == {"two": 3}
        assert result.task == task
        assert result.backend == "default"
        with pytest.raises(ValueError, match="not finished yet"):
            result.return_value  # noqa: B018
        assert signals.received == [("task_enqueued", PikkuBackend, "READY", result)]


@on_databases(*ALL)
def test_aenqueue_and_aget_result(vendor: str, alias: str) -> None:
    async def story() -> tuple[Any, Any]:
        result = await defs.add.aenqueue(2, b=5)
        return result, await defs.add.aget_result(result.id)

    with Signals() as signals:
        result, again = async_to_sync(story)()
    assert result.status == TaskResultStatus.READY
    assert again == result
    assert signals.names() == [("task_enqueued", "READY")]
    work()
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 7


@on_databases(*ALL)
def test_get_result_reads_the_run_back_equal(vendor: str, alias: str) -> None:
    result = defs.add.enqueue(1)
    assert task_backends["default"].get_result(result.id) == result
    assert defs.add.get_result(result.id) == result
    with pytest.raises(TaskResultMismatch):
        defs.noop.get_result(result.id)


@on_databases(*ALL)
def test_missing_malformed_and_non_task_ids_do_not_exist(vendor: str, alias: str) -> None:
    backend = task_backends["default"]
    other = start_workflow("testapp.webhook_event", {"data": 1})
    for result_id in (str(uuid.uuid4()), "123", "", str(other.id)):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result_id)
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(backend.aget_result)(result_id)


@on_databases(*ALL)
def test_a_worker_runs_the_task_and_refresh_sees_it(vendor: str, alias: str) -> None:
    with Signals() as signals:
        result = defs.add.enqueue(40, b=2)
        work()
    assert result.status == TaskResultStatus.READY
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 42
    assert result.attempts == 1
    assert len(result.worker_ids) == 1
    assert result.worker_ids[0]
    assert result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert signals.names() == [
        ("task_enqueued", "READY"),
        ("task_started", "RUNNING"),
        ("task_finished", "SUCCESSFUL"),
    ]
    assert all(sender is PikkuBackend for _, sender, _, _ in signals.received)
    finished = signals.received[-1][3]
    assert finished.id == result.id
    assert finished.return_value == 42


@on_databases(*ALL)
def test_an_async_task_runs(vendor: str, alias: str) -> None:
    result = defs.add_async.enqueue(1, b=1)
    work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2


@on_databases(*ALL)
def test_running_is_what_a_task_sees_of_itself(vendor: str, alias: str) -> None:
    result = defs.status_seen_inside.enqueue()
    work()
    result.refresh()
    assert result.return_value == "RUNNING"


@on_databases(*ALL)
def test_queues_are_the_steps_queues(vendor: str, alias: str) -> None:
    result = defs.send_email.enqueue("ada@example.com")
    assert step_of_after_a_pass(alias, result).queue == "emails"
    work(["default"])
    result.refresh()
    assert result.status == TaskResultStatus.READY
    work(["emails"])
    result.refresh()
    assert result.return_value == "sent to ada@example.com"


def step_of_after_a_pass(alias: str, result: Any) -> WorkflowStep:
    engine = get_engine()
    for run_id in engine.claim_due_runs(1):
        engine.orchestrate(run_id)
    return step_of(alias, result)


@on_databases(*ALL)
def test_arguments_that_are_not_json_are_refused_and_nothing_is_stored(
    vendor: str, alias: str
) -> None:
    with pytest.raises(TypeError, match=r"arguments of task .*add must be JSON"):
        defs.add.enqueue(object())
    assert not WorkflowRun.objects.using(alias).exists()


# -- failures and retries ------------------------------------------------------------------


@on_databases(*ALL)
def test_a_failing_task_retries_per_options_then_fails_with_type_and_traceback(
    vendor: str, alias: str
) -> None:
    with Signals() as signals:
        result = defs.fail.enqueue("boom")
        work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.attempts == 2  # OPTIONS retries=1
    assert len(result.errors) == 2
    for error in result.errors:
        assert error.exception_class is ValueError
        assert "ValueError: boom" in error.traceback
        assert "test_tasks_defs.py" in error.traceback
    assert result.finished_at is not None
    assert result.last_attempted_at >= result.started_at
    assert signals.names() == [
        ("task_enqueued", "READY"),
        ("task_started", "RUNNING"),
        ("task_started", "RUNNING"),
        ("task_finished", "FAILED"),
    ]
    assert signals.received[-1][3].errors[-1].exception_class is ValueError


@on_databases(*ALL)
def test_per_task_options_override_the_backends(vendor: str, alias: str) -> None:
    result = defs.fail_once_only.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    own = defs.with_own_policy.enqueue()
    step = step_of_after_a_pass(alias, own)
    assert (step.retries, step.retry_delay, step.backoff) == (3, 2.0, "exponential")
    default = defs.add.enqueue(1)
    step = step_of_after_a_pass(alias, default)
    assert (step.retries, step.retry_delay, step.backoff) == (1, 0.0, "fixed")


@on_databases(*ALL)
def test_context_carries_the_attempt_number(vendor: str, alias: str) -> None:
    result = defs.attempt_of.enqueue(fail_first=True)
    work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    assert result.return_value["attempt"] == 2
    assert result.return_value["id"] == result.id
    assert result.return_value["status"] == "RUNNING"
    assert result.return_value["framework"].startswith(compat.FRAMEWORK)
    assert [e.exception_class for e in result.errors] == [RuntimeError]


@on_databases(*ALL)
def test_a_result_that_is_not_json_fails_without_retrying(vendor: str, alias: str) -> None:
    result = defs.not_json.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    assert "not JSON" in result.errors[0].traceback


@on_databases(*ALL)
def test_system_exit_fails_the_attempt_not_the_worker(vendor: str, alias: str) -> None:
    from pikku_django.tasks import TaskExitedError

    result = defs.exits.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2
    assert result.errors[0].exception_class is TaskExitedError
    assert "SystemExit" in result.errors[0].traceback


@on_databases(*ALL)
def test_a_cancelled_task_reads_as_failed(vendor: str, alias: str) -> None:
    result = defs.add.enqueue(1)
    cancel_workflow(result.id)
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 0
    assert result.finished_at is not None


@on_databases(*ALL)
def test_a_run_naming_something_other_than_a_task_never_calls_it(vendor: str, alias: str) -> None:
    run = start_workflow(
        "task:subprocess.check_output",
        {
            "task": "subprocess.check_output",
            "args": [["false"]],
            "kwargs": {},
            "backend": "default",
            "policy": {"retries": 0},
        },
    )
    work()
    run.refresh_from_db(using=alias)
    assert run.status == RunStatus.FAILED
    step = WorkflowStep.objects.using(alias).get(run_id=run.id)
    assert step.status == StepStatus.FAILED
    assert "does not point to a task" in step.error["message"]
    with pytest.raises(ImportError, match="does not point to a task"):
        task_backends["default"].get_result(str(run.id))


# -- transactions ------------------------------------------------------------------------


def runs_seen_elsewhere(alias: str, run_id: str) -> int:
    """How many runs with this id another connection sees (what is committed)."""
    other = connections.create_connection(alias)
    try:
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT COUNT(*) FROM pikku_workflow_run WHERE id = %s",
                [run_id if other.vendor == "postgresql" else uuid.UUID(run_id).hex],
            )
            return int(cursor.fetchone()[0])
    finally:
        other.close()


@on_databases(*ALL)
def test_an_enqueue_commits_or_rolls_back_with_the_callers_transaction(
    vendor: str, alias: str
) -> None:
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        dropped = defs.add.enqueue(1)
        assert run_of(alias, dropped)
        raise RuntimeError("roll back")
    with pytest.raises(TaskResultDoesNotExist):
        defs.add.get_result(dropped.id)
    with transaction.atomic(using=alias):
        kept = defs.add.enqueue(2)
        if vendor != "sqlite":  # SQLite's writer holds the database until commit
            assert runs_seen_elsewhere(alias, kept.id) == 0
    if vendor != "sqlite":
        assert runs_seen_elsewhere(alias, kept.id) == 1
    work()
    assert defs.add.get_result(kept.id).return_value == 2


@on_databases(*ALL)
def test_a_transactional_task_writes_once_with_its_result(vendor: str, alias: str) -> None:
    from tests.testapp.models import Effect

    tag = uuid.uuid4().hex
    with Signals() as signals:
        result = defs.record.enqueue(alias, tag)
        work()
    result.refresh()
    assert result.attempts == 2
    assert result.return_value == 1  # the failed attempt's write rolled back
    # task_finished follows the commit of the transaction that recorded the result.
    assert signals.names()[-1] == ("task_finished", "SUCCESSFUL")
    assert Effect.objects.using(alias).filter(run_id=tag).count() == 1


# -- the admin -----------------------------------------------------------------------------


@on_databases("sqlite")
def test_the_admin_lists_task_runs_under_their_task(
    vendor: str, alias: str, admin_client: Any
) -> None:
    from django.urls import reverse

    result = defs.send_email.enqueue("ada@example.com")
    page = admin_client.get(reverse("admin:pikku_django_workflowrun_changelist"))
    assert page.status_code == 200
    assert "task:tests.test_tasks_defs.send_email" in page.content.decode()
    filtered = admin_client.get(
        reverse("admin:pikku_django_workflowrun_changelist"),
        {"workflow": "task:tests.test_tasks_defs.send_email"},
    )
    assert result.id in filtered.content.decode()
