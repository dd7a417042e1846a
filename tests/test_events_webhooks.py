"""A payment webhook wakes the checkout run waiting for it: the source's handler sends
the event, idempotent by the provider's id, to the run keyed by the order."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Any

import pytest
from django.test import Client

from pikku_django.models import RunStatus, WebhookReceipt, WorkflowEvent, WorkflowRun
from pikku_django.webhooks import (
    WebhookEvent,
    WebhookSource,
    credential_name,
    on_webhook,
    register_source,
    send_event_on,
    set_credential,
)
from pikku_django.webhooks.lifecycle import sync
from pikku_django.webhooks.presets import GitHub
from pikku_django.workflows import EventOutcome, RunKey, get_engine, send_event
from pikku_django.workflows.api import reset_engine
from tests.conftest import database_alias, db_mark
from tests.test_events import ev_checkout

VENDORS = ("sqlite", "postgres", "mariadb")


SECRET = "payments-secret"
URL = "/pikku/webhooks/ev-payments/"
BOUND_URL = "/pikku/webhooks/ev-bound/"
outcomes: list[EventOutcome] = []


def receive_payment(request: Any, ctx: Any) -> Any:
    data = json.loads(ctx.body)
    return [WebhookEvent(data["type"], id=data["id"], data=data["object"])]


register_source(
    WebhookSource(
        name="ev-payments",
        verify=GitHub(),
        receive=receive_payment,
        events={"payment_intent.succeeded": None},
    )
)


@on_webhook("ev-payments:payment_intent.succeeded")
def payment_succeeded(event: dict[str, Any]) -> str:
    intent = event["data"]
    sent = send_event(
        RunKey("ev_checkout", intent["metadata"]["order"]),
        "payment",
        {"order": intent["metadata"]["order"], "intent": intent["id"]},
        event_id=event["id"],
    )
    outcomes.append(sent.outcome)
    return str(sent.outcome)


def _post(client: Client, payload: dict[str, Any], delivery: str, url: str = URL) -> Any:
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return client.post(
        url,
        body,
        content_type="application/json",
        HTTP_X_GITHUB_EVENT="payment",
        HTTP_X_GITHUB_DELIVERY=delivery,
        HTTP_X_HUB_SIGNATURE_256=signature,
    )


@pytest.fixture
def source() -> Any:
    reset_engine()
    sync()
    from pikku_django.models import TriggerSource

    TriggerSource.objects.filter(name="ev-payments").update(enabled=True)
    set_credential(credential_name("ev-payments"), SECRET)
    outcomes.clear()
    yield
    reset_engine()


@pytest.mark.django_db(transaction=True)
def test_the_payment_webhook_wakes_the_checkout_run(client: Client, source: Any) -> None:
    engine = get_engine()
    run = engine.start(ev_checkout, {}, idempotency_key="order-42")
    engine.run_until_idle()
    assert engine.get_run(run.id).status == RunStatus.RUNNING
    payload = {
        "id": "evt_1",
        "type": "payment_intent.succeeded",
        "object": {"id": "pi_1", "metadata": {"order": "order-42"}},
    }
    assert _post(client, payload, "d-1").json() == {"received": 1}
    assert _post(client, payload, "d-2").json() == {"received": 0}  # a redelivery
    engine.run_until_idle()
    done = engine.get_run(run.id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output["paid"] == {"order": "order-42", "intent": "pi_1"}
    assert outcomes == [EventOutcome.DELIVERED]
    # A late retry of the handler, after the run ended, stores nothing.
    assert payment_succeeded({"id": "evt_1", "data": payload["object"]}) == "run_ended"
    assert WorkflowEvent.objects.filter(run_id=run.id).count() == 1


# -- send_event_on: the receipt and the event in one transaction -----------------------

register_source(
    WebhookSource(
        name="ev-bound",
        verify=GitHub(),
        receive=receive_payment,
        events={"payment_intent.succeeded": None},
    )
)
send_event_on(
    "ev-bound:payment_intent.succeeded",
    ev_checkout,
    event="payment",
    run_key=lambda data: data["metadata"]["order"],
)


@pytest.fixture(params=[pytest.param(v, marks=db_mark(v), id=v) for v in VENDORS])
def bound(request: pytest.FixtureRequest, settings: Any) -> Any:
    """ev-bound enabled, with the runs, receipts and events on the vendor's database."""
    settings.PIKKU = {"WORKFLOW_DATABASE": database_alias(request.param)}
    reset_engine()
    sync()
    from pikku_django.models import TriggerSource

    TriggerSource.objects.filter(name="ev-bound").update(enabled=True)
    set_credential(credential_name("ev-bound"), SECRET)
    yield
    reset_engine()


