"""Durable workflows: functions replayed step by step, run by ``pikku_worker``."""

from pikku_django.workflows._run_options import RunOptions
from pikku_django.workflows.api import (
    cancel_workflow,
    get_engine,
    resume_workflow,
    retry_workflow,
    start_workflow,
)
from pikku_django.workflows.clock import Clock, FakeClock
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.context import WorkflowContext
from pikku_django.workflows.engine import ClaimedStep, StepOutcome, Wake, WorkflowEngine
from pikku_django.workflows.errors import (
    NonDeterministicWorkflowError,
    NotSerializableError,
    StepFailedError,
    StepFunctionNotFoundError,
    StepTimeoutError,
    SuspendTimeoutError,
    WorkflowError,
    WorkflowNotFoundError,
    WorkflowRunNotFoundError,
    WorkflowRunStateError,
    WorkflowStepLeaseExpiredError,
    WorkflowStepSupersededError,
    WorkflowTimeoutError,
)
from pikku_django.workflows.intake import Intake, register_intake, unregister_intake
from pikku_django.workflows.queues import QueueSettings, Rate
from pikku_django.workflows.registry import PRIORITY_MAX, PRIORITY_MIN, step, workflow
from pikku_django.workflows.store import NewRun

__all__ = [
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "ClaimedStep",
    "Clock",
    "EngineConfig",
    "FakeClock",
    "Intake",
    "NewRun",
    "NonDeterministicWorkflowError",
    "NotSerializableError",
    "QueueSettings",
    "Rate",
    "RunOptions",
    "StepFailedError",
    "StepFunctionNotFoundError",
    "StepOutcome",
    "StepTimeoutError",
    "SuspendTimeoutError",
    "Wake",
    "WorkflowContext",
    "WorkflowEngine",
    "WorkflowError",
    "WorkflowNotFoundError",
    "WorkflowRunNotFoundError",
    "WorkflowRunStateError",
    "WorkflowStepLeaseExpiredError",
    "WorkflowStepSupersededError",
    "WorkflowTimeoutError",
    "cancel_workflow",
    "get_engine",
    "register_intake",
    "resume_workflow",
    "retry_workflow",
    "start_workflow",
    "step",
    "unregister_intake",
    "workflow",
]
