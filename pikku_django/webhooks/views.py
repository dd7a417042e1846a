"""The view every webhook source's route goes to, in one line: route, source, switch
and secrets, verify, receive, store, answer.

Each stage either hands the next one what it needs or answers the request itself
(:class:`Answered`), most often with a refusal. A source's switch and secrets may
come from what the database connection kept from an earlier request
(:class:`~pikku_django.webhooks.state.RequestState`); an answer stands only once that
state is confirmed, by the gate of the statement that stores an event, or else by
reading it afresh (404 when the source is now off). While the database cannot be
reached the answer is 503: nothing was stored, so the sender delivers again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connections, router, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from pikku_django import signals
from pikku_django.conf import pikku_settings
from pikku_django.models import TriggerSource
from pikku_django.webhooks._send_events import NoRunForEventError
from pikku_django.webhooks.bodies import (
    BodyError,
    BodyNotJSONError,
    not_json_reason,
    note_unbounded_asgi,
)
from pikku_django.webhooks.credentials import UndecryptableCredentialError
from pikku_django.webhooks.digests import accepted_once
from pikku_django.webhooks.dispatch import new_events, refusal_reason, store_new_event
from pikku_django.webhooks.identifiers import UnusableIdentifierError
from pikku_django.webhooks.routes import unmatched
from pikku_django.webhooks.sources import (
    ReceiveContext,
    Received,
    WebhookEvent,
    WebhookSource,
    source_for_route,
)
from pikku_django.webhooks.sql import NewEvent, SourceChanged
from pikku_django.webhooks.state import RequestState, SourceOff
from pikku_django.webhooks.verify import (
    MalformedSignatureError,
    VerifiedRequest,
    WebhookVerificationError,
)

logger = logging.getLogger(__name__)

#: How many times one request re-reads a source that changed while its events were stored.
MAX_RECHECKS = 3
METHODS = ("POST", "PUT", "GET", "HEAD")
#: What receive may raise for a body it cannot read (answered 400).
UNREADABLE = (ValueError, KeyError, UnicodeDecodeError, json.JSONDecodeError, RecursionError)


class Answered(Exception):
    """A stage answers the request itself with ``response``: a refusal, or the empty
    200 of a HEAD."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _received(count: int) -> HttpResponse:
    """``{"received": count}``, as JsonResponse would write it."""
    return HttpResponse(b'{"received": %d}' % count, content_type="application/json")


def _unreadable(reason: BaseException | None = None) -> Answered:
    if isinstance(reason, BodyError):  # says why: a bound, NaN, plain text, a form...
        return Answered(_error(400, f"the body could not be read: {reason}"))
    return Answered(_error(400, "the body could not be read"))


def _why_unreadable(exc: BaseException, body: bytes) -> BaseException:
    """What ``receive`` raised, or, when it failed to parse the body as JSON itself,
    why the body is not JSON."""
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        reason = not_json_reason(body)
        if reason is not None:
            return BodyNotJSONError(reason)
    return exc


def _unreachable_errors() -> tuple[type[Exception], ...]:
    """Django's connection errors, and the drivers' own for statements pikku_django runs
    on the driver's cursor (which Django does not wrap)."""
    errors: list[type[Exception]] = [OperationalError, InterfaceError]
    with contextlib.suppress(ImportError):
        import psycopg

        errors += [psycopg.OperationalError, psycopg.InterfaceError]
    with contextlib.suppress(ImportError):
        import MySQLdb

        errors += [MySQLdb.OperationalError, MySQLdb.InterfaceError]
    return tuple(errors)


#: What a request answers 503 for: the database could not be reached.
UNREACHABLE = _unreachable_errors()


@csrf_exempt
def webhook(request: HttpRequest, route: str) -> HttpResponse:
    """Answer one webhook request for the source declared at ``route``."""
    note_unbounded_asgi(request)
    source = source_for_route(route)
    if source is None:
        return unmatched(request, route)
    answer = _webhook(request, source)
    signals.send(
        signals.webhook_received,
        type(source),
        source=source.name,
        status_code=answer.status_code,
    )
    return answer


def _webhook(request: HttpRequest, source: WebhookSource) -> HttpResponse:
    using = router.db_for_write(TriggerSource)  # never a replica: the switch must be current
    try:
        state = RequestState(
            source.name,
            source.credential,
            using,
            gated=using == pikku_settings.WORKFLOW_DATABASE,  # the gate runs where events go
        )
        try:
            answer = _answer(request, source, state)
        except Answered as early:
            answer = early.response
        state.confirm()
    except SourceOff:
        return _error(404, "no such webhook source")
    except UNREACHABLE as exc:
        return _unavailable(source, using, exc)
    except UndecryptableCredentialError as exc:
        return _undecryptable(source, exc)
    return answer


