"""pikku_django's models, one module per concern."""

from pikku_django.models.events import WorkflowEvent
from pikku_django.models.heartbeats import WorkerHeartbeat
from pikku_django.models.leases import Lease
from pikku_django.models.limits import QueueClaim
from pikku_django.models.pauses import QueuePause
from pikku_django.models.schedules import MissedTicks, Schedule, ScheduleOrigin
from pikku_django.models.webhooks import (
    CredentialValue,
    TriggerSource,
    WebhookDigest,
    WebhookReceipt,
)
from pikku_django.models.workflows import (
    CLAIMABLE_STATUSES,
    TERMINAL_RUN_STATUSES,
    AttemptStatus,
    Backoff,
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)

__all__ = [
    "CLAIMABLE_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "AttemptStatus",
    "Backoff",
    "CredentialValue",
    "Lease",
    "MissedTicks",
    "QueueClaim",
    "QueuePause",
    "RunStatus",
    "Schedule",
    "ScheduleOrigin",
    "StepAttempt",
    "StepKind",
    "StepStatus",
    "TriggerSource",
    "WebhookDigest",
    "WebhookReceipt",
    "WorkerHeartbeat",
    "WorkflowEvent",
    "WorkflowRun",
    "WorkflowStep",
]
