"""A run's status as the stream and the status endpoint report it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pikku_django.models import TERMINAL_RUN_STATUSES, RunStatus, WorkflowRun, WorkflowStep
from pikku_django.models.fields import shown
from pikku_django.wakeups import WORK_CHANNEL, SharedListener, shared_listener


@dataclass(frozen=True)
class RunSnapshot:
    """The run's status and each step's, at one moment."""

    run_id: str
    workflow: str
    status: str
    suspend_reason: str
    steps: tuple[tuple[str, str, int], ...]  # (name, status, attempt)
    output: Any = None
    error: Any = None
    #: The values the run published (``ctx.set_event``), by name.
    published: Any = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def suspended(self) -> bool:
        return self.status == RunStatus.SUSPENDED

    def changes_from(self, other: RunSnapshot | None) -> bool:
        return other is None or (self.status, self.steps, self.published) != (
            other.status,
            other.steps,
            other.published,
        )

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "run": self.run_id,
            "workflow": self.workflow,
            "status": self.status,
            "steps": [
                {"name": name, "status": status, "attempt": attempt}
                for name, status, attempt in self.steps
            ],
        }
        if self.published:
            data["published"] = self.published
        if self.suspended:
            data["reason"] = self.suspend_reason
        if self.terminal:
            data["output"] = self.output
            data["error"] = (
                {"type": self.error.get("type"), "message": self.error.get("message")}
                if isinstance(self.error, dict)
                else None
            )
        return data


def snapshot(run_id: uuid.UUID | str, using: str) -> RunSnapshot | None:
    """Read a run and its steps; None when there is no such run."""
    run = (
        WorkflowRun.objects.using(using)
        .filter(id=run_id)
        .only("workflow", "status", "suspend_reason", "output", "error", "published")
        .first()
    )
    if run is None:
        return None
    steps = tuple(
        WorkflowStep.objects.using(using)
        .filter(run_id=run.id)
        .order_by("id")
        .values_list("name", "status", "attempt")
    )
    return RunSnapshot(
        run_id=str(run.id),
        workflow=run.workflow,
        status=run.status,
        suspend_reason=run.suspend_reason,
        steps=steps,
        output=shown(run.output),
        error=run.error,
        published=shown(run.published),
    )


def notifications(using: str) -> SharedListener:
    """What wakes a status stream on ``using``: any work announced there (subscribers
    are never called where the database cannot be listened to: the stream polls)."""
    return shared_listener(using, WORK_CHANNEL)
