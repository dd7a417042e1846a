"""What ``pikku_worker`` runs for a task: the ``task:<path>`` workflow and its one step.

Every task run has one queued step, ``task``, whose function imports the task by
path and calls it (an ``async def`` task's step is async, awaited on the worker's
event loop): retries, leases, fencing and recovery are the step's. The
framework's ``task_started`` and ``task_finished`` signals are sent around the call
(``task_finished`` once: on success, or on the attempt that fails for good).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction

from pikku_django.tasks.naming import (
    ASYNC_STEP_FUNCTION,
    STEP_FUNCTION,
    STEP_NAME,
    WORKFLOW_PREFIX,
)
from pikku_django.workflows.api import get_engine
from pikku_django.workflows.errors import NotSerializableError, WorkflowError, serialize_error
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.registry import (
    OpeningStep,
    WorkflowDefinition,
    end_runs_with,
    register_workflow_prefix,
    step,
)
from pikku_django.workflows.steps._current import current_claim


class TaskExitedError(WorkflowError):
    """The task function raised SystemExit: the attempt fails; the worker goes on."""

    code = "TASK_EXITED"


#: What a task run's step carries of its run's input: enough to call the task on a
#: first attempt without reading the run.
CALL_KEYS = ("task", "args", "kwargs", "backend", "queue", "priority", "enqueued_at")


def task_step(run_id: uuid.UUID, input: dict[str, Any]) -> OpeningStep:
    """A task run's one queued step, with the task's retry policy: stored with the run
    at enqueue time (so a worker claims it at once), and what a pass replays."""
    return OpeningStep(
        STEP_NAME,
        ASYNC_STEP_FUNCTION if input.get("async") else STEP_FUNCTION,
        {"run": str(run_id), "call": {k: input[k] for k in CALL_KEYS if k in input}},
        {"queue": input.get("queue"), **(input.get("policy") or {})},
    )


def run_task(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    """The body of every task run: its one step, whose result is the run's output (the
    step's success completes the run as it is recorded: see ``end_runs_with``)."""
    opening = task_step(ctx.run_id, input)
    return ctx.do(opening.name, opening.function, opening.data, **opening.options)


def find_task_workflow(name: str) -> WorkflowDefinition:
    return WorkflowDefinition(name, run_task, opening=task_step)


register_workflow_prefix(WORKFLOW_PREFIX, find_task_workflow)


@dataclass
class _TaskCall:
    """One attempt's call of a task: the task, its result as the worker holds it, and
    whether this is its last attempt (None: not read yet)."""

    task: Any
    result: Any
    sender: type
    last_attempt: bool | None

    def is_last_attempt(self) -> bool:
        if self.last_attempt is None:
            from pikku_django.tasks.results import TaskRunState

            self.last_attempt = TaskRunState.load(self.result.id).is_last_attempt()
        return self.last_attempt

    def arguments(self, compat: Any) -> tuple[list[Any], dict[str, Any]]:
        args = list(self.result.args)
        if self.task.takes_context:
            args.insert(0, compat.TaskContext(task_result=self.result))
        return args, dict(self.result.kwargs)


def _begin(data: dict[str, Any]) -> _TaskCall:
    """Load the task of run ``data["run"]`` and send ``task_started``."""
    # The framework and the models load once a worker runs a task, not at start-up:
    # this module registers the steps on every project, with django.tasks or not.
    from pikku_django.tasks import compat
    from pikku_django.tasks.results import TaskRunState

    # A first attempt's state is what its step and claim carry; any other is read.
    first = TaskRunState.first_attempt(data, current_claim())
    state = first or TaskRunState.load(data["run"])
    task = state.task()
    result = state.result(task)
    call = _TaskCall(
        task=task,
        result=result,
        sender=type(task.get_backend()),
        last_attempt=None if first is not None else state.is_last_attempt(),
    )
    compat.task_started.send(sender=call.sender, task_result=result)
    return call


def _failed(call: _TaskCall, exc: BaseException) -> Exception:
    """What the step raises for ``exc``; ``task_finished`` on the attempt that fails for good."""
    from pikku_django.tasks import compat
    from pikku_django.tasks.results import finished, task_error

    error = _as_exception(exc, call.task.module_path)
    if isinstance(error, NotSerializableError) or call.is_last_attempt():
        finished(
            call.result, compat.TaskResultStatus.FAILED, error=task_error(serialize_error(error))
        )
        compat.task_finished.send(sender=call.sender, task_result=call.result)
    return error


def _succeeded(call: _TaskCall, raw: Any) -> Any:
    """The task's JSON result, marked on its result; ``task_finished`` after the commit."""
    from pikku_django.tasks import compat
    from pikku_django.tasks.results import finished

    try:
        value = compat.normalize_json(raw)
    except (TypeError, ValueError) as exc:
        raise _failed(
            call,
            NotSerializableError(
                f"The return value of task {call.task.module_path} is not JSON ({exc})"
            ),
        ) from exc
    finished(call.result, compat.TaskResultStatus.SUCCESSFUL, value=value)
    # A transactional task's result is recorded in the transaction it ran in: the
    # signal follows that commit. Otherwise it is sent at once.
    transaction.on_commit(
        lambda: compat.task_finished.send(sender=call.sender, task_result=call.result),
        using=get_engine().using,
    )
    return value


@step(name=STEP_FUNCTION)
def call_task(data: dict[str, Any]) -> Any:
    """Call the task of run ``data["run"]`` with its arguments; its JSON result is the step's."""
    from pikku_django.tasks import compat

    call = _begin(data)
    args, kwargs = call.arguments(compat)
    try:
        raw = call.task.call(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        error = _failed(call, exc)
        if error is exc:
            raise
        raise error from exc
    return _succeeded(call, raw)


@step(name=ASYNC_STEP_FUNCTION)
async def acall_task(data: dict[str, Any]) -> Any:
    """:func:`call_task` for an ``async def`` task: awaited on the worker's event loop,
    its database work on the loop's threads."""
    from pikku_django.tasks import compat

    call = await sync_to_async(_begin, thread_sensitive=False)(data)
    args, kwargs = call.arguments(compat)
    try:
        raw = await call.task.acall(*args, **kwargs)
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise
    except BaseException as exc:
        error = await sync_to_async(_failed, thread_sensitive=False)(call, exc)
        if error is exc:
            raise
        raise error from exc
    return await sync_to_async(_succeeded, thread_sensitive=False)(call, raw)


# A task run's output is its step's result: the run completes in the step's settle.
end_runs_with(STEP_FUNCTION)
end_runs_with(ASYNC_STEP_FUNCTION)


def _as_exception(exc: BaseException, path: str) -> Exception:
    """What the step records for ``exc``: SystemExit (and the like) become TaskExitedError."""
    if isinstance(exc, Exception):
        return exc
    return TaskExitedError(f"Task {path} raised {type(exc).__name__}({exc})")
