"""The rows a run's timeline chart is drawn from, and the shapes it is drawn with.

:class:`StepRow` and :class:`AttemptRow` are a run's steps and attempts as stored
(:func:`step_rows` reads them from the model rows the run page already has);
:class:`Chart`, :class:`Lane`, :class:`Bar`, :class:`Mark` and :class:`Tick` are what
:func:`pikku_django.admin.timeline.layout` makes of them, in the units of the chart's
``viewBox``, and what ``admin/pikku_django/workflowrun/_timeline.html`` draws.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.urls import reverse

from pikku_django.admin.formatting import error_part, format_duration, format_time, workflow_title
from pikku_django.models import WorkflowStep

#: The most lanes drawn: the first half and the last half of them; the rest are summarized.
LANES_SHOWN = 400
#: The most attempts drawn in one lane: its last ones; the earlier are summarized.
ATTEMPTS_SHOWN = 20
#: The chart's size, in the units of its viewBox.
WIDTH = 1000
LABEL_WIDTH = 230
PLOT_LEFT = 240
PLOT_RIGHT = 985
AXIS_HEIGHT = 26
LANE_HEIGHT = 22
BAR_HEIGHT = 14
WAIT_HEIGHT = 8
#: The narrowest bar drawn, so that a short attempt stays visible on a long axis.
MIN_WIDTH = 2.0
#: How many characters of a step's name its lane's label shows (all of it in the tooltip).
LABEL_CHARS = 28


class Outcome(enum.StrEnum):
    """How an attempt ended, as its bar shows it (colour and pattern both)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUPERSEDED = "superseded"
    RUNNING = "running"


class MarkKind(enum.StrEnum):
    """What a mark between or instead of attempts stands for."""

    QUEUED = "queued"  # in its queue before the first attempt
    BACKOFF = "backoff"  # a retry's wait after a failed attempt
    EARLIER = "earlier"  # attempts not drawn, summarized
    SLEEP = "sleep"
    EVENT = "event"
    APPROVAL = "approval"  # a suspension, until resumed
    CHILD = "child"  # a child run, until it settles
    GROUP = "group"  # a parallel group, until its branches settle
    DUE = "due"  # when a wait times out, or a sleep ends, still ahead
    INSTANT = "instant"  # a published value, a patch marker


#: Marks drawn as hollow bars with a word inside (when it fits).
WAITS = frozenset({MarkKind.SLEEP, MarkKind.EVENT, MarkKind.APPROVAL, MarkKind.CHILD})


@dataclass(frozen=True)
class AttemptRow:
    """One attempt of a step, as stored."""

    attempt: int
    status: str
    started_at: datetime
    finished_at: datetime | None = None
    error_type: str = ""
    worker: str = ""


@dataclass(frozen=True)
class StepRow:
    """One step of a run, as stored, with its attempts in order."""

    id: int
    name: str
    kind: str
    status: str
    created_at: datetime
    updated_at: datetime
    available_at: datetime | None = None
    group_id: int | None = None
    error_type: str = ""
    attempts: tuple[AttemptRow, ...] = ()
    #: A child run's admin page, its name and status ("" without one).
    child_url: str = ""
    child_label: str = ""
    child_status: str = ""


@dataclass(frozen=True)
class Bar:
    """An attempt: ``x``/``width`` in viewBox units; ``title`` its tooltip (plain text)."""

    x: float
    width: float
    outcome: Outcome
    attempt: int
    title: str


@dataclass(frozen=True)
class Mark:
    """A wait, a gap or a moment in a lane; ``href`` links a child run's page."""

    kind: MarkKind
    x: float
    width: float
    title: str
    label: str = ""
    href: str = ""

    @property
    def end(self) -> float:
        return round(self.x + self.width, 1)

    @property
    def left(self) -> float:
        return round(self.x - 4, 1)

    @property
    def right(self) -> float:
        return round(self.x + 4, 1)

    @property
    def text_x(self) -> float:
        return round(self.x + 4, 1)

    @property
    def fits(self) -> bool:
        """Whether the mark's word fits inside it (it is in its tooltip all the same)."""
        return bool(self.label) and self.width >= 7 * len(self.label) + 8


