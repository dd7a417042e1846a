"""The wake-up channels and payloads, and what a database can do about them."""

from __future__ import annotations

from django.db import connections

from pikku_django.conf import pikku_settings
from pikku_django.pooling import Pooling, pooling_of

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
    return None if pooling_of(using) is Pooling.TRANSACTION else using


def worker_poll_interval(using: str, configured: float) -> float:
    """How often a notified worker on ``using`` polls: ``configured``, or at most
    ``WORKER_POOLED_POLL_INTERVAL`` where announcements are made but none can be heard."""
    if notifies(using) and listen_alias(using) is None:
        return min(configured, float(pikku_settings.WORKER_POOLED_POLL_INTERVAL))
    return configured
