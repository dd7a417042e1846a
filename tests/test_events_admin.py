"""The run page shows the run's version, the events it waited for and got, the
events kept for a later wait, and its published values."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from pikku_django.workflows import EventOutcome, get_engine, send_event
from pikku_django.workflows.api import reset_engine
from tests.test_events import ev_checkout


@pytest.fixture
def fresh_engine() -> Any:
    reset_engine()
    yield get_engine()
    reset_engine()


@pytest.mark.django_db(transaction=True)
def test_the_run_page_shows_events_version_and_published_values(
    admin_client: Client, fresh_engine: Any
) -> None:
    run = fresh_engine.start(ev_checkout, {})
    fresh_engine.run_until_idle()
    assert send_event(run.id, "refund", {"why": "early"}, event_id="re_1").outcome == (
        EventOutcome.KEPT
    )
    assert send_event(run.id, "payment", {"order": 5}, event_id="pi_5").outcome == (
        EventOutcome.DELIVERED
    )
    fresh_engine.run_until_idle()
    page = admin_client.get(reverse("admin:pikku_django_workflowrun_change", args=[run.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    version = fresh_engine.get_run(run.id).version
    assert version.startswith("code-")
    assert version in html
    assert "pi_5" in html
    assert "event:payment" in html
    assert "re_1" in html
    assert "kept for a later wait" in html
    assert "Events and published values" in html
    assert "&quot;progress&quot;: &quot;paid&quot;" in html
