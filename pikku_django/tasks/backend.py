"""``PikkuBackend``: each ``django.tasks`` enqueue is a durable run that ``pikku_worker`` runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.utils import timezone

from pikku_django.tasks import compat
from pikku_django.tasks.naming import MAX_TASK_PATH, task_workflow
from pikku_django.tasks.options import OPTION_KEYS, RetryPolicy

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PikkuTask(compat.Task):  # type: ignore[type-arg]
    """A task of :class:`PikkuBackend`; ``@task`` passes it these extra options.

    ``retries`` (after the first attempt), ``retry_delay`` (seconds, a timedelta or
    text like "30s"), ``backoff`` ("fixed" or "exponential") and ``transactional``
    override the backend's ``OPTIONS`` for this task; None keeps them.
    """

    retries: int | None = None
    retry_delay: float | timedelta | str | None = None
    backoff: str | None = None
    transactional: bool | None = None

    def policy(self) -> RetryPolicy:
        values = {key: getattr(self, key) for key in OPTION_KEYS}
        return RetryPolicy.parse(
            {k: v for k, v in values.items() if v is not None}, f"task {self.module_path}"
        )


class PikkuBackend(compat.BaseTaskBackend):
    """A ``TASKS`` backend whose results are workflow runs (id = the run's id).

    ``OPTIONS``: ``retries``, ``retry_delay``, ``backoff`` and ``transactional``, the
    defaults of its tasks (unset: ``PIKKU``'s ``STEP_*`` defaults).
    """

    task_class = PikkuTask
    supports_async_task = True
    supports_get_result = True
    #: ``run_after`` is the run's ``start_at`` (not claimed before), and ``priority``
    #: the run's priority (-100..100, higher first), as ``start_workflow`` takes them.
    supports_defer = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.policy = RetryPolicy.from_backend_options(alias, self.options)

    # -- validating -----------------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        """As the base backend does, plus the queue, the path's length and the task options."""
        if self.queues and task.queue_name not in self.queues:
            raise compat.InvalidTask(
                f"Queue {task.queue_name!r} is not one of the QUEUES of TASKS[{self.alias!r}] "
                f"({', '.join(sorted(self.queues))}); add it there or enqueue on one of those."
            )
        super().validate_task(task)
        if len(task.module_path) > MAX_TASK_PATH:
            raise compat.InvalidTask(
                f"Task path {task.module_path[:60]!r}... is over {MAX_TASK_PATH} characters."
            )
        if isinstance(task, PikkuTask):
            try:
                task.policy()
            except ValueError as exc:
                raise compat.InvalidTask(str(exc)) from exc
            if task.transactional:
                _check_not_async_transactional(task)

    # -- enqueueing -----------------------------------------------------------------

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Start the task's run (in the caller's transaction) and return its result."""
        from pikku_django.tasks.results import TaskRunState
        from pikku_django.workflows.api import start_workflow

        self.validate_task(task)
        own = task.policy() if isinstance(task, PikkuTask) else RetryPolicy()
        policy = own.over(self.policy).as_step_options()
        is_async = iscoroutinefunction(task.func)
        if policy.get("transactional"):
            _check_not_async_transactional(task)
        try:
            args, kwargs = compat.normalize_json(list(args)), compat.normalize_json(dict(kwargs))
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"The arguments of task {task.module_path} must be JSON (str, int, float, "
                f"bool, None, lists and dicts of them): {exc}"
            ) from exc
        payload = {
            "task": task.module_path,
            "args": args,
            "kwargs": kwargs,
            "backend": self.alias,
            "queue": task.queue_name,
            "priority": task.priority,
            "run_after": task.run_after.isoformat() if task.run_after else None,
            # The result's enqueued_at, as every reader of the run (and its step) sees it.
            "enqueued_at": timezone.now().isoformat(),
            "policy": {k: v for k, v in policy.items() if v is not None},
            # An async def task runs as an async step, on the worker's event loop.
            "async": is_async,
        }
        run = start_workflow(
            task_workflow(task.module_path),
            payload,
            priority=task.priority,
            start_at=task.run_after,
        )
        result = TaskRunState(run, None, ()).result(task)
        compat.task_enqueued.send(type(self), task_result=result)
        return result

    # -- reading results ------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        """The task result of run ``result_id``; TaskResultDoesNotExist if it is not a task run."""
        from pikku_django.tasks.results import TaskRunState

        return TaskRunState.load(result_id).result()


def _check_not_async_transactional(task: Any) -> None:
    """InvalidTask for a transactional ``async def`` task (see async steps)."""
    if iscoroutinefunction(task.func):
        raise compat.InvalidTask(
            f"Task {task.module_path} is an async def function and cannot be transactional: "
            "its database calls run on other threads than the step's transaction. Make it a "
            "plain def task, or set transactional=False for it."
        )
