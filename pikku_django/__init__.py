"""pikku_django: durable workflows, fenced leases and verified webhook sources for Django."""

from pikku_django._version import __version__
from pikku_django.leases import (
    HeldLease,
    InMemoryLeaseService,
    Lease,
    LeaseError,
    LeaseLostError,
    LeaseService,
    LeaseTakenError,
    get_lease_service,
    hold_lease,
)

_WORKFLOW_API = {
    "start_workflow",
    "resume_workflow",
    "cancel_workflow",
    "astart_workflow",
    "aresume_workflow",
    "acancel_workflow",
    "workflow",
    "step",
    "WorkflowContext",
    "WorkflowEngine",
    "StepFailedError",
    "FakeClock",
    "send_event",
    "send_event_with_start",
    "wait_for_run",
    "await_run",
    "JoinPolicy",
}


def __getattr__(name: str) -> object:
    # The workflow API imports models, so it loads once Django's apps are ready.
    if name in _WORKFLOW_API:
        from pikku_django import workflows

        return getattr(workflows, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FakeClock",
    "HeldLease",
    "InMemoryLeaseService",
    "JoinPolicy",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "LeaseService",
    "LeaseTakenError",
    "StepFailedError",
    "WorkflowContext",
    "WorkflowEngine",
    "__version__",
    "acancel_workflow",
    "aresume_workflow",
    "astart_workflow",
    "await_run",
    "cancel_workflow",
    "get_lease_service",
    "hold_lease",
    "resume_workflow",
    "send_event",
    "send_event_with_start",
    "start_workflow",
    "step",
    "wait_for_run",
    "workflow",
]
