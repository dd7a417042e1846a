"""Picklable builders of lease services, for contracts that race separate processes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from pikku_django.leases import LeaseService


@dataclass(frozen=True)
class DatabaseServiceFactory:
    """Builds a database lease service on ``settings_dict`` in a fresh process."""

    settings_dict: dict[str, Any] = field(hash=False)

    def __call__(self) -> LeaseService:
        from django.conf import settings

        if not settings.configured:
            settings.configure(DATABASES={"default": dict(self.settings_dict)}, USE_TZ=True)
        from pikku_django.leases.database import DatabaseLeaseService

        return DatabaseLeaseService("default")


@dataclass(frozen=True)
class RedisServiceFactory:
    """Builds a redis lease service on ``url`` and ``prefix`` in a fresh process."""

    url: str
    prefix: str

    def __call__(self) -> LeaseService:
        import redis

        from pikku_django.leases.redis import RedisLeaseService

        return RedisLeaseService(client=redis.Redis.from_url(self.url), prefix=self.prefix)


def unique_prefix() -> str:
    """A Redis key prefix no other test uses."""
    return f"pikku-test:{uuid.uuid4().hex}:"
