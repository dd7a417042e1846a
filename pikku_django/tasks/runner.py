"""What ``pikku_worker`` runs for a task: the ``task:<path>`` workflow and its one step.

Every task run has one queued step, ``task``, whose function imports the task by
path and calls it: retries, leases, fencing and recovery are the step's. The
framework's ``task_started`` and ``task_finished`` signals are sent around the call
(``task_finished`` once: on success, or on the attempt that fails for good).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from pikku_django.tasks.naming import STEP_FUNCTION, STEP_NAME, WORKFLOW_PREFIX
from pikku_django.workflows.api import get_engine
from pikku_django.workflows.context import WorkflowContext
from pikku_django.workflows.errors import NotSerializableError, WorkflowError, serialize_error
from pikku_django.workflows.registry import (
    WorkflowDefinition,
    register_workflow_prefix,
    step,
)


class TaskExitedError(WorkflowError):
    """The task function raised SystemExit: the attempt fails; the worker goes on."""

    code = "TASK_EXITED"


def run_task(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """The body of every task run: one queued step with the task's retry policy."""
    policy = input.get("policy") or {}
    return ctx.do(
        STEP_NAME,
        STEP_FUNCTION,
        {"run": str(ctx.run_id)},
        queue=input.get("queue"),
        **policy,
    )


def find_task_workflow(name: str) -> WorkflowDefinition:
    return WorkflowDefinition(name, run_task)


register_workflow_prefix(WORKFLOW_PREFIX, find_task_workflow)


@step(name=STEP_FUNCTION)
def call_task(data: dict[str, Any]) -> Any:
    """Call the task of run ``data["run"]`` with its arguments; its JSON result is the step's."""
    # The framework and the models load once a worker runs a task, not at start-up:
    # this module registers the step on every project, with django.tasks or not.
    from pikku_django.tasks import compat
    from pikku_django.tasks.results import TaskRunState, finished, task_error

    state = TaskRunState.load(data["run"])
    task = state.task()
    result = state.result(task)
    sender = type(task.get_backend())
    attempt = state.step.attempt if state.step is not None else len(state.attempts)
    last_attempt = state.step is None or attempt >= state.step.attempts_allowed
    compat.task_started.send(sender=sender, task_result=result)
    try:
        value = _call(compat, task, result)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = _as_exception(exc, task.module_path)
        if last_attempt or isinstance(error, NotSerializableError):
            finished(
                result, compat.TaskResultStatus.FAILED, error=task_error(serialize_error(error))
            )
            compat.task_finished.send(sender=sender, task_result=result)
        if error is exc:
            raise
        raise error from exc
    finished(result, compat.TaskResultStatus.SUCCESSFUL, value=value)
    # A transactional task's result is recorded in the transaction it ran in: the
    # signal follows that commit. Otherwise it is sent at once.
    transaction.on_commit(
        lambda: compat.task_finished.send(sender=sender, task_result=result),
        using=get_engine().using,
    )
    return value


def _call(compat: Any, task: Any, result: Any) -> Any:
    if task.takes_context:
        context = compat.TaskContext(task_result=result)
        raw = task.call(context, *result.args, **result.kwargs)
    else:
        raw = task.call(*result.args, **result.kwargs)
    try:
        return compat.normalize_json(raw)
    except (TypeError, ValueError) as exc:
        raise NotSerializableError(
            f"The return value of task {task.module_path} is not JSON ({exc})"
        ) from exc


def _as_exception(exc: BaseException, path: str) -> Exception:
    """What the step records for ``exc``: SystemExit (and the like) become TaskExitedError."""
    if isinstance(exc, Exception):
        return exc
    return TaskExitedError(f"Task {path} raised {type(exc).__name__}({exc})")