def test_send_event_on_stores_the_receipt_and_the_event_together(
    client: Client, bound: Any
) -> None:
    engine = get_engine()
    run = engine.start(ev_checkout, {}, idempotency_key="order-7")
    engine.run_until_idle()
    payload = {
        "id": "evt_7",
        "type": "payment_intent.succeeded",
        "object": {"id": "pi_7", "order": "order-7", "metadata": {"order": "order-7"}},
    }
    assert _post(client, payload, "d-7", url=BOUND_URL).json() == {"received": 1}
    using = engine.using
    receipt = WebhookReceipt.objects.using(using).get(source="ev-bound", provider_id="evt_7")
    assert receipt.run_id == run.id
    assert not receipt.waiting  # no run is started for it
    [event] = WorkflowEvent.objects.using(using).filter(run_id=run.id)
    assert (event.name, event.event_id, event.step_id is not None) == ("payment", "evt_7", True)
    assert _post(client, payload, "d-8", url=BOUND_URL).json() == {"received": 0}
    engine.run_until_idle()
    done = engine.get_run(run.id)
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output["paid"]["id"] == "pi_7"
    assert WorkflowRun.objects.using(using).filter(workflow="ev_checkout").count() == 1


def test_an_event_for_no_run_stores_no_receipt(client: Client, bound: Any) -> None:
    payload = {
        "id": "evt_8",
        "type": "payment_intent.succeeded",
        "object": {"id": "pi_8", "metadata": {"order": "no-such-order"}},
    }
    answer = _post(client, payload, "d-9", url=BOUND_URL)
    assert answer.status_code == 409
    using = get_engine().using
    assert not WebhookReceipt.objects.using(using).filter(source="ev-bound").exists()
    assert not WorkflowEvent.objects.using(using).exists()


# -- identifiers from the body: the rule delivery-id headers follow ---------------------

HOSTILE_IDS = ["evt_9\nWebhook ev-bound refused: forged", "evt_9\x1b]0;title\x07", "e" * 256]


def test_an_event_id_from_the_body_breaking_the_id_rule_is_refused_400(
    client: Client, bound: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = get_engine()
    engine.start(ev_checkout, {}, idempotency_key="order-9")
    engine.run_until_idle()
    caplog.set_level(logging.DEBUG, logger="pikku_django")
    for n, bad in enumerate(HOSTILE_IDS):
        payload = {
            "id": bad,
            "type": "payment_intent.succeeded",
            "object": {"id": "pi_9", "metadata": {"order": "order-9"}},
        }
        answer = _post(client, payload, f"d-id-{n}", url=BOUND_URL)
        assert answer.status_code == 400, answer.content
        assert "id of event 'payment_intent.succeeded' is not a usable id" in answer.json()["error"]
    using = engine.using
    assert not WebhookReceipt.objects.using(using).filter(source="ev-bound").exists()
    assert not WorkflowEvent.objects.using(using).exists()
    logged = [record.getMessage() for record in caplog.records]
    assert any("not a usable id" in message for message in logged)
    assert not [m for m in logged if "\n" in m or "\x1b" in m or "e" * 256 in m]


def test_a_run_key_from_the_body_breaking_the_id_rule_is_refused_400(
    client: Client, bound: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pikku_django")
    for n, bad in enumerate(HOSTILE_IDS):
        payload = {
            "id": f"evt_key_{n}",
            "type": "payment_intent.succeeded",
            "object": {"id": "pi_10", "metadata": {"order": bad}},
        }
        answer = _post(client, payload, f"d-key-{n}", url=BOUND_URL)
        assert answer.status_code == 400, answer.content
        assert "run key of event" in answer.json()["error"]
    using = get_engine().using
    assert not WebhookReceipt.objects.using(using).filter(source="ev-bound").exists()
    logged = [record.getMessage() for record in caplog.records]
    assert not [m for m in logged if "\n" in m or "\x1b" in m or "e" * 256 in m]
