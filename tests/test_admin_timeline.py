"""The run page's timeline: its geometry (a pure function of a run's step and attempt
rows), and the SVG the run page and its live parts draw from it, escaped and read in a
bounded number of queries however many steps the run has."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pikku_django.admin.run_page import load_steps, timeline_chart
from pikku_django.admin.timeline import (
    AttemptRow,
    Chart,
    Outcome,
    StepRow,
    layout,
    nice_step_ms,
    offset_label,
)
from pikku_django.admin.timeline_shapes import (
    ATTEMPTS_SHOWN,
    LANES_SHOWN,
    PLOT_LEFT,
    PLOT_RIGHT,
    Lane,
    MarkKind,
)
from pikku_django.models import (
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, on_databases
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory


def at(seconds: float) -> datetime:
    return datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.get_fixed_timezone(0)) + timedelta(
        seconds=seconds
    )


def step(
    id: int,
    name: str = "",
    kind: str = StepKind.QUEUED,
    status: str = StepStatus.SUCCEEDED,
    created: float = 0,
    updated: float = 1,
    **fields: Any,
) -> StepRow:
    return StepRow(
        id=id,
        name=name or f"s{id}",
        kind=kind,
        status=status,
        created_at=at(created),
        updated_at=at(updated),
        **fields,
    )


def attempt(n: int, status: str, start: float, end: float | None, error: str = "") -> AttemptRow:
    return AttemptRow(n, status, at(start), None if end is None else at(end), error)


def lane_of(chart: Chart | None, step_id: int) -> Lane:
    assert chart is not None
    return next(lane for lane in chart.lanes if lane.step_id == step_id)


# -- the geometry ----------------------------------------------------------------------


def test_retries_are_bars_with_their_outcomes_and_backoff_gaps_between_them() -> None:
    row = step(
        1,
        "charge",
        updated=10,
        attempts=(
            attempt(1, "failed", 1, 2, "TimeoutError"),
            attempt(2, "failed", 4, 5, "TimeoutError"),
            attempt(3, "succeeded", 8, 10),
        ),
    )
    lane = lane_of(layout([row], now=at(10)), 1)
    assert [b.outcome for b in lane.bars] == [Outcome.FAILED, Outcome.FAILED, Outcome.SUCCEEDED]
    assert [b.attempt for b in lane.bars] == [1, 2, 3]
    xs = [b.x for b in lane.bars]
    assert xs == sorted(xs)
    assert xs[0] > PLOT_LEFT
    backoffs = [m for m in lane.marks if m.kind == MarkKind.BACKOFF]
    assert len(backoffs) == 2
    for gap, before, after in zip(backoffs, lane.bars[:-1], lane.bars[1:], strict=True):
        # From the attempt's end to the next one's start.
        assert gap.x == pytest.approx(before.x + before.width, abs=0.2)
        assert gap.end == pytest.approx(after.x, abs=0.2)
    assert "TimeoutError" in lane.bars[0].title
    assert "attempt 1" in lane.bars[0].title
    assert "outcome: failed" in lane.bars[0].title
    assert [m.kind for m in lane.marks if m.kind == MarkKind.QUEUED] == [MarkKind.QUEUED]
    assert "\u00d73" in lane.label  # three tries, on the lane's label


def test_quick_retries_on_a_long_axis_stay_apart() -> None:
    row = step(
        1,
        updated=3600,
        attempts=(attempt(1, "failed", 0, 0.1), attempt(2, "succeeded", 0.2, 0.3)),
    )
    later = step(2, created=3600, updated=3600)
    failed, succeeded = lane_of(layout([row, later], now=at(3600)), 1).bars
    assert failed.width > 0
    assert succeeded.x >= failed.x + failed.width  # the failure is not drawn under it


def test_a_retry_still_due_shows_its_backoff_up_to_when_it_is_due() -> None:
    row = step(
        1,
        status=StepStatus.FAILED,
        updated=2,
        available_at=at(30),
        attempts=(attempt(1, "failed", 0, 2, "ValueError"),),
    )
    chart = layout([row], now=at(5))
    assert chart is not None
    assert chart.end == at(30)
    (gap,) = [m for m in lane_of(chart, 1).marks if m.kind == MarkKind.BACKOFF]
    assert gap.end == PLOT_RIGHT
    assert "attempt 2 due at" in gap.title


def test_a_superseded_attempt_and_a_running_one() -> None:
    row = step(
        1,
        status=StepStatus.RUNNING,
        updated=6,
        attempts=(attempt(1, "superseded", 0, 6), attempt(2, "running", 6, None)),
    )
    lane = lane_of(layout([row], now=at(20)), 1)
    superseded, running = lane.bars
    assert (superseded.outcome, running.outcome) == (Outcome.SUPERSEDED, Outcome.RUNNING)
    assert running.x + running.width == pytest.approx(PLOT_RIGHT)  # up to now
    assert "so far" in running.title
    assert "outcome: running" in running.title


def test_a_parallel_groups_branches_have_lanes_below_it() -> None:
    rows = [
        step(1, "before", updated=1, attempts=(attempt(1, "succeeded", 0, 1),)),
        step(2, "fan", StepKind.PARALLEL, StepStatus.RUNNING, created=1, updated=1),
        step(3, "a", group_id=2, created=1, updated=3, attempts=(attempt(1, "succeeded", 1, 3),)),
        step(
            4,
            "b",
            group_id=2,
            created=1,
            status="running",
            attempts=(attempt(1, "running", 1, None),),
        ),
        step(5, "after", created=9, updated=9),
    ]
    chart = layout(list(reversed(rows)), now=at(10))
    assert chart is not None
    assert [lane.step_id for lane in chart.lanes] == [1, 2, 3, 4, 5]
    assert [lane.branch for lane in chart.lanes] == [False, False, True, True, False]
    (group,) = lane_of(chart, 2).marks
    assert group.kind == MarkKind.GROUP
    assert group.end == PLOT_RIGHT
    # The branches ran side by side: their bars overlap in time.
    a, b = lane_of(chart, 3).bars[0], lane_of(chart, 4).bars[0]
    assert a.x == b.x
    assert b.outcome == Outcome.RUNNING


def test_a_sleep_is_a_mark_up_to_now_with_its_wake_time_ahead() -> None:
    row = step(1, "nap", StepKind.SLEEP, StepStatus.SCHEDULED, updated=0, available_at=at(60))
    chart = layout([row], now=at(15))
    assert chart is not None
    assert chart.end == at(60)
    sleep, due = lane_of(chart, 1).marks
    assert sleep.kind == MarkKind.SLEEP
    assert sleep.label == "sleep"
    assert sleep.end == pytest.approx(PLOT_LEFT + (PLOT_RIGHT - PLOT_LEFT) / 4, abs=0.2)
    assert due.kind == MarkKind.DUE
    assert due.x == PLOT_RIGHT
    assert "wakes at" in due.title
    assert lane_of(chart, 1).bars == []


def test_event_waits_approvals_and_child_runs_are_marks_of_their_own() -> None:
    rows = [
        step(1, "paid", StepKind.EVENT, created=0, updated=4),
        step(2, "ok?", StepKind.SUSPEND, StepStatus.SUSPENDED, created=4, updated=4),
        step(
            3,
            "kid",
            StepKind.CHILD,
            created=5,
            updated=8,
            child_url="/admin/runs/abc/change/",
            child_label="child-workflow abc",
            child_status="completed",
        ),
        step(4, "note", StepKind.PUBLISH, created=8, updated=8),
    ]
    chart = layout(rows, now=at(10))
    kinds = [[m.kind for m in lane.marks] for lane in chart.lanes] if chart else []
    assert kinds == [[MarkKind.EVENT], [MarkKind.APPROVAL], [MarkKind.CHILD], [MarkKind.INSTANT]]
    child = lane_of(chart, 3).marks[0]
    assert child.href == "/admin/runs/abc/change/"
    assert "child-workflow abc (completed)" in child.title
    assert lane_of(chart, 2).marks[0].end == PLOT_RIGHT  # still waiting for its approval


def test_a_lane_draws_its_last_attempts_and_summarizes_the_earlier_ones() -> None:
    tries = tuple(attempt(n, "failed", n * 2, n * 2 + 1) for n in range(1, ATTEMPTS_SHOWN + 11))
    lane = lane_of(layout([step(1, updated=100, attempts=tries)], now=at(100)), 1)
    assert [b.attempt for b in lane.bars] == list(range(11, ATTEMPTS_SHOWN + 11))
    (earlier,) = [m for m in lane.marks if m.kind == MarkKind.EARLIER]
    assert "10 earlier attempts" in earlier.title
    # Each drawn attempt's backoff, the first one's from the last attempt not drawn.
    assert len([m for m in lane.marks if m.kind == MarkKind.BACKOFF]) == ATTEMPTS_SHOWN


def test_the_axis_has_readable_ticks_within_the_plot() -> None:
    assert nice_step_ms(60_000) == 10_000
    assert nice_step_ms(450) == 100
    assert [offset_label(ms) for ms in (0, 250, 1_500, 150_000, 90_000_000)] == [
        "0",
        "250 ms",
        "1.5 s",
        "2 min 30 s",
        "1 d 1 h",
    ]
    chart = layout([step(1, created=0, updated=75)], now=at(75))
    assert chart is not None
    assert [t.label for t in chart.ticks][:3] == ["0", "10 s", "20 s"]
    assert all(PLOT_LEFT <= t.x <= PLOT_RIGHT for t in chart.ticks)
    assert 5 <= len(chart.ticks) <= 12


def test_a_thousand_steps_draw_a_bounded_number_of_lanes() -> None:
    rows = [
        step(
            n,
            f"step-{n}",
            created=n,
            updated=n + 0.5,
            attempts=(attempt(1, "succeeded", n, n + 0.5),),
        )
        for n in range(1, 1001)
    ]
    chart = layout(rows, now=at(1001))
    assert chart is not None
    assert len(chart.lanes) == LANES_SHOWN + 1
    assert chart.hidden == 1000 - LANES_SHOWN
    summary = chart.lanes[LANES_SHOWN // 2]
    assert summary.summary
    assert summary.step_id is None
    assert f"{1000 - LANES_SHOWN} steps not drawn" in summary.title
    assert chart.lanes[0].step_id == 1
    assert chart.lanes[-1].step_id == 1000
    assert layout([], now=at(0)) is None


# -- the run page ----------------------------------------------------------------------


def _stamp(alias: str, run: WorkflowRun, times: dict[int, tuple[datetime, datetime]]) -> None:
    """Give steps (by id) their created and updated times, in one statement a batch."""
    steps = list(WorkflowStep.objects.using(alias).filter(run=run, id__in=list(times)))
    for s in steps:
        s.created_at, s.updated_at = times[s.pk]
    WorkflowStep.objects.using(alias).bulk_update(
        steps, ["created_at", "updated_at"], batch_size=500
    )


def big_run(alias: str = "default", steps: int = 1000) -> WorkflowRun:
    """A completed run of ``steps`` queued steps, a second each; every tenth retried once."""
    run = WorkflowRunFactory(database=alias, workflow="big", status=RunStatus.COMPLETED)
    base = timezone.now() - timedelta(seconds=steps + 10)
    WorkflowStep.objects.using(alias).bulk_create(
        WorkflowStep(
            run=run, name=f"step-{n:04d}", kind=StepKind.QUEUED, status="succeeded", attempt=1
        )
        for n in range(steps)
    )
    made = list(WorkflowStep.objects.using(alias).filter(run=run).order_by("id"))
    _stamp(
        alias,
        run,
        {
            s.pk: (base + timedelta(seconds=n), base + timedelta(seconds=n + 0.9))
            for n, s in enumerate(made)
        },
    )
    attempts = []
    for n, s in enumerate(made):
        start = base + timedelta(seconds=n + 0.1)
        if n % 10 == 0:
            attempts.append(
                StepAttempt(
                    step=s,
                    attempt=1,
                    status="failed",
                    started_at=start,
                    finished_at=start + timedelta(seconds=0.2),
                    error={"type": "TimeoutError", "message": "slow"},
                )
            )
            start += timedelta(seconds=0.5)
        attempts.append(
            StepAttempt(
                step=s,
                attempt=2 if n % 10 == 0 else 1,
                status="succeeded",
                started_at=start,
                finished_at=start + timedelta(seconds=0.3),
            )
        )
    starts = [a.started_at for a in attempts]
    StepAttempt.objects.using(alias).bulk_create(attempts, batch_size=500)
    # started_at is set on insert: give the attempts their own start times back.
    for a, start in zip(attempts, starts, strict=True):
        a.started_at = start
    StepAttempt.objects.using(alias).bulk_update(attempts, ["started_at"], batch_size=500)
    return run


def run_page(run: WorkflowRun) -> str:
    return reverse("admin:pikku_django_workflowrun_change", args=[run.pk])


def first_table(sql: str) -> str:
    """The table a statement reads first (its own, not a subquery's)."""
    found = re.search(r"\bFROM\s+[\"`]?(\w+)", sql)
    return found.group(1) if found else ""


def svg_of(page: str) -> str:
    found = re.search(r'<fieldset class="module pikku-tl-module".*?</fieldset>', page, re.S)
    assert found, "the page has no timeline"
    return found.group(0)


@pytest.fixture(autouse=True)
def _fresh_engine() -> Any:
    reset_engine()
    yield
    reset_engine()


@pytest.mark.django_db
def test_the_run_page_draws_the_timeline_with_names_and_errors_escaped(
    admin_client: Client,
) -> None:
    run = WorkflowRunFactory(workflow="esc", status=RunStatus.RUNNING)
    child = WorkflowRunFactory(workflow="kid", status=RunStatus.RUNNING)
    evil = "<script>alert('step')</script>"
    bad = WorkflowStepFactory(run=run, name=evil, status=StepStatus.FAILED, attempt=1)
    StepAttemptFactory(
        step=bad,
        attempt=1,
        status="failed",
        finished_at=timezone.now(),
        error={"type": "<img src=x onerror=alert(1)>", "message": "no"},
    )
    WorkflowStepFactory(run=run, name="kid", kind=StepKind.CHILD, child_run=child, status="running")
    page = admin_client.get(run_page(run)).content.decode()
    svg = svg_of(page)
    assert "<svg" in svg
    assert 'id="pikku-tl-lanes"' in svg
    assert evil not in page
    assert "<img src=x" not in page
    assert "&lt;script&gt;alert(&#x27;step&#x27;)&lt;/script&gt;" in svg
    assert "&lt;img src=x onerror=alert(1)&gt;" in svg  # the error type, in the bar's title
    assert f'<a href="{run_page(child)}" class="pikku-tl-link">' in svg
    assert 'data-outcome="failed"' in svg
    # The live parts carry the same timeline, to be swapped in as the run goes on.
    live = admin_client.get(reverse("admin:pikku_django_workflowrun_live", args=[run.pk]))
    assert 'id="pikku-run-timeline"' in live.content.decode()
    assert evil not in live.content.decode()


@pytest.mark.django_db
def test_a_run_without_steps_has_no_timeline_drawn(admin_client: Client) -> None:
    run = WorkflowRunFactory(workflow="empty")
    page = admin_client.get(run_page(run)).content.decode()
    assert '<fieldset class="module pikku-tl-module" id="pikku-run-timeline" hidden>' in page
    assert '<svg class="pikku-tl"' not in page


@on_databases("sqlite", "postgres", "mariadb")
def test_a_thousand_step_run_page_reads_each_table_once_and_stays_bounded(
    vendor: str, admin_user: Any, settings: Any
) -> None:
    alias = database_alias(vendor)
    settings.PIKKU = {"WORKFLOW_DATABASE": alias}
    reset_engine()
    small, big = big_run(alias, steps=5), big_run(alias, steps=1000)
    with CaptureQueriesContext(connections[alias]) as queries:
        chart = timeline_chart(big, load_steps(big, alias))
    # One query for the steps (their child runs joined), one for their attempts.
    assert len(queries.captured_queries) == 2, [q["sql"] for q in queries.captured_queries]
    assert chart is not None
    assert chart.steps == 1000
    assert len(chart.lanes) == LANES_SHOWN + 1
    client = Client()
    client.force_login(admin_user)
    counts, sizes = [], []
    for run in (small, big):
        with CaptureQueriesContext(connections[alias]) as queries:
            page = client.get(run_page(run)).content.decode()
        sql = [q["sql"] for q in queries.captured_queries]
        reads = [q for q in sql if first_table(q) == "pikku_step_attempt"]
        assert len(reads) == 1, reads  # the attempts, once
        counts.append([t for t in map(first_table, sql) if t.startswith("pikku_")])
        sizes.append(len(svg_of(page)))
    assert counts[0] == counts[1]  # the same statements: no query per step
    assert sizes[1] < 400_000  # bounded: LANES_SHOWN lanes and a summary, not 1,000
    assert svg_of(page).count('class="pikku-tl-lane') == LANES_SHOWN + 1
