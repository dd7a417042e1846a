"""The engine's settings, read from ``PIKKU`` into one frozen object."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from pikku_django.conf import pikku_settings
from pikku_django.workflows.control.queues import QueueSettings, Rate, parse_queues
from pikku_django.workflows.durations import parse_duration


@dataclass(frozen=True)
class EngineConfig:
    """Everything a :class:`~pikku_django.workflows.WorkflowEngine` reads from settings.

    Built from ``PIKKU`` by :meth:`from_settings`; give one to an engine to run it
    with other values than the project's (several engines can coexist).
    """

    database: str = "default"
    step_retries: int = 5
    step_retry_delay: float = 1.0
    step_backoff: str = "fixed"
    step_lease_ms: int = 60_000
    queue_lease_ms: MappingProxyType[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: The queues declared in ``PIKKU["QUEUES"]`` (``QUEUE_LEASE_MS`` folded in).
    queues: MappingProxyType[str, QueueSettings] = field(
        default_factory=lambda: MappingProxyType({})
    )
    run_lease_ms: int = 30_000
    run_pass_timeout: float = 300.0
    notify: bool = True
    prepared_statements: bool = True
    #: How often a pass that hit a data or programming error is tried before the run fails.
    pass_error_tries: int = 3
    #: Whether a worker thread carries a run on from the step it settled to its next pass.
    carry_runs: bool = True
    #: Whether passes are limited to runs of the versions this code carries.
    carried_versions_only: bool = False
    #: Whether starting a run finds the queued step its first pass would reach.
    first_step_at_start: bool = True
    #: The most steps a run may record (a workflow's ``max_steps`` overrides it).
    max_steps_per_run: int = 100_000

    @classmethod
    def from_settings(cls, **overrides: Any) -> EngineConfig:
        """The values of ``settings.PIKKU`` (with ``overrides`` on top)."""
        s = pikku_settings
        queues = parse_queues(s.QUEUES, s.QUEUE_LEASE_MS)
        values: dict[str, Any] = {
            "database": s.WORKFLOW_DATABASE,
            "step_retries": int(s.STEP_RETRIES),
            "step_retry_delay": parse_duration(s.STEP_RETRY_DELAY, what="STEP_RETRY_DELAY"),
            "step_backoff": str(s.STEP_BACKOFF),
            "step_lease_ms": int(s.STEP_LEASE_MS),
            "queue_lease_ms": MappingProxyType(
                {q.name: q.lease_ms for q in queues.values() if q.lease_ms is not None}
            ),
            "queues": MappingProxyType(queues),
            "run_lease_ms": int(s.RUN_LEASE_MS),
            "run_pass_timeout": float(s.RUN_PASS_TIMEOUT),
            "notify": bool(s.WORKER_NOTIFY),
            "prepared_statements": bool(s.PREPARED_STATEMENTS),
            "pass_error_tries": int(s.PASS_ERROR_TRIES),
            "carry_runs": bool(s.CARRY_RUNS),
            "carried_versions_only": bool(s.WORKFLOW_CARRIED_VERSIONS_ONLY),
            "first_step_at_start": bool(s.FIRST_STEP_AT_START),
            "max_steps_per_run": check_max_steps(s.MAX_STEPS_PER_RUN, "MAX_STEPS_PER_RUN"),
        }
        values.update(overrides)
        return cls(**values)

    def lease_ms_for_queue(self, queue: str) -> int:
        """The step lease of ``queue``: its own, or the default."""
        declared = self.queues.get(queue)
        if declared is not None and declared.lease_ms is not None:
            return declared.lease_ms
        return int(self.queue_lease_ms.get(queue, self.step_lease_ms))

    def concurrency_of(self, queue: str) -> int | None:
        """At most how many of ``queue``'s steps run at once (None: no limit)."""
        declared = self.queues.get(queue)
        return None if declared is None else declared.concurrency

    def rate_of(self, queue: str) -> Rate | None:
        """At most how many of ``queue``'s steps are claimed per period (None: no limit)."""
        declared = self.queues.get(queue)
        return None if declared is None else declared.rate

    def is_limited(self, queue: str) -> bool:
        """Whether ``queue``'s claims are counted: it has a concurrency or rate limit."""
        return self.concurrency_of(queue) is not None or self.rate_of(queue) is not None


def check_max_steps(value: object, what: str) -> int:
    """``value`` as a limit of steps per run: an int of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ImproperlyConfigured(f"{what} must be an int of at least 1, not {value!r}")
    return value


#: A workflow's ``retention`` that keeps its runs however old a default would delete.
FOREVER = "forever"


def check_retention(value: object, what: str) -> float:
    """``value`` (seconds, a timedelta, text like "30d", or "forever") as the age in
    seconds after which a settled run is deleted: above 0, ``math.inf`` for "forever"."""
    if isinstance(value, str) and value.strip().lower() == FOREVER:
        return math.inf
    try:
        seconds = parse_duration(value, what=what)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{exc} (or {FOREVER!r})") from None
    if seconds <= 0:
        raise ImproperlyConfigured(
            f"{what} must be more than 0 seconds (e.g. '30d') or {FOREVER!r}, not {value!r}"
        )
    return seconds


_lock = threading.Lock()
_current: EngineConfig | None = None


def engine_config() -> EngineConfig:
    """The project's engine settings, read once until ``PIKKU`` changes."""
    global _current
    found = _current
    if found is None:
        with _lock:
            found = _current = _current or EngineConfig.from_settings()
    return found


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    global _current
    if setting == "PIKKU":
        with _lock:
            _current = None
