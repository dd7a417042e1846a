"""The queues page in headless Chromium: its tables are laid out and readable.

Uses the browser and static files of tests/test_browser.py. Set
``PIKKU_SCREENSHOT`` to a file name to keep a picture of the page.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from pikku_django.models import RunStatus, StepKind
from tests.factories import WorkflowRunFactory, WorkflowStepFactory
from tests.test_browser import _live_server_static as _static  # noqa: F401
from tests.test_browser import driver as _chromium  # noqa: F401

try:
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the driver fixture skips
    By = None

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_queues_page_lays_out_its_tables(
    request: Any, live_server: Any, django_user_model: Any, settings: Any
) -> None:
    settings.PIKKU = {"QUEUES": {"reports": {"concurrency": 4, "rate": "100/1m"}}}
    driver = request.getfixturevalue("_chromium")
    run = WorkflowRunFactory(status=RunStatus.RUNNING, queue="reports")
    for n in range(3):
        WorkflowStepFactory(run=run, name=f"s{n}", kind=StepKind.QUEUED, queue="reports")
    for n in range(4):
        WorkflowRunFactory(concurrency_key="customer-17", key_waiting=n > 0)
    user = django_user_model.objects.create_superuser("queues", "q@example.com", "pw")
    client = Client()
    client.force_login(user)
    driver.get(live_server.url + "/admin/login/")
    driver.delete_all_cookies()
    cookie = settings.SESSION_COOKIE_NAME
    driver.add_cookie({"name": cookie, "value": client.cookies[cookie].value, "path": "/"})
    driver.get(live_server.url + reverse("admin:pikku_django_workflowrun_queues"))
    assert "/login/" not in driver.current_url
    queues = driver.find_element(By.ID, "pikku-queue-limits")
    keys = driver.find_element(By.ID, "pikku-concurrency-keys")
    assert queues.is_displayed()
    assert keys.is_displayed()
    row = driver.find_element(By.CSS_SELECTOR, 'tr[data-queue="reports"]')
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert (cells[0], cells[4]) == ("reports", "4")
    assert "of 100 per 1 min" in cells[5]
    key_row = driver.find_element(By.CSS_SELECTOR, 'tr[data-key="customer-17"]')
    assert [c.text for c in key_row.find_elements(By.TAG_NAME, "td")] == [
        "customer-17",
        "1",
        "3",
        "1",
    ]
    # The admin's stylesheet applies: the table is laid out as a table, not bare text.
    assert queues.value_of_css_property("display") != "inline"
    assert row.size["height"] > 0
    assert row.size["width"] > 400
    shot = os.environ.get("PIKKU_SCREENSHOT")
    if shot:
        driver.set_window_size(1400, 900)
        driver.save_screenshot(shot)
