"""Durable workflows: functions replayed step by step, run by ``pikku_worker``."""

from pikku_django.workflows._async_api import (
    acancel_workflow,
    aresume_workflow,
    aretry_workflow,
    astart_workflow,
    aworkflow_status,
    workflow_status,
)
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
    WorkflowError,
    WorkflowNotFoundError,
    WorkflowRunNotFoundError,
    WorkflowRunStateError,
    WorkflowStepLeaseExpiredError,
    WorkflowStepSupersededError,
)
from pikku_django.workflows.intake import Intake, register_intake, unregister_intake
from pikku_django.workflows.queues import QueueSettings, Rate
from pikku_django.workflows.registry import PRIORITY_MAX, PRIORITY_MIN, step, workflow
from pikku_django.workflows.status import RunSnapshot
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
    "RunSnapshot",
    "StepFailedError",
    "StepFunctionNotFoundError",
    "StepOutcome",
    "Wake",
    "WorkflowContext",
    "WorkflowEngine",
    "WorkflowError",
    "WorkflowNotFoundError",
    "WorkflowRunNotFoundError",
    "WorkflowRunStateError",
    "WorkflowStepLeaseExpiredError",
    "WorkflowStepSupersededError",
    "acancel_workflow",
    "aresume_workflow",
    "aretry_workflow",
    "astart_workflow",
    "aworkflow_status",
    "cancel_workflow",
    "get_engine",
    "register_intake",
    "resume_workflow",
    "retry_workflow",
    "start_workflow",
    "step",
    "unregister_intake",
    "workflow",
    "workflow_status",
]
