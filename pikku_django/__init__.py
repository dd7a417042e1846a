"""pikku_django: durable workflows, fenced leases and verified webhook sources for Django."""

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

__version__ = "0.1.0"

__all__ = [
    "HeldLease",
    "InMemoryLeaseService",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "LeaseService",
    "LeaseTakenError",
    "__version__",
    "get_lease_service",
    "hold_lease",
]