def _answer(request: HttpRequest, source: WebhookSource, state: RequestState) -> HttpResponse:
    """Verify, receive and store one request to an enabled source."""
    body = _read_body(request)
    verified = _verify(source, request, body, state)
    ctx = ReceiveContext(
        source=source,
        body=body,
        verified=verified is not None,
        delivery_id=verified.delivery_id if verified else None,
    )
    received = _receive(source, request, ctx)
    digest = verified.replay_digest if verified is not None else None
    accepted = _store(source, request, ctx, received.events, state, digest=digest)
    return received.response if received.response is not None else _received(accepted)


def _read_body(request: HttpRequest) -> bytes:
    """The raw body, read once; refused for a method no source answers, or when it is
    larger than ``PIKKU["WEBHOOK_MAX_BODY"]``."""
    if request.method not in METHODS:
        raise Answered(_error(405, "method not allowed"))
    if request.method == "HEAD":
        raise Answered(HttpResponse(status=200))
    limit = int(pikku_settings.WEBHOOK_MAX_BODY)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    body = b"" if declared > limit else request.read(limit + 1)
    if declared > limit or len(body) > limit:
        raise Answered(_error(413, "request body too large"))
    return body


def _verify(
    source: WebhookSource, request: HttpRequest, body: bytes, state: RequestState
) -> VerifiedRequest | None:
    """What verifying a signed body learnt (None for a body that needs none).

    A refusal on a kept state is checked again on a fresh one, as a secret may have
    been added since; a request without a body is answered on a fresh state.
    """
    if not body:  # receive answers a handshake itself: the switch must be known
        state.confirm()
        return None
    if source.verify is None:  # a source that declares no verify accepts any body
        return VerifiedRequest()
    try:
        return _check_signature(source, request, body, state)
    except Answered:
        if not state.confirm():
            raise
    return _check_signature(source, request, body, state)


def _check_signature(
    source: WebhookSource, request: HttpRequest, body: bytes, state: RequestState
) -> VerifiedRequest:
    if not state.secrets:
        logger.warning(
            "Webhook %s refused: credential %r has no value", source.name, source.credential
        )
        raise Answered(_error(401, "webhook secret is not set"))
    try:
        verified: VerifiedRequest = source.verify.verify(
            request.headers, body, state.secrets, now=time.time()
        )
        return verified
    except MalformedSignatureError as exc:
        raise Answered(_error(400, f"malformed signature: {exc}")) from None
    except WebhookVerificationError as exc:
        logger.info("Webhook %s refused: %s", source.name, exc)
        raise Answered(_error(401, "signature does not match")) from None


def _receive(source: WebhookSource, request: HttpRequest, ctx: ReceiveContext) -> Received:
    """What the source's ``receive`` made of the request."""
    try:
        value = source.receive(request, ctx)
    except UNREADABLE as exc:
        reason = _why_unreadable(exc, ctx.body)
        logger.info("Webhook %s: receive refused the body: %s", source.name, reason)
        raise _unreadable(reason) from None
    received = _as_received(value)
    if received.events and not ctx.verified:
        raise Answered(_error(401, "events need a signed body"))
    return received


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


def _valid_events(source: WebhookSource, events: Any) -> tuple[list[WebhookEvent], Any]:
    """Events the source declares whose data passes the event's schema, and why one
    had data that could not be read (None when all could)."""
    kept = []
    unreadable = None
    for event in events:
        if event.name not in source.events:
            logger.info("Webhook %s: dropping undeclared event %r", source.name, event.name[:100])
            continue
        schema = source.events[event.name]
        if schema is not None:
            try:
                data = event.data  # the body's text is parsed here, if a schema needs it
            except (ValueError, RecursionError) as exc:
                logger.info("Webhook %s:%s: its data is not JSON: %s", source.name, event.name, exc)
                unreadable = unreadable or exc
                continue
            try:
                ok = schema(data)
            except (ValueError, TypeError, KeyError, RecursionError) as exc:
                ok = False
                logger.info("Webhook %s:%s failed its schema: %s", source.name, event.name, exc)
            if not ok:
                continue
        kept.append(event)
    return kept, unreadable


def _store(
    source: WebhookSource,
    request: HttpRequest,
    ctx: ReceiveContext,
    events: Any,
    state: RequestState,
    *,
    digest: str | None = None,
) -> int:
    """Store each valid event with its receipt; how many were new.

    With ``digest`` (a scheme whose replays only the signed bytes tell apart), the
    events are stored together with its claim for the source, and none when the
    source accepted those bytes before: a replay is answered as a redelivery. One
    event claims it in its own store; several, in one transaction.
    """
    valid, unreadable = _valid_events(source, events)
    try:
        rows: list[NewEvent] = (
            new_events(source, valid, delivery_id=ctx.delivery_id, body=ctx.body) if valid else []
        )
    except UnusableIdentifierError as exc:
        raise _unusable_id(source, exc) from None
    if len(rows) < 2:
        accepted, refused = _store_rows(source, request, ctx, rows, state, digest=digest)
    else:
        accepted, refused = _store_together(source, request, ctx, rows, state, digest)
    unreadable = unreadable or refused
    if unreadable:
        raise _unreadable(unreadable)
    return accepted


