"""Turning accepted events into durable work: a workflow run per event, started with
the event's receipt in one transaction."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from django.db import IntegrityError, transaction

from pikku_django.models import WebhookReceipt
from pikku_django.webhooks.sources import WebhookEvent, WebhookSource, handler_for
from pikku_django.workflows.engine import to_json
from pikku_django.workflows.errors import NotSerializableError
from pikku_django.workflows.registry import get_step, step, workflow

logger = logging.getLogger(__name__)

#: The workflow that runs a function handler as a retried step on a worker.
DISPATCH_WORKFLOW = "pikku.webhooks.dispatch"
CALL_HANDLER = "pikku.webhooks.call_handler"


@step(name=CALL_HANDLER)
def call_handler(data: dict[str, Any]) -> Any:
    """Call the function bound to the event, with the event."""
    from pikku_django.workflows.errors import StepFunctionNotFoundError

    definition = get_step(data["handler"])
    if definition is None:
        raise StepFunctionNotFoundError(data["handler"])
    return definition.call(data["event"])


@workflow(name=DISPATCH_WORKFLOW)
def dispatch(ctx: Any, input: dict[str, Any]) -> Any:
    return ctx.do("handle", CALL_HANDLER, input)


def provider_id_for(event: WebhookEvent, delivery_id: str | None, body: bytes) -> str:
    """The de-duplication id: the event's own, the delivery's, or a hash of the body."""
    if event.id:
        return str(event.id)[:255]
    if delivery_id:
        return str(delivery_id)[:255]
    return "sha256:" + hashlib.sha256(body).hexdigest()


def accept_events(
    source: WebhookSource,
    events: list[WebhookEvent],
    *,
    delivery_id: str | None,
    body: bytes,
) -> int:
    """Store each new event with its receipt and start its run; how many were new.

    A redelivered event (same source, event and provider id) is not stored or
    dispatched again.
    """
    from pikku_django.workflows.api import get_engine

    engine = get_engine()
    accepted = 0
    for event in events:
        handler = handler_for(source.name, event.name)
        if handler is None:
            continue
        provider_id = provider_id_for(event, delivery_id, body)
        payload = {
            "source": source.name,
            "event": event.name,
            "id": provider_id,
            "data": event.data,
        }
        try:
            payload = to_json(payload, f"Event {source.name}:{event.name}")
        except NotSerializableError:
            logger.warning(
                "Webhook %s:%s %s: its data is not JSON; dropped",
                source.name,
                event.name,
                provider_id,
            )
            continue
        key = f"webhook:{source.name}:{event.name}:{provider_id}"[:255]
        if handler.workflow is not None:
            workflow_name, run_input = handler.workflow, payload
        else:
            workflow_name, run_input = (
                DISPATCH_WORKFLOW,
                {"handler": handler.step, "event": payload},
            )
        try:
            # The run first (MariaDB checks foreign keys at once), then the receipt,
            # whose unique (source, event, provider id) refuses a redelivery.
            with transaction.atomic(using=engine.using):
                run = engine.create_run(workflow_name, run_input, idempotency_key=key)
                WebhookReceipt.objects.using(engine.using).create(
                    source=source.name,
                    event=event.name,
                    provider_id=provider_id,
                    data=payload["data"],
                    run=run,
                )
        except IntegrityError:
            logger.info(
                "Webhook %s:%s %s was already received; not dispatched again",
                source.name,
                event.name,
                provider_id,
            )
            continue
        accepted += 1
    return accepted