@dataclass(frozen=True)
class Lane:
    """One step (or a summary of the steps not drawn), at ``y`` in viewBox units."""

    y: float
    step_id: int | None
    name: str
    label: str
    title: str
    status: str
    kind: str
    branch: bool
    bars: list[Bar] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    summary: bool = False

    @property
    def bar_y(self) -> float:
        return self.y + (LANE_HEIGHT - BAR_HEIGHT) / 2

    @property
    def wait_y(self) -> float:
        return self.y + (LANE_HEIGHT - WAIT_HEIGHT) / 2

    @property
    def mid_y(self) -> float:
        return self.y + LANE_HEIGHT / 2

    @property
    def wait_bottom(self) -> float:
        return self.wait_y + WAIT_HEIGHT

    @property
    def top(self) -> float:
        return self.y + 4

    @property
    def bottom(self) -> float:
        return self.y + LANE_HEIGHT - 4

    @property
    def text_y(self) -> float:
        return self.y + LANE_HEIGHT / 2 + 4

    @property
    def label_x(self) -> float:
        return 18.0 if self.branch else 4.0


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Chart:
    """The whole chart: its lanes top to bottom, the axis's ticks, what it spans."""

    lanes: list[Lane]
    ticks: list[Tick]
    start: datetime
    end: datetime
    steps: int
    hidden: int
    width: int = WIDTH
    label_width: int = LABEL_WIDTH
    plot_left: int = PLOT_LEFT
    plot_right: int = PLOT_RIGHT
    axis_height: int = AXIS_HEIGHT
    lane_height: int = LANE_HEIGHT
    bar_height: int = BAR_HEIGHT
    wait_height: int = WAIT_HEIGHT

    @property
    def height(self) -> int:
        return len(self.lanes) * LANE_HEIGHT

    @property
    def stripe_height(self) -> int:
        return 2 * LANE_HEIGHT

    @property
    def start_label(self) -> str:
        return format_time(self.start)

    @property
    def end_label(self) -> str:
        return format_time(self.end)

    @property
    def span_label(self) -> str:
        return format_duration(self.end - self.start)


# -- from the models ------------------------------------------------------------------


def step_rows(steps: Iterable[WorkflowStep]) -> list[StepRow]:
    """Rows of ``steps`` (read with ``select_related("child_run")`` and
    ``prefetch_related("attempts")``): no query of its own."""
    rows = []
    for step in steps:
        child = step.child_run
        rows.append(
            StepRow(
                id=step.pk,
                name=step.name,
                kind=step.kind,
                status=step.status,
                created_at=step.created_at,
                updated_at=step.updated_at,
                available_at=step.available_at,
                group_id=step.group_id,
                error_type=error_part(step.error, "type"),
                attempts=tuple(
                    AttemptRow(
                        attempt=a.attempt,
                        status=a.status,
                        started_at=a.started_at,
                        finished_at=a.finished_at,
                        error_type=error_part(a.error, "type"),
                        worker=a.worker,
                    )
                    for a in sorted(step.attempts.all(), key=lambda a: a.attempt)
                ),
                child_url=""
                if child is None
                else reverse("admin:pikku_django_workflowrun_change", args=[child.pk]),
                child_label=""
                if child is None
                else f"{workflow_title(child.workflow, child.idempotency_key)} {child.pk}",
                child_status="" if child is None else child.status,
            )
        )
    return rows


__all__ = [
    "ATTEMPTS_SHOWN",
    "LANES_SHOWN",
    "AttemptRow",
    "Bar",
    "Chart",
    "Lane",
    "Mark",
    "MarkKind",
    "Outcome",
    "StepRow",
    "Tick",
    "step_rows",
]
