"""A payment webhook wakes the checkout run waiting for it: the source's handler sends
the event, idempotent by the provider's id, to the run keyed by the order."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import pytest
from django.test import Client

from pikku_django.models import RunStatus, WorkflowEvent
from pikku_django.webhooks import (
    WebhookEvent,
    WebhookSource,
    credential_name,
    on_webhook,
    register_source,
    set_credential,
)
from pikku_django.webhooks.lifecycle import sync
from pikku_django.webhooks.presets import GitHub
from pikku_django.workflows import EventOutcome, RunKey, get_engine, send_event
from pikku_django.workflows.api import reset_engine
from tests.test_events import ev_checkout

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "payments-secret"
URL = "/pikku/webhooks/ev-payments/"
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


def _post(client: Client, payload: dict[str, Any], delivery: str) -> Any:
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return client.post(
        URL,
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
