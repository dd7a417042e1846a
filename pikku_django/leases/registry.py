"""The project's lease service, built once from ``PIKKU`` settings."""

from __future__ import annotations

import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from pikku_django.conf import pikku_settings
from pikku_django.leases.base import LeaseService

BACKENDS = ("database", "redis", "memory")

_lock = threading.Lock()
_service: LeaseService | None = None


def build_lease_service() -> LeaseService:
    """A new lease service as ``PIKKU['LEASE_BACKEND']`` describes it."""
    backend = pikku_settings.LEASE_BACKEND
    if backend == "database":
        from pikku_django.leases.database import DatabaseLeaseService

        return DatabaseLeaseService(
            pikku_settings.LEASE_DATABASE, prepared=bool(pikku_settings.LEASE_PREPARED_STATEMENTS)
        )
    if backend == "redis":
        from pikku_django.leases.redis import RedisLeaseService

        return RedisLeaseService(pikku_settings.LEASE_CACHE, prefix=pikku_settings.LEASE_KEY_PREFIX)
    if backend == "memory":
        from pikku_django.leases.memory import InMemoryLeaseService

        return InMemoryLeaseService()
    if isinstance(backend, str) and "." in backend:
        try:
            cls = import_string(backend)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"PIKKU['LEASE_BACKEND'] {backend!r} cannot be imported: {exc}"
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, LeaseService)):
            raise ImproperlyConfigured(
                f"PIKKU['LEASE_BACKEND'] {backend!r} is not a LeaseService subclass"
            )
        return cls()
    raise ImproperlyConfigured(
        f"PIKKU['LEASE_BACKEND'] is {backend!r}; use one of {', '.join(BACKENDS)} "
        "or the dotted path of a LeaseService subclass."
    )


def get_lease_service() -> LeaseService:
    """The project's lease service (built on first use, shared by every thread)."""
    global _service
    if _service is None:
        with _lock:
            if _service is None:
                _service = build_lease_service()
    return _service


def reset_lease_service() -> None:
    """Forget the built service, so the next call reads the settings again."""
    global _service
    with _lock:
        old, _service = _service, None
    if old is not None:
        old.close()


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    # After conf's own receiver (connected first, as this module imports conf).
    if setting in ("PIKKU", "DATABASES", "CACHES"):
        reset_lease_service()
