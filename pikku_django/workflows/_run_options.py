"""Run options: one start's priority, queue and start time, resolved once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from pikku_django.workflows import registry
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
    return RunOptions(
        priority=registry.check_priority(definition.priority if priority is None else priority),
        queue=registry.check_queue(queue) if queue is not None else definition.queue or "",
        start_at=start_at,
    )
