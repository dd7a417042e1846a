"""Turning accepted events into durable work: the request stores each event as its
receipt, and a worker starts the event's workflow run from it."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Literal

from django.db import DatabaseError, DataError, transaction

from pikku_django.conf import pikku_settings
from pikku_django.models import WebhookReceipt
from pikku_django.models.fields import UnreadableJSON
from pikku_django.wakeups import RECEIPTS_WAITING, announcer, notifies
from pikku_django.webhooks.bodies import not_json_reason
from pikku_django.webhooks.digests import accepted_once
from pikku_django.webhooks.identifiers import check_identifier
from pikku_django.webhooks.sources import WebhookEvent, WebhookSource, event_json, handler_for
from pikku_django.webhooks.sql import (
    Gate,
    NewEvent,
    claims_digest_with_receipt,
    idempotency_key,
    store_event,
)
from pikku_django.workflows._dberrors import is_transient
from pikku_django.workflows.registry import get_step, step, workflow
from pikku_django.workflows.store import NewRun
from pikku_django.workflows.worker.intake import RunStarter, register_intake

logger = logging.getLogger(__name__)


def _passing(exc: BaseException) -> bool:
    """Whether ``exc`` passes by itself (a lost connection, a deadlock): the worker's
    next look tries again, and nothing is set aside for it."""
    if isinstance(exc, DatabaseError):
        return is_transient(exc)
    # The drivers' own, from statements run on the driver's cursor.
    return type(exc).__module__.startswith(("psycopg", "MySQLdb")) and type(exc).__name__ in (
        "OperationalError",
        "InterfaceError",
    )


#: The workflow that runs a function handler as a retried step on a worker.
DISPATCH_WORKFLOW = "pikku.webhooks.dispatch"
CALL_HANDLER = "pikku.webhooks.call_handler"

#: Event data as it is stored: plain JSON, no NaN or infinity.
_encode = json.JSONEncoder(allow_nan=False).encode


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
    """The de-duplication id: the event's own, the delivery's, or a hash of the body.

    An event id breaking the identifier rule raises :class:`UnusableIdentifierError`.
    """
    if event.id:
        return check_identifier(event.id, f"the id of event {event.name!r}")
    if delivery_id:
        return str(delivery_id)[:255]
    return "sha256:" + hashlib.sha256(body).hexdigest()


def new_events(
    source: WebhookSource, events: list[WebhookEvent], *, delivery_id: str | None, body: bytes
) -> list[NewEvent]:
    """The rows to store for ``events``: those with a handler and JSON data."""
    rows = []
    for event in events:
        handler = handler_for(source.name, event.name)
        if handler is None:
            continue
        provider_id = provider_id_for(event, delivery_id, body)
        text = event_json(event)
        data_json: str | None
        try:
            if text is not None:
                data_json, checked = text
            else:
                data_json, checked = None if event.data is None else _encode(event.data), True
        except (TypeError, ValueError):
            logger.warning(
                "Webhook %s:%s %s: its data is not JSON; dropped",
                source.name,
                event.name,
                provider_id,
            )
            continue
        rows.append(
            NewEvent(
                source=source.name,
                event=event.name,
                provider_id=provider_id,
                data_json=data_json,
                workflow=handler.workflow if handler.workflow is not None else DISPATCH_WORKFLOW,
                handler=handler.step if handler.workflow is None else None,
                data_checked=checked,
            )
        )
    return rows


#: What :func:`store_new_event` did: stored it, found it stored already, or the
#: database refused its data (nothing stored, nothing checked).
Outcome = Literal["stored", "redelivery", "refused"]


def store_new_event(
    new: NewEvent, *, gate: Gate | None = None, digest: str | None = None
) -> Outcome:
    """Store one event with its receipt, for a worker to start its run.

    With ``gate``: :class:`~pikku_django.webhooks.sql.SourceChanged`, nothing stored,
    when the source no longer matches it. With ``digest`` (the request's only event),
    the event is stored together with the claim of that digest for its source, and
    is a redelivery when the source accepted those signed bytes before.
    """
    from pikku_django.workflows.api import get_engine

    engine = get_engine()
    # Workers are notified where the database carries notifications; elsewhere they poll.
    notify = bool(pikku_settings.WORKER_NOTIFY) and notifies(engine.using)
    handler = handler_for(new.source, new.event)
    binding = handler.send if handler is not None else None
    if digest is not None and (binding is not None or not claims_digest_with_receipt(engine.using)):
        # The claim and the store in one transaction (one statement on PostgreSQL).
        with accepted_once(new.source, digest) as fresh:
            return store_new_event(new, gate=gate) if fresh else "redelivery"
    now = engine.clock.now()
    try:
        if binding is not None:
            from pikku_django.webhooks._send_events import store_and_send

            stored = store_and_send(engine, new, binding, gate=gate, now=now)
        else:
            # A busy process announces one receipt in a window and the rest after it.
            inline = notify and announcer.inline(engine.using, RECEIPTS_WAITING)
            stored = store_event(
                engine.using, new, notify=inline, gate=gate, now=now, digest=digest
            )
            if stored and notify and not inline:
                announcer.after_commit(engine.using, RECEIPTS_WAITING)
        if stored:
            return "stored"
    except DataError as exc:  # e.g. PostgreSQL refuses \u0000 in JSON text
        logger.warning(
            "Webhook %s:%s %s: %s; dropped (%s)",
            new.source,
            new.event,
            new.provider_id,
            refusal_reason(new),
            exc,
        )
        return "refused"
    logger.info(
        "Webhook %s:%s %s was already received; not dispatched again",
        new.source,
        new.event,
        new.provider_id,
    )
    return "redelivery"


def refusal_reason(new: NewEvent) -> str:
    """Why the database refused ``new``'s data: what is wrong with its text, else that
    the database cannot store it (such as PostgreSQL and a NUL character)."""
    reason = None if new.data_json is None else not_json_reason(new.data_json)
    return reason or "the database cannot store its data as JSON"


def waiting_receipts(engine: RunStarter) -> Any:
    """The receipts whose run a worker has yet to start (not those set aside)."""
    return WebhookReceipt.objects.using(engine.using).waiting()


def start_waiting_runs(engine: RunStarter, limit: int = 100) -> int:
    """Start the run of each stored event still waiting for one, oldest first (at most
    ``limit``): how many receipts were dealt with (their run started, or set aside).

    The receipts are locked (those another worker is starting are skipped), their
    runs created by the engine, and each receipt linked to its run with its input
    moved to the run, in one transaction. Should a run with the event's idempotency
    key exist already, the receipt is linked to it instead. A receipt whose input
    cannot be read back, or whose run cannot be created, is set aside with the reason
    (:func:`set_aside`) and the others start all the same.
    """
    if not waiting_receipts(engine).exists():  # the usual answer, without a transaction
        return 0
    try:
        return _start_batch(engine, limit, one_by_one=False)
    except Exception as exc:
        if _passing(exc):
            raise
        # One receipt's run could not be created: find which.
        logger.warning(
            "Starting the runs of stored webhook events failed (%s); starting them one by one",
            exc,
        )
        return _start_batch(engine, limit, one_by_one=True)


def _start_batch(engine: RunStarter, limit: int, *, one_by_one: bool) -> int:
    with engine.store.claims_serialised(), engine.store.atomic():
        waiting = list(
            waiting_receipts(engine)
            .order_by("id")
            .select_for_update(skip_locked=True)
            .only("id", "source", "event", "provider_id", "workflow", "input")[:limit]
        )
        if not waiting:
            return 0
        aside = [r for r in waiting if isinstance(r.input, UnreadableJSON)]
        for receipt in aside:
            set_aside(receipt, f"its input cannot be read back: {receipt.input.reason}")
        readable = [r for r in waiting if not isinstance(r.input, UnreadableJSON)]
        if one_by_one:
            started = []
            for receipt in readable:
                try:
                    with transaction.atomic(using=engine.using):  # a savepoint each
                        receipt.run_id = _create_runs(engine, [receipt])[0]
                    started.append(receipt)
                except Exception as exc:
                    if _passing(exc):
                        raise
                    set_aside(receipt, f"its run could not be created: {exc}")
                    aside.append(receipt)
        else:
            started = readable
            for receipt, run_id in zip(readable, _create_runs(engine, readable), strict=True):
                receipt.run_id = run_id
        for receipt in started:
            receipt.input = None
        if started:
            WebhookReceipt.objects.using(engine.using).bulk_update(started, ["run", "input"])
        if aside:
            WebhookReceipt.objects.using(engine.using).bulk_update(aside, ["set_aside"])
    for receipt in aside:
        logger.error(
            "Webhook %s:%s %s set aside, its run not started: %s",
            receipt.source,
            receipt.event,
            receipt.provider_id,
            receipt.set_aside,
        )
    if started:
        logger.info("Started the runs of %d stored webhook event(s)", len(started))
    return len(waiting)


def _create_runs(engine: RunStarter, receipts: list[WebhookReceipt]) -> list[Any]:
    """Create the runs of ``receipts`` (or find those their keys already name)."""
    if not receipts:
        return []
    return engine.create_runs(
        [
            NewRun(r.workflow, r.input, idempotency_key(r.source, r.event, r.provider_id))
            for r in receipts
        ]
    )


def set_aside(receipt: WebhookReceipt, reason: str) -> None:
    """Mark ``receipt`` as set aside for ``reason`` (saved and logged by the caller):
    its run is not started, it keeps its input, and the admin shows it and may delete
    it."""
    limit = WebhookReceipt._meta.get_field("set_aside").max_length or 500
    receipt.set_aside = reason if len(reason) <= limit else reason[: limit - 3] + "..."


class ReceiptIntake:
    """Stored webhook events, as a source of new runs for the worker."""

    name = "pikku.webhooks"
    notify_payload: str | None = RECEIPTS_WAITING

    def start_waiting(self, engine: RunStarter, limit: int) -> int:
        return start_waiting_runs(engine, limit)

    def has_waiting(self, engine: RunStarter) -> bool:
        return bool(waiting_receipts(engine).exists())


def register() -> None:
    """Make workers start the runs of stored webhook events (from the AppConfig)."""
    register_intake(ReceiptIntake())


def accept_events(
    source: WebhookSource,
    events: list[WebhookEvent],
    *,
    delivery_id: str | None,
    body: bytes,
) -> int:
    """Store each new event with its receipt, for a worker to start its run; how many
    were new.

    A redelivered event (same source, event and provider id) is not stored or
    dispatched again.
    """
    rows = new_events(source, events, delivery_id=delivery_id, body=body)
    return sum(store_new_event(new) == "stored" for new in rows)
