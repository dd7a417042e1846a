"""Run options: one start's priority, queue, start time and deadline, resolved once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from pikku_django.workflows import registry
from pikku_django.workflows.control._concurrency import (
    check_concurrency_key,
    check_concurrency_limit,
    key_for,
)
from pikku_django.workflows.durations import Duration
from pikku_django.workflows.registry import WorkflowDefinition


@dataclass(frozen=True)
class RunOptions:
    """How a new run is scheduled, after the workflow's defaults are applied."""

    #: -100 to 100: its passes and steps are claimed highest first.
    priority: int = 0
    #: The queue of its steps that name none ("": the default queue).
    queue: str = ""
    #: Its first pass is not claimed before this time (None: at once).
    start_at: datetime | None = None
    #: Runs sharing this key run at most ``concurrency_limit`` at a time (None: no key).
    concurrency_key: str | None = None
    concurrency_limit: int = 1
    #: It fails with WorkflowTimeoutError if it has not ended by then (None: never).
    deadline_at: datetime | None = None

    def due_at(self, now: datetime) -> datetime:
        """When the run's first pass falls due, started at ``now``."""
        return now if self.start_at is None or self.start_at < now else self.start_at

    def run_columns(self, now: datetime, *, inline: bool = False) -> dict[str, Any]:
        """A new run's columns these options set, started at ``now``: a keyed run
        waits, not due, until a worker gives it a slot; an inline run is not due."""
        keyed = self.concurrency_key is not None
        return {
            "priority": self.priority,
            "queue": self.queue,
            "start_at": self.start_at,
            "deadline_at": self.deadline_at,
            "concurrency_key": self.concurrency_key,
            "concurrency_limit": self.concurrency_limit,
            "key_waiting": keyed,
            "wake_at": None if inline or keyed else self.due_at(now),
        }


def resolve_run_options(
    definition: WorkflowDefinition,
    now: datetime,
    *,
    priority: int | None = None,
    queue: str | None = None,
    start_at: datetime | None = None,
    delay: Duration | None = None,
    inline: bool = False,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    input: Any = None,
    deadline: datetime | None = None,
    timeout: Duration | None = None,
    debounce: float | None = None,
) -> RunOptions:
    """A start's options: the call's, else the workflow's defaults. ValueError or
    TypeError, naming the argument, for anything out of range."""
    if start_at is not None and delay is not None:
        raise ValueError("Give start_at or delay, not both: start_at is a time, delay a wait")
    if start_at is not None:
        check_aware(start_at, "start_at")
    elif delay is not None:
        start_at = now + timedelta(seconds=registry.check_delay(delay))
    elif definition.delay and not inline:  # an inline start asks for now
        start_at = now + timedelta(seconds=definition.delay)
    if debounce is not None:
        # A debounced run starts once its window is quiet (or at start_at, if later).
        quiet = now + timedelta(seconds=debounce)
        start_at = quiet if start_at is None or start_at < quiet else start_at
    if inline and start_at is not None and start_at > now:
        raise ValueError(
            "An inline run runs to its end before start_workflow returns: it cannot start "
            "later. Leave inline unset to have a worker start it at start_at"
        )
    if concurrency_key is not None:
        key: str | None = check_concurrency_key(concurrency_key)
    else:
        key = key_for(definition.concurrency_key, input)
    if key is not None and inline:
        raise ValueError(
            "An inline run runs at once, so it cannot wait for its concurrency_key: "
            "leave inline unset to have a worker start it when the key has a free slot"
        )
    limit = check_concurrency_limit(
        definition.concurrency_limit if concurrency_limit is None else concurrency_limit
    )
    return RunOptions(
        concurrency_key=key,
        concurrency_limit=limit,
        priority=registry.check_priority(definition.priority if priority is None else priority),
        queue=registry.check_queue(queue) if queue is not None else definition.queue or "",
        start_at=start_at,
        deadline_at=_deadline(definition, now if start_at is None else start_at, deadline, timeout),
    )


def check_aware(when: object, what: str) -> datetime:
    """``when`` if it is a timezone-aware datetime; TypeError or ValueError naming ``what``."""
    if not isinstance(when, datetime):
        raise TypeError(f"{what} must be a timezone-aware datetime, not {type(when).__name__}")
    if timezone.is_naive(when):
        raise ValueError(
            f"{what} must be timezone-aware (e.g. timezone.now() + timedelta(...)), "
            f"not the naive {when.isoformat()}"
        )
    return when


def _deadline(
    definition: WorkflowDefinition,
    started: datetime,
    deadline: datetime | None,
    timeout: Duration | None,
) -> datetime | None:
    """The run's deadline: ``deadline``, else ``timeout`` (or the workflow's) after
    ``started`` (when its first pass falls due)."""
    if deadline is not None and timeout is not None:
        raise ValueError("Give deadline or timeout, not both: deadline is a time, timeout a span")
    if deadline is not None:
        return check_aware(deadline, "deadline")
    seconds = registry.check_timeout(timeout) if timeout is not None else definition.timeout
    return None if seconds is None else started + timedelta(seconds=seconds)
