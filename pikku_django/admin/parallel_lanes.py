"""A parallel group on the run page: its branches side by side, one lane each."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.safestring import SafeString

from pikku_django.admin.formatting import error_part, format_duration, status_badge
from pikku_django.models import WorkflowStep

#: The most lanes one group shows; the rest are counted by status.
LANES_SHOWN = 100


@dataclass(frozen=True)
class Lane:
    """One branch of a parallel group."""

    step: WorkflowStep
    badge: SafeString
    attempts_label: str
    duration: str
    error_message: str
    child_link: SafeString | None


@dataclass(frozen=True)
class ParallelLanes:
    """A group's branches in the order they were started, and their count by status."""

    lanes: list[Lane]
    hidden: int
    by_status: list[tuple[str, int]]


def parallel_lanes(
    branches: Sequence[WorkflowStep], child_link: Callable[[WorkflowStep], SafeString | None]
) -> ParallelLanes:
    """The lanes of ``branches`` (one group's, in start order)."""
    lanes = [
        Lane(
            step=step,
            badge=status_badge(step.status, step.get_status_display()),
            attempts_label=f"{step.attempt}/{step.attempts_allowed}",
            duration=format_duration(step.updated_at - step.created_at),
            error_message=error_part(step.error, "message"),
            child_link=child_link(step),
        )
        for step in branches[:LANES_SHOWN]
    ]
    counts = Counter(str(step.get_status_display()) for step in branches)
    return ParallelLanes(lanes, max(0, len(branches) - LANES_SHOWN), sorted(counts.items()))
