"""A run's steps on a time axis: the geometry of the run page's timeline chart.

:func:`layout` is a pure function from a run's step rows (:class:`StepRow`, each with its
:class:`AttemptRow`\\ s) to a :class:`Chart` of lanes, bars, marks and ticks, in the
units of the chart's ``viewBox``; the template
``admin/pikku_django/workflowrun/_timeline.html`` draws it as SVG, escaping every name
and error. :func:`step_rows` turns the model rows that the run page already read (steps
with their child runs joined and their attempts prefetched) into step rows, with no
query of its own.

One lane per step in the order the workflow reached it, and each parallel group's
branches in lanes right below their group. A queued or inline step's attempts are bars
(succeeded, failed, superseded or running), with the wait in its queue before the first
attempt and each retry's backoff (from an attempt's end to the next one's start, or to
when the next one is due) as marks between them. Sleeps, event waits, approvals
(suspensions) and child runs are marks of their own, a child run's linked to its page.
At most :data:`LANES_SHOWN` lanes are drawn (the first and the last half of them) and
:data:`ATTEMPTS_SHOWN` attempts a lane (its last ones): the rest are summarized.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.utils.translation import gettext as _

from pikku_django.admin.formatting import format_duration, format_time
from pikku_django.admin.timeline_shapes import (
    ATTEMPTS_SHOWN,
    LABEL_CHARS,
    LANE_HEIGHT,
    LANES_SHOWN,
    MIN_WIDTH,
    PLOT_LEFT,
    PLOT_RIGHT,
    AttemptRow,
    Bar,
    Chart,
    Lane,
    Mark,
    MarkKind,
    Outcome,
    StepRow,
    Tick,
    step_rows,
)
from pikku_django.models import AttemptStatus, StepKind, StepStatus

#: Roughly how many ticks the axis has.
TICKS = 8

#: The tick spacings the axis chooses from, in milliseconds.
NICE_STEPS_MS: tuple[int, ...] = (
    *(n * 10**k for k in range(0, 3) for n in (1, 2, 5)),
    *(s * 1000 for s in (1, 2, 5, 10, 15, 30)),
    *(m * 60_000 for m in (1, 2, 5, 10, 15, 30)),
    *(h * 3_600_000 for h in (1, 2, 3, 6, 12, 24, 48, 168)),
)


def outcome_of(attempt: AttemptRow) -> Outcome:
    """An attempt's outcome: one without an end is still running."""
    if attempt.status == AttemptStatus.SUCCEEDED:
        return Outcome.SUCCEEDED
    if attempt.status == AttemptStatus.FAILED:
        return Outcome.FAILED
    if attempt.status == AttemptStatus.SUPERSEDED:
        return Outcome.SUPERSEDED
    return Outcome.RUNNING


def in_order(rows: Sequence[StepRow]) -> list[StepRow]:
    """Steps in the order reached, each parallel group's branches right after it."""
    ordered = sorted(rows, key=lambda r: r.id)
    ids = {r.id for r in ordered}
    branches: dict[int, list[StepRow]] = {}
    for row in ordered:
        if row.group_id is not None and row.group_id in ids:
            branches.setdefault(row.group_id, []).append(row)
    out: list[StepRow] = []

    def place(row: StepRow) -> None:
        out.append(row)
        for branch in branches.get(row.id, []):
            place(branch)

    for row in ordered:
        if row.group_id is None or row.group_id not in ids:
            place(row)
    return out


def _is_open(row: StepRow) -> bool:
    return row.status not in (StepStatus.SUCCEEDED, StepStatus.FAILED)


def _step_end(row: StepRow, now: datetime) -> datetime:
    """When a step's own span (a wait, a group, a child run) ended, or ``now``."""
    return now if _is_open(row) else max(row.updated_at, row.created_at)


def _times(row: StepRow, now: datetime) -> list[datetime]:
    found = [row.created_at, _step_end(row, now)]
    for a in row.attempts:
        found.append(a.started_at)
        found.append(a.finished_at or now)
    if row.available_at is not None and (_is_open(row) or row.status == StepStatus.FAILED):
        found.append(row.available_at)  # a sleep's end, a timeout, a retry: still ahead
    return found


