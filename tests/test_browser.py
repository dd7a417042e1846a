"""The run page follows its run live, in headless Chromium driven by Selenium.

A superuser's session cookie is put in the browser; the test thread drives a
:class:`WorkflowEngine` with a :class:`FakeClock` on the default database while
the page, served by pytest-django's ``live_server``, follows the status stream.

Needs ``selenium`` (the ``dev`` extra) and Debian's ``chromium`` and
``chromium-driver``; without them the browser tests are skipped, and fail when
``CI=true``. Registered names here start with ``browser.``.
"""

from __future__ import annotations

import os
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib import admin
from django.templatetags.static import static
from django.test import Client, override_settings
from django.urls import path, reverse

import pikku_django
from pikku_django.leases import InMemoryLeaseService
from pikku_django.workflows import FakeClock, WorkflowEngine, step, workflow
from tests.conftest import skip_unless_ci

try:
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # pragma: no cover - the skip below says what to install
    webdriver = None

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-proxy-server",
    "--window-size=1280,1024",
)
WAIT = 60  # seconds for the page to catch up with the engine (a hang guard)
SCRIPT = "pikku_django/run_live.js"
REASON = "needs <b>approval</b> & a nod"
NOTE = "<img src=x onerror=alert(1)>"

# For the "project without pikku's URLs" test: ROOT_URLCONF = "tests.test_browser".
urlpatterns = [path("admin/", admin.site.urls)]


# -- the workflow ------------------------------------------------------------------------


@step(name="browser.fetch")
def fetch(data: dict[str, Any]) -> dict[str, Any]:
    return {"items": data["items"]}


@workflow(name="browser.story")
def story(ctx: Any, input: dict[str, Any]) -> Any:
    fetched = ctx.do("fetch", fetch, input)
    ctx.sleep("nap", 60)
    approver = ctx.suspend(REASON)
    return {"approved_by": approver, "items": fetched["items"], "note": NOTE}


@workflow(name="browser.kid")
def kid(ctx: Any, input: Any) -> Any:
    return {"nod": ctx.suspend("a nod for the kid")}


@workflow(name="browser.family")
def family(ctx: Any, input: Any) -> Any:
    return ctx.do("kid", kid, input)


def engine() -> WorkflowEngine:
    return WorkflowEngine("default", leases=InMemoryLeaseService(), clock=FakeClock())


def run_page(run_id: Any) -> str:
    return reverse("admin:pikku_django_workflowrun_change", args=[run_id])


def refuse_everyone(request: Any, run: Any) -> bool:
    return False


# -- the browser -------------------------------------------------------------------------


def missing_browser() -> str | None:
    if webdriver is None:
        return "selenium is not installed (pip install 'selenium>=4.20'; it is in the dev extra)"
    for program, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(program, os.X_OK):
            return f"{program} is missing (apt-get install {package})"
    return None


def require_browser() -> None:
    """Skip (or, under CI, fail) unless Selenium and headless Chromium are here."""
    reason = missing_browser()
    if reason is not None:
        skip_unless_ci(reason)


@pytest.fixture(scope="session", autouse=True)
def _live_server_static() -> Iterator[None]:
    """Let ``live_server`` serve the admin's and the package's static files.

    ``live_server`` is session-scoped and its static handler reads ``STATIC_URL``
    when it starts: with none set (as in tests/settings.py) it fails every
    request. So when the project sets none, this serves, at ``/static/``, a
    directory holding the admin's ``static/admin`` (its stylesheets and themes)
    and the package's ``static/pikku_django`` for the rest of the session
    (autouse, so it is in place before ``live_server`` starts).
    """
    if django_settings.STATIC_URL:
        yield
        return
    import django.contrib.admin

    sources = {
        "admin": Path(django.contrib.admin.__file__).resolve().parent / "static" / "admin",
        "pikku_django": Path(pikku_django.__file__).resolve().parent / "static" / "pikku_django",
    }
    with tempfile.TemporaryDirectory(prefix="pikku-static-") as root:
        for name, source in sources.items():
            (Path(root) / name).symlink_to(source, target_is_directory=True)
        with override_settings(STATIC_URL="/static/", STATIC_ROOT=root):
            yield


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    require_browser()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory(prefix="pikku-chromium-") as profile:
        options.add_argument(f"--user-data-dir={profile}")
        browser = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        try:
            yield browser
        finally:
            browser.quit()


