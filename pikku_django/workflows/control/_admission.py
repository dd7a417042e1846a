"""Per-key concurrency: workers give waiting keyed runs their slots, in start order.

A run started with a ``concurrency_key`` is created waiting (``key_waiting``, not
due). Each worker looks for waiting runs as an
:class:`~pikku_django.workflows.worker.intake.Intake`: under one lock shared by every
worker, a key whose runs in progress (started, not finished) are fewer than its limit
has its oldest waiting runs made due. A run holds its slot until it completes, fails or
is cancelled, also while its worker is dead and its run lease lapses, so a key is never
over its limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Min, Q, QuerySet
from django.dispatch import receiver
from django.utils import timezone

from pikku_django import signals
from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.wakeups import KEYS_WAITING, announce
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.store import WorkflowStore
from pikku_django.workflows.worker.intake import RunStarter, register_intake

logger = workflow_logger(__name__)

#: The lock every worker's admission takes (no queue can have this name: queue
#: names have no surrounding spaces).
ADMISSION_LOCK = " concurrency keys "
#: Seconds after a look that found waiting runs that an ending run notifies workers.
_NOTIFY_WINDOW = 60.0
#: When this process's last look at each database found waiting runs (monotonic
#: seconds); a look that finds none removes its database.
_last_seen_waiting: dict[str, float] = {}


@dataclass(frozen=True)
class KeyState:
    """One concurrency key's runs: in progress, its limit, and its free slots."""

    key: str
    in_progress: int
    limit: int

    @property
    def free(self) -> int:
        return max(self.limit - self.in_progress, 0)


def waiting_runs(store: WorkflowStore, now: datetime | None = None) -> QuerySet[WorkflowRun]:
    """Runs waiting for a slot of their key that may start at ``now`` (start_at reached)."""
    now = now or timezone.now()
    return store.runs().filter(
        Q(start_at__isnull=True) | Q(start_at__lte=now),
        key_waiting=True,
        status=RunStatus.RUNNING,
    )


def key_state(store: WorkflowStore, key: str, limit: int) -> KeyState:
    """How many runs of ``key`` are in progress (started, not finished)."""
    busy = (
        store.runs()
        .filter(
            concurrency_key=key,
            key_waiting=False,
            status__in=(RunStatus.RUNNING, RunStatus.SUSPENDED),
        )
        .count()
    )
    return KeyState(key, busy, limit)


def _keys(store: WorkflowStore, limit: int, now: datetime) -> list[str]:
    """Keys with waiting runs, the longest waiting first."""
    rows = (
        waiting_runs(store, now)
        .values("concurrency_key")
        .annotate(first=Min("created_at"))
        .order_by("first", "concurrency_key")
        .values_list("concurrency_key", flat=True)[:limit]
    )
    return [key for key in rows if key is not None]


def _head(store: WorkflowStore, key: str, count: int, now: datetime) -> list[tuple[Any, int]]:
    """The oldest ``count`` waiting runs of ``key``: (id, limit) each."""
    return list(
        waiting_runs(store, now)
        .filter(concurrency_key=key)
        .order_by("created_at", "id")
        .values_list("id", "concurrency_limit")[:count]
    )


def admit(store: WorkflowStore, limit: int, now: datetime | None = None) -> int:
    """Make due at ``now`` the oldest waiting runs of up to ``limit`` keys with a free
    slot: how many runs were admitted."""
    now = now or timezone.now()
    if not waiting_runs(store, now).exists():
        _last_seen_waiting.pop(store.using, None)
        return 0
    _last_seen_waiting[store.using] = time.monotonic()
    admitted = 0
    with store.claims_serialised(), store.limited_claim([ADMISSION_LOCK]):
        for key in _keys(store, limit, now):
            head = _head(store, key, 1, now)
            if not head:
                continue
            state = key_state(store, key, head[0][1])
            if state.free <= 0:
                continue
            ids = [run_id for run_id, _ in _head(store, key, state.free, now)]
            made = store.admit_runs(ids, now)
            admitted += made
            logger.debug("Key %r: %d run(s) admitted, %d in progress", key, made, state.in_progress)
        if admitted:
            store.notify()
    return admitted


def admittable(store: WorkflowStore, now: datetime | None = None, limit: int = 100) -> bool:
    """Whether a waiting run's key has a free slot (a look, nothing written)."""
    now = now or timezone.now()
    for key in _keys(store, limit, now):
        head = _head(store, key, 1, now)
        if head and key_state(store, key, head[0][1]).free > 0:
            return True
    return False


class KeyAdmission:
    """Waiting keyed runs as a source of work for the worker."""

    name = "pikku.concurrency_keys"
    notify_payload: str | None = KEYS_WAITING

    def start_waiting(self, engine: RunStarter, limit: int) -> int:
        return admit(engine.store, limit, _now(engine))

    def has_waiting(self, engine: RunStarter) -> bool:
        return admittable(engine.store, _now(engine))


def _now(engine: RunStarter) -> datetime:
    """The engine's clock (a test's fake one), else the wall clock."""
    clock = getattr(engine, "clock", None)
    return clock.now() if clock is not None else timezone.now()


@receiver(signals.run_finished, dispatch_uid="pikku_django.concurrency_keys")
def _slot_freed(sender: Any, **kwargs: Any) -> None:
    """A run ended while keyed runs wait: tell workers to look now."""
    store = getattr(sender, "store", None)
    if store is None:
        return
    seen = _last_seen_waiting.get(store.using)
    if seen is None or time.monotonic() - seen > _NOTIFY_WINDOW:
        return
    announce(store.using, KEYS_WAITING, notifying=store.notifying)


def register() -> None:
    """Make workers admit waiting keyed runs (from the AppConfig)."""
    register_intake(KeyAdmission())
