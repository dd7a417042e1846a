"""Durable workflows: functions replayed step by step, run by ``pikku_worker``."""

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
from pikku_django.workflows.registry import step, workflow
from pikku_django.workflows.store import NewRun

__all__ = [
    "ClaimedStep",
    "Clock",
    "EngineConfig",
    "FakeClock",
    "Intake",
    "NewRun",
    "NonDeterministicWorkflowError",
    "NotSerializableError",
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
