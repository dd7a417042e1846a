"""Fenced leases: named, time-bounded grants judged on the store's clock."""

from pikku_django.leases.base import Lease, LeaseService
from pikku_django.leases.errors import LeaseError, LeaseLostError, LeaseTakenError
from pikku_django.leases.hold import HeldLease, hold_lease
from pikku_django.leases.memory import InMemoryLeaseService, LeaseTokens
from pikku_django.leases.registry import get_lease_service, reset_lease_service

__all__ = [
    "HeldLease",
    "InMemoryLeaseService",
    "Lease",
    "LeaseError",
    "LeaseLostError",
    "LeaseService",
    "LeaseTakenError",
    "LeaseTokens",
    "get_lease_service",
    "hold_lease",
    "reset_lease_service",
]


def __getattr__(name: str) -> object:
    # Backends that import Django's database or django-redis load on first use.
    if name == "DatabaseLeaseService":
        from pikku_django.leases.database import DatabaseLeaseService

        return DatabaseLeaseService
    if name == "RedisLeaseService":
        from pikku_django.leases.redis import RedisLeaseService

        return RedisLeaseService
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
