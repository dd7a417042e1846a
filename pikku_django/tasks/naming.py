"""How task runs are named: the workflow ``task:<task path>`` with one step, ``task``."""

from __future__ import annotations

#: A task run's workflow is this prefix and the task's dotted path, so the admin and
#: ``pikku_workflows`` list each run under its task.
WORKFLOW_PREFIX = "task:"
#: The one queued step of a task run, which calls the task function.
STEP_NAME = "task"
#: The registered step function that calls a task.
STEP_FUNCTION = "pikku.tasks.call"
#: The registered async step function that awaits an ``async def`` task.
ASYNC_STEP_FUNCTION = "pikku.tasks.acall"
#: The longest task path a run name can hold (WorkflowRun.workflow is 200 characters).
MAX_TASK_PATH = 200 - len(WORKFLOW_PREFIX)


def task_workflow(task_path: str) -> str:
    return f"{WORKFLOW_PREFIX}{task_path}"


def is_task_workflow(name: str) -> bool:
    return name.startswith(WORKFLOW_PREFIX)
