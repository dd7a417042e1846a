"""What a parent's child step records when its child run ends."""

from __future__ import annotations

import uuid
from typing import Any

from pikku_django.models import RunStatus, StepStatus


def child_step_outcome(
    child_id: uuid.UUID, status: str, output: Any, error: Any
) -> tuple[str, Any, Any]:
    """The parent step's status, result and error for a child run ended ``status``."""
    if status == RunStatus.COMPLETED:
        return StepStatus.SUCCEEDED, output, None
    failure = error or {
        "type": "WorkflowCancelled",
        "message": f"Child run {child_id} was {status}",
        "code": "CHILD_" + status.upper(),
    }
    return StepStatus.FAILED, None, failure
