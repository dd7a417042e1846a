"""The ``PIKKU`` settings dict, with its documented defaults."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

#: Every key the ``PIKKU`` dict understands, with its default.
DEFAULTS: dict[str, Any] = {
    # Where leases live: "database", "redis", "memory", or the dotted path of a
    # LeaseService subclass (built with no arguments).
    "LEASE_BACKEND": "database",
    # The DATABASES alias the database backend writes its leases through.
    "LEASE_DATABASE": "default",
    # The CACHES alias of a django-redis cache, required by the redis backend.
    "LEASE_CACHE": None,
    # Prefix for the Redis keys the redis backend writes.
    "LEASE_KEY_PREFIX": "pikku:lease:",
    # Default length of a lease held with hold_lease(), in milliseconds.
    "LEASE_TTL_MS": 30_000,
}


class PikkuSettings:
    """Reads ``settings.PIKKU``, falling back to :data:`DEFAULTS` key by key."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"PIKKU has no setting {name!r}")
        user = getattr(settings, "PIKKU", None) or {}
        return user.get(name, DEFAULTS[name])

    def user_keys(self) -> set[str]:
        """The keys the project set in ``settings.PIKKU``."""
        user = getattr(settings, "PIKKU", None) or {}
        return set(user) if isinstance(user, dict) else set()


pikku_settings = PikkuSettings()


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting in ("PIKKU", "DATABASES", "CACHES"):
        from pikku_django.leases.registry import reset_lease_service

        reset_lease_service()
