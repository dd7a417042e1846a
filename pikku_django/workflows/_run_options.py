"""Run options: one start's priority, queue and start time, resolved once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from pikku_django.workflows import registry
from pikku_django.workflows._concurrency import (
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

    def due_at(self, now: datetime) -> datetime:
        """When the run's first pass falls due, started at ``now``."""
        return now if self.start_at is None or self.start_at < now else self.start_at


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
) -> RunOptions:
    """A start's options: the call's, else the workflow's defaults. ValueError or
    TypeError, naming the argument, for anything out of range."""
    if start_at is not None and delay is not None:
        raise ValueError("Give start_at or delay, not both: start_at is a time, delay a wait")
    if start_at is not None:
        if not isinstance(start_at, datetime):
            raise TypeError(
                f"start_at must be a timezone-aware datetime, not {type(start_at).__name__}"
            )
        if timezone.is_naive(start_at):
            raise ValueError(
                f"start_at must be timezone-aware (e.g. timezone.now() + timedelta(...)), "
                f"not the naive {start_at.isoformat()}"
            )
    elif delay is not None:
        start_at = now + timedelta(seconds=registry.check_delay(delay))
    elif definition.delay and not inline:  # an inline start asks for now
        start_at = now + timedelta(seconds=definition.delay)
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
    )
