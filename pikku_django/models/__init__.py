"""pikku_django's models, one module per concern."""

from pikku_django.models.leases import Lease
from pikku_django.models.workflows import (
    TERMINAL_RUN_STATUSES,
    Backoff,
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)

__all__ = [
    "TERMINAL_RUN_STATUSES",
    "Backoff",
    "Lease",
    "RunStatus",
    "StepAttempt",
    "StepKind",
    "StepStatus",
    "WorkflowRun",
    "WorkflowStep",
]
