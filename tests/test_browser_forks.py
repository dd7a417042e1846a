"""Re-running a run from a step in headless Chromium: the step's link, the
confirmation page, the success message's link to the new run, and both runs' pages
naming each other. Screenshots go under the test's ``tmp_path`` (and, when
``PIKKU_SHOTS`` names a directory, there too, to look at)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows.api import get_engine, reset_engine
from tests.fork_defs import ORDER

# The browser, its logged-in fixture and helpers of the operator's browser tests.
from tests.test_browser_operator import _chromium, _static, click, log_in, open_page  # noqa: F401
from tests.test_browser_operator import shot as _shot

try:
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the driver fixture skips
    By = None


@pytest.fixture(autouse=True)
def _fresh_engine() -> Any:
    reset_engine()
    yield
    reset_engine()


def shot(browser: Any, tmp_path: Path, name: str) -> Path:
    path = _shot(browser, tmp_path, name)
    keep = os.environ.get("PIKKU_SHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return path


@pytest.fixture
def operator(request: Any, live_server: Any, django_user_model: Any) -> Any:
    user = django_user_model.objects.create_superuser("operator", "o@example.com", "pw")
    return log_in(request.getfixturevalue("_chromium"), live_server, user)


@pytest.mark.django_db(transaction=True)
def test_an_operator_reruns_a_run_from_a_step(operator: Any, tmp_path: Path) -> None:
    browser = operator
    browser.set_window_size(1400, 1100)
    engine = get_engine()
    original = engine.start(ORDER, {"n": 3})
    engine.run_until_idle()
    engine.events.send(original.id, "approve", {"by": "ada"})
    engine.run_until_idle()
    child = WorkflowStep.objects.get(run_id=original.pk, name="child")

    open_page(browser, f"/admin/pikku_django/workflowrun/{original.pk}/change/")
    link = browser.find_element(By.ID, f"pikku-fork-{child.pk}")
    assert link.text == "Re-run from this step"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", link)
    shot(browser, tmp_path, "fork-run-page")

    click(browser, f"pikku-fork-{child.pk}")
    assert "Re-run this run from step “child”?" in browser.title
    again = browser.find_element(By.ID, "pikku-fork-again").text
    assert "child, event:approve, ship" in again
    assert "happens again" in again
    shot(browser, tmp_path, "fork-confirm")
    assert not WorkflowRun.objects.filter(forked_from=original).exists()

    click(browser, "pikku-confirm-submit")
    fork = WorkflowRun.objects.get(forked_from=original)
    message = browser.find_element(By.CSS_SELECTOR, "ul.messagelist li.success")
    assert "Started a new run from step “child”" in message.text
    assert str(fork.pk) in message.text
    assert browser.find_element(By.ID, "pikku-fork-list").text.count("from step child") == 1
    shot(browser, tmp_path, "fork-done")

    message.find_element(By.TAG_NAME, "a").click()
    browser.find_element(By.ID, "pikku-forked-from")
    forked_from = browser.find_element(By.ID, "pikku-forked-from").text
    assert forked_from == f"Forked from {ORDER} {str(original.pk)[:8]} at step child"
    shot(browser, tmp_path, "fork-new-run")
