"""Durable workflows: functions replayed step by step, run by ``pikku_worker``."""

from pikku_django.workflows._fanout import Branch, JoinPolicy, Outcome, ParallelGroup
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
from pikku_django.workflows.store import NewRun

__all__ = [
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "Branch",
    "ClaimedStep",
    "Clock",
    "EngineConfig",
    "FakeClock",
    "Intake",
    "JoinPolicy",
    "NewRun",
    "NonDeterministicWorkflowError",
    "NotSerializableError",
    "Outcome",
    "ParallelGroup",
    "QueueSettings",
    "Rate",
    "RunOptions",
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