@pytest.fixture
def browser(driver: Any, live_server: Any, django_user_model: Any, settings: Any) -> Any:
    """The browser, logged in to the live server's admin as a superuser."""
    settings.PIKKU = {"STREAM_POLL_INTERVAL": 0.05}
    script = live_server.url + static(SCRIPT)
    try:
        with urllib.request.urlopen(script, timeout=5) as response:  # noqa: S310 - our server
            assert response.status == 200
    except Exception as exc:
        pytest.fail(f"The live server does not serve {static(SCRIPT)}: {exc}", pytrace=False)
    user = django_user_model.objects.create_superuser("browser", "b@example.com", "pw")
    client = Client()
    client.force_login(user)
    driver.get(script)  # a page of the live server's origin, to set its cookie on
    driver.delete_all_cookies()
    cookie = django_settings.SESSION_COOKIE_NAME
    driver.add_cookie({"name": cookie, "value": client.cookies[cookie].value, "path": "/"})
    driver.live_server_url = live_server.url
    return driver


def open_run_page(browser: Any, run_id: Any) -> None:
    browser.get(browser.live_server_url + run_page(run_id))
    assert "/login/" not in browser.current_url, "the session cookie did not log the browser in"
    browser.execute_script("window.pikkuSamePage = 'yes';")  # gone if the page reloads


def wait_for(browser: Any, what: str, read: Callable[[Any], Any], expected: Any) -> None:
    """Wait until ``read(browser) == expected``; on timeout say what was seen last."""
    seen: list[Any] = [None]

    def check(d: Any) -> bool:
        seen[0] = read(d)
        return bool(seen[0] == expected)

    try:
        WebDriverWait(browser, WAIT, poll_frequency=0.05).until(check)
    except TimeoutException:
        pytest.fail(f"{what}: expected {expected!r}, the page shows {seen[0]!r}", pytrace=False)


def text_of(element_id: str) -> Callable[[Any], str]:
    return lambda d: d.find_element(By.ID, element_id).text


def live_state(d: Any) -> str:
    return d.find_element(By.ID, "pikku-live").get_attribute("data-state")


def live_steps(d: Any) -> list[tuple[str, ...]]:
    rows = d.find_elements(By.CSS_SELECTOR, "#pikku-live-steps tbody tr")
    return [tuple(td.text for td in row.find_elements(By.TAG_NAME, "td")) for row in rows]


# -- the tests ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_run_page_follows_the_run_live(browser: Any) -> None:
    wf = engine()
    run = wf.start("browser.story", {"items": 3})
    open_run_page(browser, run.id)
    wait_for(browser, "live state", live_state, "live")
    wait_for(browser, "status", text_of("pikku-run-status"), "running")
    assert live_steps(browser) == []
    assert not browser.find_element(By.ID, "pikku-run-reason-row").is_displayed()

    wf.run_until_idle()  # the queued step runs; the sleep starts
    wait_for(
        browser,
        "steps",
        live_steps,
        [("1", "fetch", "succeeded", "1"), ("2", "nap", "scheduled", "0")],
    )

    wf.clock.advance(61)
    wf.run_until_idle()  # the sleep is over; the run suspends
    wait_for(browser, "status", text_of("pikku-run-status"), "suspended")
    wait_for(browser, "suspend reason", text_of("pikku-run-reason"), REASON)
    assert browser.find_elements(By.CSS_SELECTOR, "#pikku-run-reason b") == []
    assert [row[1:3] for row in live_steps(browser)][-1] == ("suspend", "suspended")
    assert not browser.find_element(By.ID, "pikku-live-note").is_displayed()

    wf.resume(run.id, "alice")
    wf.run_until_idle()
    wait_for(browser, "status", text_of("pikku-run-status"), "completed")
    wait_for(browser, "live state", live_state, "done")
    output = browser.find_element(By.ID, "pikku-run-output").text
    assert '"approved_by": "alice"' in output
    assert '"items": 3' in output
    assert NOTE in output  # shown as text ...
    assert browser.find_elements(By.CSS_SELECTOR, "#pikku-run-output *") == []  # ... not markup
    assert not browser.find_element(By.ID, "pikku-run-reason-row").is_displayed()
    assert not browser.find_element(By.ID, "pikku-run-error-row").is_displayed()
    assert [row[1:3] for row in live_steps(browser)] == [
        ("fetch", "succeeded"),
        ("nap", "succeeded"),
        ("suspend", "succeeded"),
    ]
    assert browser.execute_script("return window.pikkuSamePage") == "yes", "the page reloaded"


