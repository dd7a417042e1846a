"""The view every webhook source's route goes to: verify first, then receive.

A source's switch and secrets may come from what the database connection kept from
an earlier request (:mod:`pikku_django.webhooks.state`). Such a state is confirmed
before the answer stands: each stored event's statement checks it (its gate), and
every other answer reads it afresh first.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.conf import settings
from django.db import router, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from pikku_django.conf import pikku_settings
from pikku_django.models import TriggerSource
from pikku_django.webhooks.dispatch import new_events, store_new_event
from pikku_django.webhooks.sources import (
    ReceiveContext,
    Received,
    WebhookEvent,
    WebhookSource,
    source_for_route,
)
from pikku_django.webhooks.sql import SourceChanged
from pikku_django.webhooks.state import SourceState, source_state
from pikku_django.webhooks.verify import (
    MalformedSignatureError,
    VerifiedRequest,
    WebhookVerificationError,
)

logger = logging.getLogger(__name__)

#: How many times one request re-reads a source that changed while its events were stored.
MAX_RECHECKS = 3


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _received(count: int) -> HttpResponse:
    """``{"received": count}``, as JsonResponse would write it."""
    return HttpResponse(b'{"received": %d}' % count, content_type="application/json")


def _read_body(request: HttpRequest, limit: int) -> bytes | None:
    """The raw body, read once; None when it is larger than ``limit``."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return None
    body = request.read(limit + 1)
    return None if len(body) > limit else body


def _as_received(value: Any) -> Received:
    if isinstance(value, Received):
        return value
    if isinstance(value, HttpResponse):
        return Received(response=value)
    if value is None:
        return Received()
    if isinstance(value, WebhookEvent):
        return Received(events=[value])
    if isinstance(value, list | tuple) and all(isinstance(e, WebhookEvent) for e in value):
        return Received(events=list(value))
    raise TypeError(
        "receive must return Received, a list of WebhookEvent, an HttpResponse or None, "
        f"not {type(value).__name__}"
    )


def _valid_events(source: WebhookSource, events: Any) -> tuple[list[WebhookEvent], bool]:
    """Events the source declares whose data passes the event's schema, and whether
    one had data that is not JSON."""
    kept = []
    unreadable = False
    for event in events:
        if event.name not in source.events:
            logger.info("Webhook %s: dropping undeclared event %r", source.name, event.name[:100])
            continue
        schema = source.events[event.name]
        if schema is not None:
            try:
                data = event.data  # the body's text is parsed here, if a schema needs it
            except ValueError as exc:
                logger.info("Webhook %s:%s: its data is not JSON: %s", source.name, event.name, exc)
                unreadable = True
                continue
            try:
                ok = schema(data)
            except (ValueError, TypeError, KeyError) as exc:
                ok = False
                logger.info("Webhook %s:%s failed its schema: %s", source.name, event.name, exc)
            if not ok:
                continue
        kept.append(event)
    return kept, unreadable


def _verify(
    source: WebhookSource, request: HttpRequest, body: bytes, state: SourceState
) -> VerifiedRequest | HttpResponse:
    """The verifier's result for a signed body, or the answer refusing it."""
    assert source.verify is not None
    if not state.secrets:
        logger.warning(
            "Webhook %s refused: credential %r has no value", source.name, source.credential
        )
        return _error(401, "webhook secret is not set")
    try:
        return source.verify.verify(request.headers, body, state.secrets, now=time.time())
    except MalformedSignatureError as exc:
        return _error(400, f"malformed signature: {exc}")
    except WebhookVerificationError as exc:
        logger.info("Webhook %s refused: %s", source.name, exc)
        return _error(401, "signature does not match")


def _not_found() -> JsonResponse:
    return _error(404, "no such webhook source")


@csrf_exempt
def webhook(request: HttpRequest, route: str) -> HttpResponse:
    """Answer one webhook request for the source declared at ``route``."""
    source = source_for_route(route)
    if source is None:
        return _not_found()
    using = router.db_for_write(TriggerSource)  # never a replica: the switch must be current
    # A kept state needs the gate, which runs where the events are stored.
    gated = using == pikku_settings.WORKFLOW_DATABASE
    state = source_state(source.name, source.credential, using, fresh=not gated)

    def fresh() -> SourceState:
        return source_state(source.name, source.credential, using, fresh=True)

    def if_still_on(answer: HttpResponse) -> HttpResponse:
        """``answer``, once a kept state is read afresh (404 if the source is now off)."""
        return answer if not state.cached or fresh().enabled else _not_found()

    if not state.enabled:  # never a kept state: only enabled ones are kept
        return _not_found()
    if request.method not in ("POST", "PUT", "GET", "HEAD"):
        return if_still_on(_error(405, "method not allowed"))
    if request.method == "HEAD":
        return if_still_on(HttpResponse(status=200))
    body = _read_body(request, int(pikku_settings.WEBHOOK_MAX_BODY))
    if body is None:
        return if_still_on(_error(413, "request body too large"))

    delivery_id = None
    verified = False
    if body:
        if source.verify is not None:
            outcome = _verify(source, request, body, state)
            if isinstance(outcome, HttpResponse) and state.cached:
                state = fresh()  # a secret may have been added since it was kept
                if not state.enabled:
                    return _not_found()
                outcome = _verify(source, request, body, state)
            if isinstance(outcome, HttpResponse):
                return outcome
            delivery_id = outcome.delivery_id
        verified = True  # a source that declares no verify accepts any body
    elif state.cached:  # receive answers a handshake itself: the switch must be known
        state = fresh()
        if not state.enabled:
            return _not_found()

    ctx = ReceiveContext(source=source, body=body, verified=verified, delivery_id=delivery_id)
    try:
        received = _as_received(source.receive(request, ctx))
    except (ValueError, KeyError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        logger.info("Webhook %s: receive refused the body: %s", source.name, exc)
        return if_still_on(_error(400, "the body could not be read"))
    if received.events and not verified:
        return _error(401, "events need a signed body")  # bodyless: the state is fresh

    valid, unreadable = _valid_events(source, received.events)
    rows = new_events(source, valid, delivery_id=delivery_id, body=body) if valid else []
    confirmed = not state.cached
    accepted = 0
    rechecks = 0
    index = 0
    while index < len(rows):
        try:
            stored = store_new_event(rows[index], gate=state.gate if gated else None)
        except SourceChanged:
            rechecks += 1
            state = fresh()
            if not state.enabled:
                logger.info("Webhook %s was disabled while its events were stored", source.name)
                return _not_found()
            if rechecks > MAX_RECHECKS:
                return _error(503, "the source kept changing; send the request again")
            if source.verify is not None:  # its secrets changed: verify again
                again = _verify(source, request, body, state)
                if isinstance(again, HttpResponse):
                    return again
            continue
        accepted += stored == "stored"
        if stored == "refused":  # a refused statement checked nothing
            unreadable = unreadable or not rows[index].data_checked
        else:
            confirmed = True
        index += 1
    if not confirmed:  # nothing was stored, so no gate confirmed the kept state
        state = fresh()
        if not state.enabled:
            return _not_found()
    if unreadable:
        return _error(400, "the body could not be read")
    if received.response is not None:
        return received.response
    return _received(accepted)


# The view commits each event itself, so it never runs inside ATOMIC_REQUESTS: a kept
# state needs a connection outside any transaction.
for _alias in settings.DATABASES:
    transaction.non_atomic_requests(using=_alias)(webhook)
