"""The view every webhook source's route goes to: verify first, then receive."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from pikku_django.conf import pikku_settings
from pikku_django.webhooks.credentials import source_state
from pikku_django.webhooks.sources import (
    ReceiveContext,
    Received,
    WebhookEvent,
    WebhookSource,
    source_for_route,
)
from pikku_django.webhooks.verify import (
    MalformedSignatureError,
    WebhookVerificationError,
)

logger = logging.getLogger(__name__)


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


def _valid_events(source: WebhookSource, events: Any) -> list[WebhookEvent]:
    """Events the source declares whose data passes the event's schema."""
    kept = []
    for event in events:
        if event.name not in source.events:
            logger.info("Webhook %s: dropping undeclared event %r", source.name, event.name[:100])
            continue
        schema = source.events[event.name]
        if schema is not None:
            try:
                ok = schema(event.data)
            except (ValueError, TypeError, KeyError) as exc:
                ok = False
                logger.info("Webhook %s:%s failed its schema: %s", source.name, event.name, exc)
            if not ok:
                continue
        kept.append(event)
    return kept


@csrf_exempt
def webhook(request: HttpRequest, route: str) -> HttpResponse:
    """Answer one webhook request for the source declared at ``route``."""
    from pikku_django.webhooks.dispatch import accept_events

    source = source_for_route(route)
    if source is None:
        return _error(404, "no such webhook source")
    enabled, secrets = source_state(source.name, source.credential)
    if not enabled:
        return _error(404, "no such webhook source")
    if request.method == "HEAD":
        return HttpResponse(status=200)
    if request.method not in ("POST", "PUT", "GET"):
        return _error(405, "method not allowed")
    body = _read_body(request, int(pikku_settings.WEBHOOK_MAX_BODY))
    if body is None:
        return _error(413, "request body too large")

    delivery_id = None
    verified = False
    if body:
        if source.verify is not None:
            if not secrets:
                logger.warning(
                    "Webhook %s refused: credential %r has no value",
                    source.name,
                    source.credential,
                )
                return _error(401, "webhook secret is not set")
            try:
                result = source.verify.verify(request.headers, body, secrets, now=time.time())
            except MalformedSignatureError as exc:
                return _error(400, f"malformed signature: {exc}")
            except WebhookVerificationError as exc:
                logger.info("Webhook %s refused: %s", source.name, exc)
                return _error(401, "signature does not match")
            delivery_id = result.delivery_id
            verified = True
        else:
            verified = True  # a source that declares no verify accepts any body

    ctx = ReceiveContext(source=source, body=body, verified=verified, delivery_id=delivery_id)
    try:
        received = _as_received(source.receive(request, ctx))
    except (ValueError, KeyError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        logger.info("Webhook %s: receive refused the body: %s", source.name, exc)
        return _error(400, "the body could not be read")
    accepted = 0
    if received.events:
        if not verified:
            return _error(401, "events need a signed body")
        accepted = accept_events(
            source, _valid_events(source, received.events), delivery_id=delivery_id, body=body
        )
    if received.response is not None:
        return received.response
    return _received(accepted)