#: The statuses of the timeline's lanes, top to bottom.
READ_TIMELINE = """
var lanes = document.querySelectorAll('#pikku-run-timeline .pikku-tl-lane');
return Array.from(lanes).map(function (lane) { return lane.getAttribute('data-status'); });
"""


def timeline_lanes(d: Any) -> list[str]:
    return list(d.execute_script(READ_TIMELINE))


def timeline_shown(d: Any) -> bool:
    """Whether the live timeline is on screen, read in one script: the live refresh may
    replace the element between a lookup and a second call on it."""
    return bool(
        d.execute_script(
            "const e = document.getElementById('pikku-run-timeline');"
            " return !!e && e.getClientRects().length > 0;"
        )
    )


@pytest.mark.django_db(transaction=True)
def test_the_timeline_follows_the_run(browser: Any) -> None:
    wf = engine()
    run = wf.start("browser.story", {"items": 3})
    open_run_page(browser, run.id)
    wait_for(browser, "live state", live_state, "live")
    assert timeline_lanes(browser) == []
    assert not timeline_shown(browser)
    wf.run_until_idle()  # the queued step runs; the sleep starts
    wait_for(browser, "timeline", timeline_lanes, ["succeeded", "scheduled"])
    wait_for(browser, "timeline shown", timeline_shown, True)
    wf.clock.advance(61)
    wf.run_until_idle()  # the sleep is over; the run suspends
    wait_for(browser, "timeline", timeline_lanes, ["succeeded", "succeeded", "suspended"])
    # Read in one script: the live refresh may swap the chart between two reads.
    marks = browser.execute_script(
        "return Array.from(document.querySelectorAll('#pikku-run-timeline [data-mark]'),"
        " (m) => m.getAttribute('data-mark'));"
    )
    assert set(marks) >= {"sleep", "approval"}
    assert browser.execute_script("return window.pikkuSamePage") == "yes", "the page reloaded"


@pytest.mark.django_db(transaction=True)
def test_without_javascript_the_server_rendered_page_is_still_there(browser: Any) -> None:
    wf = engine()
    run = wf.start("browser.story", {"items": 1})
    wf.run_until_idle()
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        browser.get(browser.live_server_url + run_page(run.id))
        timeline = browser.find_element(By.ID, "pikku-timeline")
        assert timeline.is_displayed()
        assert "fetch" in timeline.text
        assert "nap" in timeline.text
        assert "scheduled" in timeline.text
        assert not browser.find_element(By.ID, "pikku-live").is_displayed()
        assert browser.find_element(By.ID, "pikku-live").get_attribute("data-state") == "off"
    finally:
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})


