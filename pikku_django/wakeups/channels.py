"""The wake-up channels and payloads, and what a database can do about them."""

from __future__ import annotations

import enum
from typing import Any

from django.conf import settings
from django.db import connections

from pikku_django.conf import pikku_settings

#: New work: due runs and steps (payload ""), or an intake's items (its payload).
WORK_CHANNEL = "pikku_work"
#: A run ended; the payload is its id.
RUN_DONE_CHANNEL = "pikku_run_done"
#: A webhook source's row or a credential value changed (a trigger, migration 0005).
SOURCES_CHANNEL = "pikku_sources"

#: Payloads on :data:`WORK_CHANNEL`: any work, webhook receipts, runs waiting for a key.
ANY_WORK = ""
RECEIPTS_WAITING = "receipts"
KEYS_WAITING = "pikku.concurrency_keys"


# -- what a database can do --------------------------------------------------------------


class Pooling(enum.StrEnum):
    """How a database alias reaches its server (``PIKKU["DATABASE_POOLING"]``)."""

    NONE = "none"
    SESSION = "session"
    TRANSACTION = "transaction"


def pooling(using: str) -> Pooling:
    """The pooling mode stated for ``using`` (missing or unknown: none). Read from
    ``settings.PIKKU`` as it is, so that a value of the wrong type reads as none."""
    stated = _pikku().get("DATABASE_POOLING", {})
    value = stated.get(using) if isinstance(stated, dict) else None
    return Pooling(value) if isinstance(value, str) and value in set(Pooling) else Pooling.NONE


def _pikku() -> dict[str, Any]:
    raw = getattr(settings, "PIKKU", None) or {}
    return raw if isinstance(raw, dict) else {}


def notifies(using: str) -> bool:
    """Whether ``using``'s database carries notifications (PostgreSQL's NOTIFY)."""
    return connections[using].vendor == "postgresql"


def listen_alias(using: str) -> str | None:
    """The alias a LISTEN on ``using``'s database connects through; None where waiters
    poll (no notifications, or a transaction pooler and no ``LISTEN_DATABASES`` alias)."""
    if not notifies(using):
        return None
    stated = pikku_settings.LISTEN_DATABASES
    direct = stated.get(using) if isinstance(stated, dict) else None
    if isinstance(direct, str) and direct:
        return direct
    return None if pooling(using) is Pooling.TRANSACTION else using


def worker_poll_interval(using: str, configured: float) -> float:
    """How often a notified worker on ``using`` polls: ``configured``, or at most
    ``WORKER_POOLED_POLL_INTERVAL`` where announcements are made but none can be heard."""
    if notifies(using) and listen_alias(using) is None:
        return min(configured, float(pikku_settings.WORKER_POOLED_POLL_INTERVAL))
    return configured
