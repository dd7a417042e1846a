"""Durable workflows: functions replayed step by step, run by ``pikku_worker``."""

from pikku_django.workflows._async_api import (
    acancel_workflow,
    aresume_workflow,
    aretry_workflow,
    astart_workflow,
    astart_workflows,
    aworkflow_status,
    workflow_status,
)
from pikku_django.workflows.api import (
    await_run,
    cancel_workflow,
    get_engine,
    published_values,
    resume_workflow,
    retry_workflow,
    send_event,
    send_event_with_start,
    start_workflow,
    start_workflows,
    wait_for_run,
)
from pikku_django.workflows.clock import Clock, FakeClock
from pikku_django.workflows.compose._events import (
    TIMED_OUT,
    EventOutcome,
    EventTimeout,
    RunKey,
    SentEvent,
)
from pikku_django.workflows.compose._parallel import Branch, JoinPolicy, Outcome, ParallelGroup
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.control.pauses import (
    PauseChange,
    PausedQueue,
    QueuePauseResult,
    pause_queue,
    paused_queues,
    resume_queue,
)
from pikku_django.workflows.control.queues import QueueSettings, Rate
from pikku_django.workflows.engine import ClaimedStep, StepOutcome, Wake, WorkflowEngine
from pikku_django.workflows.errors import (
    NonDeterministicWorkflowError,
    NotSerializableError,
    RunWaitTimeoutError,
    StepFailedError,
    StepFunctionNotFoundError,
    StepTimeoutError,
    SuspendTimeoutError,
    UnknownPatchError,
    WorkflowError,
    WorkflowNotFoundError,
    WorkflowRunNotFoundError,
    WorkflowRunStateError,
    WorkflowStepLeaseExpiredError,
    WorkflowStepLimitError,
    WorkflowStepSupersededError,
    WorkflowTimeoutError,
)
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.registry import PRIORITY_MAX, PRIORITY_MIN, step, workflow
from pikku_django.workflows.runs._bulk_start import BulkStartOptions
from pikku_django.workflows.runs._options import RunOptions
from pikku_django.workflows.runs._sending import RunExchange
from pikku_django.workflows.runs._starting import StartOptions
from pikku_django.workflows.runs.forks import ForkRefusal, ForkRefusedError, fork_run
from pikku_django.workflows.runs.status import RunSnapshot
from pikku_django.workflows.steps._current import fencing_token
from pikku_django.workflows.store import NewRun
from pikku_django.workflows.worker.intake import (
    Intake,
    register_intake,
    start_waiting_runs,
    unregister_intake,
)

__all__ = [
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "TIMED_OUT",
    "Branch",
    "BulkStartOptions",
    "ClaimedStep",
    "Clock",
    "EngineConfig",
    "EventOutcome",
    "EventTimeout",
    "FakeClock",
    "ForkRefusal",
    "ForkRefusedError",
    "Intake",
    "JoinPolicy",
    "NewRun",
    "NonDeterministicWorkflowError",
    "NotSerializableError",
    "Outcome",
    "ParallelGroup",
    "PauseChange",
    "PausedQueue",
    "QueuePauseResult",
    "QueueSettings",
    "Rate",
    "RunExchange",
    "RunKey",
    "RunOptions",
    "RunSnapshot",
    "RunWaitTimeoutError",
    "SentEvent",
    "StartOptions",
    "StepFailedError",
    "StepFunctionNotFoundError",
    "StepOutcome",
    "StepTimeoutError",
    "SuspendTimeoutError",
    "UnknownPatchError",
    "Wake",
    "WorkflowContext",
    "WorkflowEngine",
    "WorkflowError",
    "WorkflowNotFoundError",
    "WorkflowRunNotFoundError",
    "WorkflowRunStateError",
    "WorkflowStepLeaseExpiredError",
    "WorkflowStepLimitError",
    "WorkflowStepSupersededError",
    "WorkflowTimeoutError",
    "acancel_workflow",
    "aresume_workflow",
    "aretry_workflow",
    "astart_workflow",
    "astart_workflows",
    "await_run",
    "aworkflow_status",
    "cancel_workflow",
    "fencing_token",
    "fork_run",
    "get_engine",
    "pause_queue",
    "paused_queues",
    "published_values",
    "register_intake",
    "resume_queue",
    "resume_workflow",
    "retry_workflow",
    "send_event",
    "send_event_with_start",
    "start_waiting_runs",
    "start_workflow",
    "start_workflows",
    "step",
    "unregister_intake",
    "wait_for_run",
    "workflow",
    "workflow_status",
]
