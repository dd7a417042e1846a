"""The operator's admin in headless Chromium: badge contrast in both themes, steering a
run through its confirmation pages, a view-only user, and the dashboard's refresh.

Uses the browser of tests/test_browser.py (same requirements; skipped without
them, failed under ``CI=true``). Screenshots go under the test's ``tmp_path``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from pikku_django.admin.formatting import BADGE_STATUSES
from pikku_django.models import RunStatus, StepKind, StepStatus, WorkflowRun
from pikku_django.workflows.api import reset_engine
from tests.factories import StepAttemptFactory, WorkflowRunFactory, WorkflowStepFactory

# The browser (fixture "_chromium") and the static files of tests/test_browser.py,
# and its waiting helper.
from tests.test_browser import _live_server_static as _static  # noqa: F401
from tests.test_browser import driver as _chromium  # noqa: F401
from tests.test_browser import wait_for

try:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover - the driver fixture skips
    By = WebDriverWait = None

AA = 4.5
RUNS = "admin:pikku_django_workflowrun_changelist"

#: Reads each badge's computed text and background colours, as the browser paints them.
READ_BADGES = """
return Array.from(document.querySelectorAll('.pikku-badge')).map(function (el) {
  var style = window.getComputedStyle(el);
  return {status: el.getAttribute('data-status') || el.className, text: el.textContent,
          color: style.color, background: style.backgroundColor};
});
"""


@pytest.fixture(autouse=True)
def _fresh_engine() -> Any:
    reset_engine()
    yield
    reset_engine()


def log_in(driver: Any, live_server: Any, user: Any) -> Any:
    client = Client()
    client.force_login(user)
    from django.conf import settings

    driver.get(live_server.url + "/admin/login/")
    driver.delete_all_cookies()
    cookie = settings.SESSION_COOKIE_NAME
    driver.add_cookie({"name": cookie, "value": client.cookies[cookie].value, "path": "/"})
    driver.live_server_url = live_server.url
    return driver


@pytest.fixture
def superuser_browser(request: Any, live_server: Any, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_superuser("operator", "o@example.com", "pw")
    return log_in(request.getfixturevalue("_chromium"), live_server, user)


@pytest.fixture
def viewer_browser(request: Any, live_server: Any, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    return log_in(request.getfixturevalue("_chromium"), live_server, user)


def open_page(browser: Any, url: str) -> None:
    browser.get(browser.live_server_url + url)
    assert "/login/" not in browser.current_url, "the session cookie did not log the browser in"


def shot(browser: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 0
    return path


def rgb(css: str) -> tuple[float, ...]:
    found = re.findall(r"[\d.]+", css)
    assert len(found) >= 3, css
    if len(found) == 4:
        assert float(found[3]) == 1.0, f"a see-through colour ({css}) has no fixed contrast"
    return tuple(float(x) for x in found[:3])


def luminance(colour: tuple[float, ...]) -> float:
    def channel(c: float) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in colour)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(rgb(a)), luminance(rgb(b))), reverse=True)
    return (high + 0.05) / (low + 0.05)


def set_theme(browser: Any, theme: str) -> None:
    browser.execute_script(
        "localStorage.setItem('theme', arguments[0]);"
        "document.documentElement.dataset.theme = arguments[0];",
        theme,
    )


def every_status_on_one_page() -> WorkflowRun:
    """A run whose steps and attempts show every step status, with runs of every status."""
    run = WorkflowRunFactory(workflow="op-badges", status=RunStatus.RUNNING)
    for i, status in enumerate(StepStatus.values):
        step = WorkflowStepFactory(run=run, name=f"s-{status}", status=status, attempt=1)
        StepAttemptFactory(step=step, attempt=1, status=status)
        if i == 0:
            child = WorkflowRunFactory(workflow="op-child", status=RunStatus.SUSPENDED)
            WorkflowStepFactory(run=run, name="kid", kind=StepKind.CHILD, child_run=child)
    for status in RunStatus.values:
        WorkflowRunFactory(workflow=f"op-{status}", status=status)
    return run


@pytest.mark.django_db(transaction=True)
def test_every_status_badge_passes_aa_in_the_light_and_dark_themes(
    superuser_browser: Any, tmp_path: Path
) -> None:
    browser = superuser_browser
    run = every_status_on_one_page()
    pages = {
        "runs": reverse(RUNS),
        "run": reverse("admin:pikku_django_workflowrun_change", args=[run.pk]),
        "steps": reverse("admin:pikku_django_workflowstep_changelist"),
        "dashboard": reverse("admin:pikku_django_workflowrun_dashboard"),
    }
    seen: set[str] = set()
    for theme in ("light", "dark"):
        for name, url in pages.items():
            open_page(browser, url)
            set_theme(browser, theme)
            badges = browser.execute_script(READ_BADGES)
            assert badges, f"no badges on the {name} page"
            for badge in badges:
                ratio = contrast(badge["color"], badge["background"])
                assert ratio >= AA, f"{theme} {name}: {badge} has contrast {ratio:.2f}"
                assert badge["text"].strip(), badge
                seen.add(badge["status"])
            shot(browser, tmp_path, f"badges-{theme}-{name}")
            if name == "run":
                browser.execute_script("document.getElementById('pikku-timeline').scrollIntoView()")
                shot(browser, tmp_path, f"badges-{theme}-run-timeline")
        # The themes differ: the page background follows the theme.
        body = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert (luminance(rgb(body)) > 0.5) == (theme == "light"), body
    assert set(BADGE_STATUSES) <= seen, f"never drawn: {set(BADGE_STATUSES) - seen}"


#: The page's width and the runs table's, each as laid out and as seen.
READ_WIDTHS = """
var page = document.documentElement;
var results = document.querySelector('#changelist-form .results');
return [window.innerWidth, page.scrollWidth, page.clientWidth,
        results.scrollWidth, results.clientWidth];
