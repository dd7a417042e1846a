"""Webhook events bound with ``send_event_on``: the receipt and the workflow event
sent to the waiting run are stored in one transaction."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from pikku_django.models import WebhookReceipt
from pikku_django.webhooks.identifiers import UnusableIdentifierError, check_identifier
from pikku_django.webhooks.sources import EventBinding
from pikku_django.webhooks.sql import Gate, NewEvent, store_event
from pikku_django.workflows import RunKey, WorkflowEngine, WorkflowRunNotFoundError

logger = logging.getLogger(__name__)


class NoRunForEventError(Exception):
    """No run holds the key a ``send_event_on`` binding names: nothing was stored."""


def store_and_send(
    engine: WorkflowEngine,
    new: NewEvent,
    binding: EventBinding,
    *,
    gate: Gate | None,
    now: datetime,
) -> bool:
    """Store ``new``'s receipt and send its data to the bound run, both or neither:
    whether the receipt is new (a redelivery sends nothing). A run key breaking the
    identifier rule raises :class:`UnusableIdentifierError`, nothing stored."""
    with transaction.atomic(using=engine.using):
        if not store_event(engine.using, new, notify=False, gate=gate, now=now):
            return False
        data: Any = None if new.data_json is None else json.loads(new.data_json)
        try:
            key = check_identifier(binding.run_key(data), f"the run key of event {new.event!r}")
            sent = engine.events.send(
                RunKey(binding.workflow, key), binding.event, data, event_id=new.provider_id
            )
        except UnusableIdentifierError:
            raise  # refused (400), not waited for
        except (WorkflowRunNotFoundError, LookupError, TypeError, ValueError) as exc:
            raise NoRunForEventError(
                f"Webhook {new.source}:{new.event} {new.provider_id}: no run of "
                f"{binding.workflow!r} for it ({exc})"
            ) from exc
        # The receipt's run is the one the event went to: no worker starts another.
        WebhookReceipt.objects.using(engine.using).filter(
            source=new.source, event=new.event, provider_id=new.provider_id
        ).update(run_id=sent.run_id, input=None)
    logger.info(
        "Webhook %s:%s %s sent to run %s (%s)",
        new.source,
        new.event,
        new.provider_id,
        sent.run_id,
        sent.outcome,
    )
    return True