@pytest.mark.django_db(transaction=True)
def test_a_dropped_stream_shows_a_quiet_note_and_reconnects(browser: Any, settings: Any) -> None:
    # Each stream ends after a moment, as a proxy's timeout would cut it.
    settings.PIKKU = {"STREAM_POLL_INTERVAL": 0.05, "STREAM_MAX_SECONDS": 0.3}
    wf = engine()
    run = wf.start("browser.story", {"items": 2})
    open_run_page(browser, run.id)
    wait_for(browser, "live state", live_state, "paused")
    assert "paused" in browser.find_element(By.ID, "pikku-live-note").text
    wf.cancel(run.id)  # while the page is disconnected
    wait_for(browser, "live state", live_state, "done")  # EventSource reconnected by itself
    assert browser.find_element(By.ID, "pikku-run-status").text == "cancelled"
    assert not browser.find_element(By.ID, "pikku-live-note").is_displayed()
    assert browser.execute_script("return window.pikkuSamePage") == "yes", "the page reloaded"


@pytest.mark.django_db(transaction=True)
def test_a_refused_stream_says_live_updates_stopped(browser: Any, settings: Any) -> None:
    settings.PIKKU = {"RUN_VIEW_PERMISSION": "tests.test_browser.refuse_everyone"}
    run = engine().start("browser.story", {"items": 2})
    open_run_page(browser, run.id)
    wait_for(browser, "live state", live_state, "stopped")
    assert "stopped" in browser.find_element(By.ID, "pikku-live-note").text
    assert browser.find_element(By.ID, "pikku-run-status").text == "running"


#: The run page's buttons, the status its tree shows for the run given, and its Delete link.
READ_PARTS = """
var buttons = document.querySelectorAll('[id^=pikku-steer-]');
var tree = '#pikku-run-tree li[data-run="' + arguments[0] + '"] > .pikku-badge';
var badge = document.querySelector(tree);
return [Array.from(buttons).map(function (a) { return a.id; }),
        badge ? badge.textContent : null,
        Boolean(document.getElementById('pikku-run-delete'))];
"""


def page_parts(child_id: Any) -> Callable[[Any], tuple[Any, ...]]:
    return lambda d: tuple(
        tuple(x) if isinstance(x, list) else x for x in d.execute_script(READ_PARTS, str(child_id))
    )


@pytest.mark.django_db(transaction=True)
def test_the_buttons_and_the_tree_follow_the_run(browser: Any) -> None:
    from pikku_django.models import WorkflowStep

    wf = engine()
    run = wf.start("browser.family", {})
    wf.run_until_idle()  # the child starts and suspends
    child_id = WorkflowStep.objects.get(run_id=run.id).child_run_id
    open_run_page(browser, run.id)
    read = page_parts(child_id)
    wait_for(browser, "parts", read, (("pikku-steer-cancel",), "suspended", False))
    wf.resume(child_id, "yes")
    wf.run_until_idle()  # the child completes, and so does its parent
    wait_for(browser, "status", text_of("pikku-run-status"), "completed")
    wait_for(browser, "parts", read, ((), "completed", True))
    assert browser.execute_script("return window.pikkuSamePage") == "yes", "the page reloaded"


# -- without a browser -------------------------------------------------------------------


@pytest.mark.django_db
def test_the_run_page_names_its_stream(admin_client: Client) -> None:
    run = engine().start("browser.story", {"items": 1})
    page = admin_client.get(run_page(run.id)).content.decode()
    stream = reverse("pikku_django:run-stream", args=[run.id])
    assert f'data-stream-url="{stream}"' in page
    assert static(SCRIPT) in page
    assert 'id="pikku-live" hidden' in page
    assert 'id="pikku-live-off"' not in page


@pytest.mark.django_db
def test_without_pikku_urls_the_run_page_says_live_updates_are_off(
    admin_client: Client, settings: Any
) -> None:
    settings.ROOT_URLCONF = "tests.test_browser"
    run = engine().start("browser.story", {"items": 1})
    page = admin_client.get(run_page(run.id)).content.decode()
    assert 'id="pikku-live-off"' in page
    assert "run_live.js" not in page
    assert "data-stream-url" not in page
    assert 'id="pikku-timeline"' in page
