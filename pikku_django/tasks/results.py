"""A task run's state, read from its run and step attempts, as a ``TaskResult``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from pikku_django.models import RunStatus, StepAttempt, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.tasks.compat import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from pikku_django.tasks.naming import STEP_NAME, is_task_workflow, task_workflow
from pikku_django.workflows._values import ClaimedStep
from pikku_django.workflows.api import get_engine


class TaskPathError(ImportError):
    """A task run names something that is not a task (it is never called)."""


@dataclass(frozen=True)
class TaskRunState:
    """A task's run, its one step (once stored) and that step's attempts, oldest first."""

    run: WorkflowRun
    step: WorkflowStep | None
    attempts: Sequence[StepAttempt]

    @classmethod
    def load(cls, result_id: object) -> TaskRunState:
        """The state of the task run ``result_id``; TaskResultDoesNotExist if there is none."""
        engine = get_engine()
        try:
            run_id = uuid.UUID(str(result_id))
        except (ValueError, TypeError):
            raise TaskResultDoesNotExist(result_id) from None
        # One query once the task has been attempted: its attempts, with step and run.
        attempts = list(
            engine.attempts()
            .filter(step__run_id=run_id, step__name=STEP_NAME)
            .select_related("step", "step__run")
            .order_by("attempt")
        )
        if attempts:
            step: WorkflowStep | None = attempts[0].step
            run: WorkflowRun | None = attempts[0].step.run
        else:
            run = engine.runs().filter(id=run_id).first()
            step = engine.steps().filter(run_id=run_id, name=STEP_NAME).first() if run else None
        if run is None or not is_task_workflow(run.workflow):
            raise TaskResultDoesNotExist(result_id)
        return cls(run, step, attempts)

    @classmethod
    def first_attempt(cls, data: Any, claimed: ClaimedStep | None) -> TaskRunState | None:
        """The state of a task run's first attempt from what its step (``data``) and
        claim carry, read from nowhere; None unless ``claimed`` is that first attempt
        of that run's step, with the call and its start known."""
        call = data.get("call") if isinstance(data, dict) else None
        if (
            claimed is None
            or not isinstance(call, dict)
            or claimed.attempt != 1
            or claimed.reclaimed
            or claimed.started_at is None
            or str(claimed.run_id) != data.get("run")
        ):
            return None
        enqueued = _parse_time(call.get("enqueued_at"))
        if enqueued is None:
            return None
        run = WorkflowRun(
            id=claimed.run_id,
            workflow=task_workflow(str(call.get("task", ""))),
            input=call,
            status=RunStatus.RUNNING,
            created_at=enqueued,
        )
        step = WorkflowStep(
            id=claimed.step_id, name=STEP_NAME, status=StepStatus.RUNNING, attempt=1
        )
        attempt = StepAttempt(
            step_id=claimed.step_id,
            attempt=1,
            status=StepStatus.RUNNING,
            worker=claimed.worker[:255],
            started_at=claimed.started_at,
        )
        return cls(run, step, (attempt,))

    def is_last_attempt(self) -> bool:
        """Whether the step's current attempt is its last (or it has no step)."""
        if self.step is None:
            return True
        return self.step.attempt >= self.step.attempts_allowed

    @property
    def input(self) -> dict[str, Any]:
        return self.run.input if isinstance(self.run.input, dict) else {}

    def task(self) -> Task[..., Any]:
        """The task the run calls, with the priority, queue and backend it was enqueued with."""
        path = str(self.input.get("task", ""))
        found = import_string(path)
        if not isinstance(found, Task) or found.module_path != path:
            raise TaskPathError(f"Task run {self.run.id} does not point to a task ({path!r})")
        enqueued = {
            "priority": self.input.get("priority", found.priority),
            "queue_name": self.input.get("queue", found.queue_name),
            "backend": self.input.get("backend", found.backend),
        }
        if all(getattr(found, name) == value for name, value in enqueued.items()):
            return found
        return found.using(**enqueued)

    def status(self) -> TaskResultStatus:
        if self.run.status == RunStatus.COMPLETED:
            return TaskResultStatus.SUCCESSFUL
        if self.run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            return TaskResultStatus.FAILED
        if self.step is not None and self.step.status == StepStatus.RUNNING:
            return TaskResultStatus.RUNNING
        return TaskResultStatus.READY

    def errors(self) -> list[Any]:
        errors = [task_error(a.error) for a in self.attempts if a.error]
        if not errors and self.run.status == RunStatus.FAILED:
            # No attempt raised: the step lost its worker on every attempt, say.
            source = (self.step.error if self.step is not None else None) or self.run.error
            if source:
                errors.append(task_error(source))
        return errors

    def finished_at(self) -> datetime | None:
        if not self.run.is_terminal:
            return None
        last = self.attempts[-1].finished_at if self.attempts else None
        return last or self.run.updated_at

    def result(self, task: Task[..., Any] | None = None) -> TaskResult[..., Any]:
        """The ``TaskResult`` of this state (``task``: the run's task, when already known)."""
        task = task if task is not None else self.task()
        status = self.status()
        result: TaskResult[..., Any] = TaskResult(
            task=task,
            id=str(self.run.id),
            status=status,
            enqueued_at=_parse_time(self.input.get("enqueued_at")) or self.run.created_at,
            started_at=self.attempts[0].started_at if self.attempts else None,
            finished_at=self.finished_at(),
            last_attempted_at=self.attempts[-1].started_at if self.attempts else None,
            args=list(self.input.get("args") or []),
            kwargs=dict(self.input.get("kwargs") or {}),
            backend=str(self.input.get("backend", task.backend)),
            errors=self.errors(),
            worker_ids=[a.worker for a in self.attempts],
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", self.run.output)
        return result


def _parse_time(value: Any) -> datetime | None:
    """An ISO time stored in a task run's input, or None (absent or malformed)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def task_error(error: dict[str, Any]) -> Any:
    """A stored error (type, message, traceback) as a ``TaskError``."""
    kind = str(error.get("type") or "Exception")
    path = kind if "." in kind else f"builtins.{kind}"
    return TaskError(exception_class_path=path, traceback=str(error.get("traceback") or ""))


def finished(
    result: TaskResult[..., Any], status: str, *, value: Any = None, error: Any = None
) -> None:
    """Mark ``result`` (as a worker holds it) finished with ``status``."""
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    if error is not None:
        result.errors.append(error)
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", value)