def nice_step_ms(span_ms: float, ticks: int = TICKS) -> int:
    """The tick spacing that gives about ``ticks`` ticks over ``span_ms``."""
    want = span_ms / max(1, ticks)
    for step in NICE_STEPS_MS:
        if step >= want:
            return int(step)
    days = NICE_STEPS_MS[-1]
    return int(-(-want // days) * days)


def offset_label(ms: int) -> str:
    """A tick's offset from the start: ``0``, ``250 ms``, ``1.5 s``, ``2 min 30 s``, ``1 d 2 h``."""
    if ms == 0:
        return "0"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:g} s"
    seconds = ms // 1000
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    return " ".join(f"{n} {unit}" for n, unit in parts if n)


class Scale:
    """Times to x, over the plot between :data:`PLOT_LEFT` and :data:`PLOT_RIGHT`."""

    def __init__(self, start: datetime, end: datetime) -> None:
        self.start = start
        self.span_ms = max(1.0, (end - start).total_seconds() * 1000)
        self.per_ms = (PLOT_RIGHT - PLOT_LEFT) / self.span_ms

    def x(self, at: datetime) -> float:
        ms = (at - self.start).total_seconds() * 1000
        return round(PLOT_LEFT + min(max(ms, 0.0), self.span_ms) * self.per_ms, 1)

    def span(self, begin: datetime, end: datetime) -> tuple[float, float]:
        """``x`` and width of ``begin``..``end``, at least :data:`MIN_WIDTH` wide."""
        x0, x1 = self.x(begin), self.x(max(begin, end))
        width = max(MIN_WIDTH, x1 - x0)
        x0 = min(x0, PLOT_RIGHT - width)
        return round(x0, 1), round(width, 1)

    def ticks(self) -> list[Tick]:
        step = nice_step_ms(self.span_ms)
        return [
            Tick(round(PLOT_LEFT + ms * self.per_ms, 1), offset_label(ms))
            for ms in range(0, int(self.span_ms) + 1, step)
        ]


def _duration(begin: datetime, end: datetime) -> str:
    return format_duration(max(end - begin, timedelta(0)))


def _bar(row: StepRow, a: AttemptRow, scale: Scale, now: datetime) -> Bar:
    outcome = outcome_of(a)
    end = a.finished_at or now
    x, width = scale.span(a.started_at, end)
    lines = [
        _("%(step)s, attempt %(n)d") % {"step": row.name, "n": a.attempt},
        _("started %(at)s") % {"at": format_time(a.started_at)},
        _("duration %(d)s%(so_far)s")
        % {
            "d": _duration(a.started_at, end),
            "so_far": _(" so far") if a.finished_at is None else "",
        },
        _("outcome: %(outcome)s") % {"outcome": outcome.value},
    ]
    if a.error_type:
        lines.append(_("error: %(type)s") % {"type": a.error_type})
    if a.worker:
        lines.append(_("worker: %(worker)s") % {"worker": a.worker})
    return Bar(x, width, outcome, a.attempt, "\n".join(lines))


def _gap(kind: MarkKind, begin: datetime, end: datetime, scale: Scale, title: str) -> Mark:
    x, width = scale.span(begin, end)
    return Mark(kind, x, width, title)


def _attempt_marks(row: StepRow, scale: Scale, now: datetime) -> tuple[list[Bar], list[Mark]]:
    """A queued or inline step's attempts, its queue wait and its retries' backoffs."""
    attempts = list(row.attempts)
    marks: list[Mark] = []
    if not attempts and not _is_open(row):
        # Settled with no attempt recorded: its span, with the step's outcome.
        outcome = AttemptStatus.FAILED if row.status == StepStatus.FAILED else row.status
        attempts = [AttemptRow(1, outcome, row.created_at, row.updated_at, row.error_type)]
    if not attempts:
        # Never claimed yet: waiting in its queue since it was stored.
        marks.append(
            _gap(
                MarkKind.QUEUED,
                row.created_at,
                now,
                scale,
                _("%(step)s: waiting in its queue since %(at)s")
                % {"step": row.name, "at": format_time(row.created_at)},
            )
        )
        if row.available_at is not None and row.available_at > now:
            marks.append(_due(row.available_at, scale, _("due at %(at)s")))
        return [], marks
    first = attempts[0]
    if first.started_at > row.created_at:
        marks.append(
            _gap(
                MarkKind.QUEUED,
                row.created_at,
                first.started_at,
                scale,
                _("%(step)s: in its queue for %(d)s before attempt %(n)d")
                % {
                    "step": row.name,
                    "d": _duration(row.created_at, first.started_at),
                    "n": first.attempt,
                },
            )
        )
    hidden = attempts[:-ATTEMPTS_SHOWN]
    shown = attempts[-ATTEMPTS_SHOWN:]
    if hidden:
        last_hidden = hidden[-1]
        marks.append(
            _gap(
                MarkKind.EARLIER,
                hidden[0].started_at,
                last_hidden.finished_at or shown[0].started_at,
                scale,
                _("%(n)d earlier attempts, not drawn: %(outcomes)s")
                % {"n": len(hidden), "outcomes": _counted(outcome_of(a).value for a in hidden)},
            )
        )
    for before, after in itertools.pairwise(attempts):
        if after not in shown or before.finished_at is None:
            continue
        marks.append(
            _gap(
                MarkKind.BACKOFF,
                before.finished_at,
                after.started_at,
                scale,
                _(
                    "retry backoff: attempt %(a)d ended %(end)s, "
                    "attempt %(b)d started %(start)s (%(d)s)"
                )
                % {
                    "a": before.attempt,
                    "end": format_time(before.finished_at),
                    "b": after.attempt,
                    "start": format_time(after.started_at),
                    "d": _duration(before.finished_at, after.started_at),
                },
            )
        )
    last = attempts[-1]
    if (
        row.status == StepStatus.FAILED
        and row.available_at is not None
        and last.finished_at is not None
    ):
        # A retry is due: the backoff runs from the failed attempt's end to when it is.
        marks.append(
            _gap(
                MarkKind.BACKOFF,
                last.finished_at,
                row.available_at,
                scale,
                _(
                    "retry backoff: attempt %(a)d ended %(end)s, "
                    "attempt %(b)d due at %(due)s (%(d)s)"
                )
                % {
                    "a": last.attempt,
                    "end": format_time(last.finished_at),
                    "b": last.attempt + 1,
                    "due": format_time(row.available_at),
                    "d": _duration(last.finished_at, row.available_at),
                },
            )
        )
    return _apart([_bar(row, a, scale, now) for a in shown]), marks


def _apart(bars: list[Bar]) -> list[Bar]:
    """Bars moved right just enough not to hide each other: on a long axis a quick retry
    would otherwise be drawn under the attempt after it."""
    out: list[Bar] = []
    for bar in bars:
        if out and bar.x < out[-1].x + out[-1].width + 1:
            x = min(round(out[-1].x + out[-1].width + 1, 1), PLOT_RIGHT - bar.width)
            bar = dataclasses.replace(bar, x=x)
        out.append(bar)
    return out


def _due(at: datetime, scale: Scale, text: str) -> Mark:
    return Mark(MarkKind.DUE, scale.x(at), 0.0, text % {"at": format_time(at)})


_WAIT_OF = {
    StepKind.SLEEP: MarkKind.SLEEP,
    StepKind.EVENT: MarkKind.EVENT,
    StepKind.SUSPEND: MarkKind.APPROVAL,
    StepKind.CHILD: MarkKind.CHILD,
    StepKind.PARALLEL: MarkKind.GROUP,
}


#: The waits whose ``available_at`` is when they end by themselves.
_TIMED = frozenset({MarkKind.SLEEP, MarkKind.EVENT, MarkKind.APPROVAL})


def _wait_marks(row: StepRow, kind: MarkKind, scale: Scale, now: datetime) -> list[Mark]:
    """A sleep, an event wait, an approval, a child run or a group: its span, and
    (while it still waits) when it is due."""
    end = _step_end(row, now)
    x, width = scale.span(row.created_at, end)
    words = {
        MarkKind.SLEEP: _("sleep"),
        MarkKind.EVENT: _("event"),
        MarkKind.APPROVAL: _("approval"),
        MarkKind.CHILD: _("child run"),
        MarkKind.GROUP: _("parallel group"),
    }
    lines = [
        f"{row.name}: {words[kind]}",
        _("from %(at)s") % {"at": format_time(row.created_at)},
        (_("waiting for %(d)s so far") if _is_open(row) else _("took %(d)s"))
        % {"d": _duration(row.created_at, end)},
        _("status: %(status)s") % {"status": row.status},
    ]
    if row.child_label:
        lines.append(
            _("child run %(run)s (%(status)s)")
            % {"run": row.child_label, "status": row.child_status}
        )
    if row.error_type:
        lines.append(_("error: %(type)s") % {"type": row.error_type})
    marks = [Mark(kind, x, width, "\n".join(lines), label=words[kind], href=row.child_url)]
    if _is_open(row) and row.available_at is not None and kind in _TIMED:
        text = _("wakes at %(at)s") if kind == MarkKind.SLEEP else _("times out at %(at)s")
        marks.append(_due(row.available_at, scale, text))
    return marks


def _lane(row: StepRow, y: float, scale: Scale, now: datetime, branch: bool) -> Lane:
    kind = _WAIT_OF.get(StepKind(row.kind)) if row.kind in StepKind.values else None
    bars: list[Bar] = []
    marks: list[Mark]
    if kind is not None:
        marks = _wait_marks(row, kind, scale, now)
    elif row.kind in (StepKind.PUBLISH, StepKind.PATCH):
        marks = [
            Mark(
                MarkKind.INSTANT,
                scale.x(row.created_at),
                0.0,
                f"{row.name}: {row.kind}, {format_time(row.created_at)}",
            )
        ]
    else:
        bars, marks = _attempt_marks(row, scale, now)
    tries = len(row.attempts)
    label = row.name if len(row.name) <= LABEL_CHARS else row.name[: LABEL_CHARS - 1] + "…"
    if tries > 1:
        label = f"{label} \u00d7{tries}"  # the multiplication sign
    title = _("%(step)s (%(kind)s): %(status)s, %(n)d attempts") % {
        "step": row.name,
        "kind": row.kind,
        "status": row.status,
        "n": tries,
    }
    return Lane(y, row.id, row.name, label, title, row.status, row.kind, branch, bars, marks)


def _counted(values: Iterable[str]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(Counter(values).items()))


def _summary(rows: Sequence[StepRow], y: float, scale: Scale, now: datetime) -> Lane:
    """One lane standing for ``rows``, not drawn: their span and counts by status."""
    begin = min(r.created_at for r in rows)
    end = max(max(_times(r, now)) for r in rows)
    text = _("%(n)d steps not drawn (%(first)s … %(last)s): %(statuses)s") % {
        "n": len(rows),
        "first": rows[0].name,
        "last": rows[-1].name,
        "statuses": _counted(r.status for r in rows),
    }
    x, width = scale.span(begin, end)
    label = _("… %(n)d more steps") % {"n": len(rows)}
    mark = Mark(MarkKind.EARLIER, x, width, text)
    return Lane(y, None, label, label, text, "", "", False, [], [mark], summary=True)


def layout(rows: Sequence[StepRow], now: datetime, start: datetime | None = None) -> Chart | None:
    """The chart of a run's steps as of ``now``; None when it has none.

    ``start``: where the axis begins (the run's start), if before its first step."""
    if not rows:
        return None
    ordered = in_order(rows)
    first = min(min(_times(r, now)) for r in ordered)
    begin = min(first, start) if start is not None else first
    end = max(max(max(_times(r, now)) for r in ordered), begin)
    scale = Scale(begin, end)
    hidden: list[StepRow] = []
    if len(ordered) > LANES_SHOWN:
        head, tail = LANES_SHOWN // 2, LANES_SHOWN - LANES_SHOWN // 2
        hidden = ordered[head : len(ordered) - tail]
        ordered = [*ordered[:head], *ordered[len(ordered) - tail :]]
    ids = {r.id for r in rows}
    lanes: list[Lane] = []
    for row in ordered:
        if hidden and len(lanes) == LANES_SHOWN // 2:
            lanes.append(_summary(hidden, len(lanes) * LANE_HEIGHT, scale, now))
        branch = row.group_id is not None and row.group_id in ids
        lanes.append(_lane(row, len(lanes) * LANE_HEIGHT, scale, now, branch))
    return Chart(lanes, scale.ticks(), begin, end, len(rows), len(hidden))


__all__ = [
    "AttemptRow",
    "Chart",
    "Outcome",
    "StepRow",
    "layout",
    "nice_step_ms",
    "offset_label",
    "step_rows",
]