"""


@pytest.mark.django_db(transaction=True)
def test_the_runs_list_fits_a_1400_pixel_window_in_both_themes(
    superuser_browser: Any, tmp_path: Path
) -> None:
    browser = superuser_browser
    name = "billing.reconcile_every_enterprise_customer_account_for_the_month_" * 2
    parent = WorkflowRunFactory(workflow=name, queue="reports-for-the-finance-department")
    child = WorkflowRunFactory(
        workflow=name + "child",
        status=RunStatus.SUSPENDED,
        suspend_reason="an approval from the finance department's second reviewer " * 3,
        concurrency_key="customer-000000000000000000017-eu-west-1-primary-account",
        priority=7,
    )
    WorkflowStepFactory(run=parent, name="reconcile_" * 8, kind=StepKind.CHILD, child_run=child)
    browser.set_window_size(1400, 900)
    try:
        for theme in ("light", "dark"):
            open_page(browser, reverse(RUNS))
            set_theme(browser, theme)
            inner, page, seen, table, shown = browser.execute_script(READ_WIDTHS)
            shot(browser, tmp_path, f"runs-{theme}")
            assert inner == 1400
            assert page <= seen, f"{theme}: the page is {page} px wide in a {seen} px window"
            assert table <= shown, f"{theme}: the runs table is {table} px wide in {shown} px"
        cut = browser.find_element(By.CSS_SELECTOR, f'.field-workflow_cell [title="{name}"]')
        cut_short = "return arguments[0].scrollWidth > arguments[0].clientWidth"
        assert browser.execute_script(cut_short, cut)  # an ellipsis; whole in its tooltip
    finally:
        browser.set_window_size(1280, 1024)


def click(browser: Any, element_id: str) -> None:
    """Click a button or link that loads a page, and wait until the new page is there."""
    from selenium.webdriver.support import expected_conditions

    old_page = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.ID, element_id).click()
    WebDriverWait(browser, 20).until(expected_conditions.staleness_of(old_page))
    WebDriverWait(browser, 20).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def heading_status(browser: Any) -> str:
    return browser.find_element(By.ID, "pikku-run-status").text


@pytest.mark.django_db(transaction=True)
def test_an_operator_resumes_cancels_and_retries_from_the_run_page(
    superuser_browser: Any, tmp_path: Path
) -> None:
    browser = superuser_browser
    suspended = WorkflowRunFactory(
        workflow="op-approval", status=RunStatus.SUSPENDED, suspend_reason="approve the deploy"
    )
    WorkflowStepFactory(
        run=suspended,
        name="approval",
        kind=StepKind.SUSPEND,
        status=StepStatus.SUSPENDED,
        retries=0,
    )
    page = reverse("admin:pikku_django_workflowrun_change", args=[suspended.pk])
    open_page(browser, page)
    assert heading_status(browser) == "suspended"
    shot(browser, tmp_path, "run-suspended")

    # Resume: bad JSON is refused on the confirmation page, good JSON resumes.
    click(browser, "pikku-steer-resume")
    assert "Resume this run?" in browser.title
    browser.find_element(By.NAME, "data").send_keys("{approved: yes")
    click(browser, "pikku-confirm-submit")
    assert "Enter a valid JSON." in browser.page_source
    assert WorkflowRun.objects.get(pk=suspended.pk).status == RunStatus.SUSPENDED
    field = browser.find_element(By.NAME, "data")
    field.clear()
    field.send_keys('{"approved": true}')
    shot(browser, tmp_path, "resume-confirm")
    click(browser, "pikku-confirm-submit")
    assert browser.current_url.endswith(page)
    assert f"Resumed run {suspended.pk}." in browser.page_source
    assert WorkflowRun.objects.get(pk=suspended.pk).status == RunStatus.RUNNING
    shot(browser, tmp_path, "run-resumed")

    # Cancel, from the same page; "No, take me back" first changes nothing.
    click(browser, "pikku-steer-cancel")
    browser.find_element(By.LINK_TEXT, "No, take me back").click()
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, "pikku-steer-cancel"))
    assert WorkflowRun.objects.get(pk=suspended.pk).status == RunStatus.RUNNING
    click(browser, "pikku-steer-cancel")
    click(browser, "pikku-confirm-submit")
    assert WorkflowRun.objects.get(pk=suspended.pk).status == RunStatus.CANCELLED
    wait_for(browser, "heading status", heading_status, "cancelled")

    # History shows who did what, with the data.
    browser.find_element(By.LINK_TEXT, "HISTORY").click()
    history = browser.find_element(By.ID, "change-history").text
    assert 'Resumed from the admin with data: {"approved": true}' in history
    assert "Cancelled from the admin" in history
    assert "operator" in history
    shot(browser, tmp_path, "run-history")
    messages = [e.change_message for e in LogEntry.objects.order_by("action_time")]
    assert messages == [
        'Resumed from the admin with data: {"approved": true}',
        "Cancelled from the admin",
    ]

    # Retry a failed run.
    failed = WorkflowRunFactory(
        workflow="op-charge", status=RunStatus.FAILED, error={"type": "KeyError", "message": "x"}
    )
    charge = WorkflowStepFactory(
        run=failed, name="charge", status=StepStatus.FAILED, attempt=1, retries=0
    )
    StepAttemptFactory(step=charge, attempt=1, status=StepStatus.FAILED)
    open_page(browser, reverse("admin:pikku_django_workflowrun_change", args=[failed.pk]))
    assert not browser.find_elements(By.ID, "pikku-steer-resume")
    click(browser, "pikku-steer-retry")
    click(browser, "pikku-confirm-submit")
    assert WorkflowRun.objects.get(pk=failed.pk).status == RunStatus.RUNNING
    assert LogEntry.objects.filter(object_id=str(failed.pk)).get().change_message == (
        "Retried from the admin"
    )


@pytest.mark.django_db(transaction=True)
def test_a_view_only_user_sees_no_buttons_and_is_refused(
    viewer_browser: Any, tmp_path: Path
) -> None:
    browser = viewer_browser
    run = WorkflowRunFactory(workflow="op-approval", status=RunStatus.SUSPENDED)
    open_page(browser, reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
    assert heading_status(browser) == "suspended"
    assert browser.find_elements(By.CSS_SELECTOR, "[id^=pikku-steer-]") == []
    shot(browser, tmp_path, "run-view-only")
    open_page(browser, reverse("admin:pikku_django_workflowrun_steer", args=[run.pk, "resume"]))
    assert "403" in browser.title or "Forbidden" in browser.page_source
    assert WorkflowRun.objects.get(pk=run.pk).status == RunStatus.SUSPENDED
    assert not LogEntry.objects.exists()


def total(browser: Any) -> str:
    # Read in one script: the refresh may swap the panel between two driver calls.
    return browser.execute_script("return document.getElementById('pikku-total').textContent")


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_refreshes_itself(superuser_browser: Any, tmp_path: Path) -> None:
    browser = superuser_browser
    WorkflowRunFactory(workflow="op-a", status=RunStatus.COMPLETED)
    WorkflowRunFactory(workflow="op-b", status=RunStatus.FAILED)
    dashboard = reverse("admin:pikku_django_workflowrun_dashboard")
    open_page(browser, dashboard + "?refresh=1")
    assert total(browser) == "2"
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.pikku-chart")) == 4
    shot(browser, tmp_path, "dashboard-before")
    WorkflowRunFactory(workflow="op-c", status=RunStatus.SUSPENDED)
    wait_for(browser, "dashboard total", total, "3")
    state = browser.find_element(By.ID, "pikku-dashboard-live").get_attribute("data-state")
    assert state == "live"
    shot(browser, tmp_path, "dashboard-after")
    # Each figure links to its filtered list.
    # (In one script: the panel may be swapped for a fresh one at any moment.)
    browser.execute_script("document.querySelector('tr[data-status=failed] a').click()")
    WebDriverWait(browser, 60).until(lambda d: "status__exact=failed" in d.current_url)
    assert "status__exact=failed" in browser.current_url
    rows = browser.find_element(By.ID, "result_list").text
    assert "op-b" in rows
    assert "op-a" not in rows


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Any:
    from pikku_django.webhooks.lifecycle import sync
    from tests import webhook_provider_defs as defs

    monkeypatch.delenv("PIKKU_DEV_WEBHOOK_URL", raising=False)
    sync()
    yield from defs.running_provider()


@pytest.mark.django_db(transaction=True)
def test_an_operator_enables_and_disables_a_source_from_its_page(
    superuser_browser: Any, provider: Any, tmp_path: Path
) -> None:
    from pikku_django.models import TriggerSource

    browser = superuser_browser
    open_page(browser, reverse("admin:pikku_django_triggersource_change", args=["prov-hooks"]))
    shot(browser, tmp_path, "source-off")
    click(browser, "pikku-switch-enable")
    field = browser.find_element(By.NAME, "pikku_base_url")
    assert field.get_attribute("value") == browser.live_server_url + "/pikku/"
    shot(browser, tmp_path, "source-enable-confirm")
    click(browser, "pikku-confirm-submit")
    shot(browser, tmp_path, "source-on")
    shown = browser.find_element(By.CLASS_NAME, "messagelist").text.lower()
    assert "prov-hooks: enabled; provider step: ok" in shown
    assert TriggerSource.objects.get(name="prov-hooks").enabled is True
    assert len(provider.registrations) == 1
    shot(browser, tmp_path, "source-on")
    click(browser, "pikku-switch-disable")
    click(browser, "pikku-confirm-submit")
    assert TriggerSource.objects.get(name="prov-hooks").enabled is False
    browser.find_element(By.LINK_TEXT, "HISTORY").click()
    history = browser.find_element(By.ID, "change-history").text
    assert "Enabled from the admin; provider step: ok" in history
    assert "Disabled from the admin" in history
