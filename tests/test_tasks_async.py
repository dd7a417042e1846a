"""An ``async def`` django.tasks task through the backend: an async step, awaited on
a pikku_worker's event loop, many at once on one worker thread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pikku_django.models import StepAttempt, WorkflowStep
from pikku_django.tasks.compat import InvalidTask, TaskResultStatus, task
from pikku_django.tasks.naming import ASYNC_STEP_FUNCTION, STEP_FUNCTION
from pikku_django.workflows.api import reset_engine
from tests import test_tasks_defs as defs
from tests.conftest import database_alias, on_databases
from tests.test_async_worker import most_at_once
from tests.test_worker import finish, worker_process


@pytest.fixture
def alias(vendor: str, settings: Any) -> Iterator[str]:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    yield alias
    reset_engine()


@on_databases("sqlite", "postgres", "mariadb")
def test_async_tasks_are_awaited_on_the_workers_loop(vendor: str, alias: str) -> None:
    results = [defs.where_awaited.enqueue(1.0) for _ in range(20)]
    sync = defs.add.enqueue(1, b=2)
    code, out = finish(worker_process(alias, "--until-idle", "--concurrency", "1"), 180)
    assert code == 0, out
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, (result.errors, out[-2000:])
        assert result.return_value["thread"] == "pikku-worker-aio"
    sync.refresh()
    assert sync.return_value == 3
    steps = WorkflowStep.objects.using(alias).values_list("run_id", "function")
    functions = {str(run_id): function for run_id, function in steps}
    assert {functions[r.id] for r in results} == {ASYNC_STEP_FUNCTION}
    assert functions[sync.id] == STEP_FUNCTION
    # One worker thread, and the twenty awaited together.
    spans = list(
        StepAttempt.objects.using(alias)
        .filter(step__function=ASYNC_STEP_FUNCTION)
        .values_list("started_at", "finished_at")
    )
    assert most_at_once(spans) > 5, out[-2000:]


def test_a_transactional_async_task_is_refused() -> None:
    with pytest.raises(InvalidTask, match="cannot be transactional"):
        task(transactional=True)(defs.not_yet_a_task)


@on_databases("sqlite")
def test_a_backend_default_of_transactional_refuses_async_tasks(vendor: str, alias: str) -> None:
    from pikku_django.tasks import PikkuBackend

    backend = PikkuBackend("tx", {"OPTIONS": {"transactional": True}})
    with pytest.raises(InvalidTask, match="cannot be transactional"):
        backend.enqueue(defs.where_awaited, (), {})
    assert backend.enqueue(defs.add, (1,), {}).status == TaskResultStatus.READY