def _store_together(
    source: WebhookSource,
    request: HttpRequest,
    ctx: ReceiveContext,
    rows: list[NewEvent],
    state: RequestState,
    digest: str | None,
) -> tuple[int, BodyNotJSONError | None]:
    """:func:`_store_rows` in one transaction with the claim of ``digest`` (when
    given); should the source change, outside it, and then all the rows again."""
    changes = 0
    while True:
        try:
            with accepted_once(source.name, digest) as new:
                if not new:
                    return 0, None
                return _store_rows(source, request, ctx, rows, state, atomic=digest is not None)
        except SourceChanged:  # out of the transaction, which took back what it stored
            changes += 1
            _source_changed(source, request, ctx, state, changes)


def _store_rows(
    source: WebhookSource,
    request: HttpRequest,
    ctx: ReceiveContext,
    rows: list[NewEvent],
    state: RequestState,
    *,
    atomic: bool = False,
    digest: str | None = None,
) -> tuple[int, BodyNotJSONError | None]:
    """Store each row: how many were new, and why the database refused unchecked
    data (None when it refused none). Each store is gated on a kept state; should the
    source change meanwhile, it is read again (404 when now off) and the request
    verified again before storing on (``atomic``: rows stored in one transaction leave
    it first, with ``SourceChanged``, so the state is read outside it and the rows
    stored again). ``digest`` is claimed by the store of a request's only row.
    """
    accepted = 0
    refused: BodyNotJSONError | None = None
    changes = 0
    index = 0
    while index < len(rows):
        try:
            outcome = store_new_event(rows[index], gate=state.gate, digest=digest)
        except UnusableIdentifierError as exc:
            raise _unusable_id(source, exc) from None
        except NoRunForEventError as exc:
            logger.warning("%s; answered 409, nothing stored", exc)
            raise Answered(_error(409, "no run waits for this event; send it again later")) from exc
        except SourceChanged:
            if atomic:
                raise
            changes += 1
            _source_changed(source, request, ctx, state, changes)
            continue
        if outcome == "refused":  # a refused statement checked nothing
            if not rows[index].data_checked:
                refused = refused or BodyNotJSONError(refusal_reason(rows[index]))
        else:
            state.confirmed()
        accepted += outcome == "stored"
        index += 1
    return accepted, refused


def _unusable_id(source: WebhookSource, exc: UnusableIdentifierError) -> Answered:
    """400 for an id from the body that may not be stored or logged (as a header's)."""
    logger.info("Webhook %s refused: %s", source.name, exc)
    return Answered(_error(400, str(exc)))


def _source_changed(
    source: WebhookSource,
    request: HttpRequest,
    ctx: ReceiveContext,
    state: RequestState,
    changes: int,
) -> None:
    """Read a source that changed during a store afresh, and verify the request again."""
    try:
        state.reread()
    except SourceOff:
        logger.info("Webhook %s was disabled while its events were stored", source.name)
        raise
    if changes > MAX_RECHECKS:
        raise Answered(_error(503, "the source kept changing; send the request again"))
    if source.verify is not None:  # its secrets changed: verify again
        _check_signature(source, request, ctx.body, state)


def _unavailable(source: WebhookSource, using: str, exc: Exception) -> HttpResponse:
    """503 while the database cannot be reached: nothing stored, the sender retries."""
    logger.warning("Webhook %s: the database is unreachable (503): %s", source.name, exc)
    for alias in {using, pikku_settings.WORKFLOW_DATABASE}:
        connections[alias].close_if_unusable_or_obsolete()  # the next request reconnects
    return _error(503, "the database is unreachable; send the request again later")


def _undecryptable(source: WebhookSource, exc: UndecryptableCredentialError) -> HttpResponse:
    """503 while a stored secret cannot be decrypted: a setting to fix, not the sender's
    fault; nothing stored, the sender retries."""
    logger.error("Webhook %s refused (503): %s", source.name, exc)
    return _error(503, "the webhook secret cannot be decrypted; send the request again later")


# The view commits each event itself, so it never runs inside ATOMIC_REQUESTS: a kept
# state needs a connection outside any transaction.
for _alias in settings.DATABASES:
    transaction.non_atomic_requests(using=_alias)(webhook)
