"""The run page's timeline in headless Chromium: a 1,000-step run and a parallel group,
in the light and dark themes, with screenshots under the test's ``tmp_path``.

Uses the browser of tests/test_browser.py (same requirements; skipped without them,
failed under ``CI=true``).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from pikku_django.admin.timeline_shapes import LANES_SHOWN
from pikku_django.models import (
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory
from tests.test_admin_timeline import big_run
from tests.test_browser_operator import (  # noqa: F401 - the fixtures
    AA,
    _chromium,
    _fresh_engine,
    _static,
    contrast,
    open_page,
    set_theme,
    shot,
    superuser_browser,
)

try:
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the driver fixture skips
    By = None

#: What the timeline draws, as the browser paints it.
READ_TIMELINE = """
var box = document.querySelector('#pikku-run-timeline .pikku-tl-scroll');
var svg = document.getElementById('pikku-tl-lanes');
var label = svg.querySelector('.pikku-tl-label');
var tick = document.querySelector('.pikku-tl-tick-label');
var bg = getComputedStyle(document.body).backgroundColor;
var bars = Array.from(svg.querySelectorAll('.pikku-tl-bar')).slice(0, 50).map(function (el) {
  return {outcome: el.getAttribute('data-outcome'), stroke: getComputedStyle(el).stroke,
          fill: getComputedStyle(el).fill};
});
return {lanes: svg.querySelectorAll('.pikku-tl-lane').length,
        scrolls: box.scrollHeight > box.clientHeight,
        boxHeight: box.clientHeight, windowHeight: window.innerHeight,
        pageWide: document.documentElement.scrollWidth > document.documentElement.clientWidth,
        svgWidth: svg.getBoundingClientRect().width,
        label: getComputedStyle(label).fill, tick: getComputedStyle(tick).fill,
        background: bg, bars: bars};
"""


@pytest.fixture
def browser(request: Any, live_server: Any) -> Any:
    """Chromium, logged in to the live server's admin as a superuser (``live_server``
    named here, so that pytest-django lets the test's requests through)."""
    return request.getfixturevalue("superuser_browser")


def scroll_to_timeline(browser: Any) -> None:
    assert browser.find_elements(By.ID, "pikku-run-timeline"), browser.page_source[:3000]
    browser.execute_script("document.getElementById('pikku-run-timeline').scrollIntoView()")


def group_run() -> WorkflowRun:
    """A run with a parallel group of four branches (a retried one, a running one, a
    superseded one and a child run), then a sleep and an event wait still open."""
    now = timezone.now()
    run = WorkflowRunFactory(workflow="fan-out <b>", status=RunStatus.RUNNING)
    child = WorkflowRunFactory(workflow="fan-out child", status=RunStatus.COMPLETED)
    first = WorkflowStepFactory(run=run, name="load", status=StepStatus.SUCCEEDED, attempt=1)
    group = WorkflowStepFactory(run=run, name="fan", kind=StepKind.PARALLEL, status="running")
    retried = WorkflowStepFactory(run=run, name="fan/charge", group=group, status="succeeded")
    running = WorkflowStepFactory(run=run, name="fan/ship", group=group, status="running")
    lost = WorkflowStepFactory(run=run, name="fan/mail", group=group, status="running")
    kid = WorkflowStepFactory(
        run=run,
        name="fan/audit",
        group=group,
        kind=StepKind.CHILD,
        child_run=child,
        status=StepStatus.SUCCEEDED,
    )
    nap = WorkflowStepFactory(
        run=run,
        name="cool-down",
        kind=StepKind.SLEEP,
        status="scheduled",
        available_at=now + timedelta(seconds=40),
    )
    times = {
        first: (0, 4),
        group: (4, 60),
        retried: (4, 30),
        running: (4, 60),
        lost: (4, 60),
        kid: (5, 25),
        nap: (35, 35),
    }
    base = now - timedelta(seconds=60)
    for s, (made, changed) in times.items():
        WorkflowStep.objects.filter(pk=s.pk).update(
            created_at=base + timedelta(seconds=made), updated_at=base + timedelta(seconds=changed)
        )

    def tried(s: WorkflowStep, n: int, status: str, begin: float, end: float | None) -> None:
        made = StepAttemptFactory(step=s, attempt=n, status=status, error=None)
        StepAttempt.objects.filter(pk=made.pk).update(
            started_at=base + timedelta(seconds=begin),
            finished_at=None if end is None else base + timedelta(seconds=end),
            error={"type": "TimeoutError", "message": "slow"} if status == "failed" else None,
        )

    tried(first, 1, "succeeded", 1, 4)
    tried(retried, 1, "failed", 5, 9)
    tried(retried, 2, "failed", 12, 16)
    tried(retried, 3, "succeeded", 22, 30)
    tried(running, 1, "running", 6, None)
    tried(lost, 1, "superseded", 5, 20)
    tried(lost, 2, "running", 20, None)
    return run


@pytest.mark.django_db(transaction=True)
def test_the_timeline_of_a_thousand_steps_and_of_a_parallel_group_in_both_themes(
    browser: Any, tmp_path: Path
) -> None:
    big, fan = big_run("default", steps=1000), group_run()
    browser.set_window_size(1400, 1000)
    try:
        for theme in ("light", "dark"):
            for name, run in (("thousand", big), ("group", fan)):
                open_page(browser, reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
                set_theme(browser, theme)
                scroll_to_timeline(browser)
                seen = browser.execute_script(READ_TIMELINE)
                shot(browser, tmp_path, f"timeline-{theme}-{name}")
                assert not seen["pageWide"], f"{theme} {name}: the page scrolls sideways"
                assert seen["svgWidth"] >= 760
                # Text at AA against the page; bars' edges at 3:1 (non-text contrast).
                assert contrast(seen["label"], seen["background"]) >= AA, seen
                assert contrast(seen["tick"], seen["background"]) >= AA, seen
                for bar in seen["bars"]:
                    assert contrast(bar["stroke"], seen["background"]) >= 3, (theme, bar)
                if name == "thousand":
                    assert seen["lanes"] == LANES_SHOWN + 1
                    # A fixed lane height; the box scrolls, the page stays in the window.
                    assert seen["scrolls"]
                    assert seen["boxHeight"] < seen["windowHeight"]
                    browser.execute_script(
                        "var box = document.querySelector('.pikku-tl-scroll');"
                        "box.scrollTop = box.scrollHeight / 2 - box.clientHeight / 2;"
                    )
                    shot(browser, tmp_path, f"timeline-{theme}-thousand-middle")
                else:
                    assert seen["lanes"] == 7
                    outcomes = {bar["outcome"] for bar in seen["bars"]}
                    assert outcomes == {"succeeded", "failed", "running", "superseded"}
                    # Each outcome is painted differently, without counting on its hue.
                    fills = {bar["outcome"]: bar["fill"] for bar in seen["bars"]}
                    assert len(set(fills.values())) == 4, fills
    finally:
        browser.set_window_size(1280, 1024)
