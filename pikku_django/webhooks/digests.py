"""Signed requests accepted once per source, by the digest of their signed bytes.

A scheme that signs no timestamp checked against a replay window (GitHub, Shopify,
SendGrid without one; see :attr:`~pikku_django.webhooks.verify.Verifier.replay_guard`)
gives nothing that tells a replay from a new delivery but the signed bytes: a
delivery id it sends beside them can be changed at will. The view stores such a
request's events together with the claim of its digest for the source
(:class:`~pikku_django.models.WebhookDigest`): on PostgreSQL a request's only event in
the same statement (:func:`~pikku_django.webhooks.sql.store_event`), otherwise in one
transaction (:func:`accepted_once`). So the digest is recorded exactly when its events
are: a request that stored nothing (refused, or the database went away) can be sent
again, and a replay of one that stored its events finds the digest and stores
nothing. Digests outlive the receipts ``pikku_prune`` deletes, for
``PIKKU["WEBHOOK_DIGEST_RETENTION"]``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import QuerySet

from pikku_django.conf import pikku_settings
from pikku_django.models import WebhookDigest
from pikku_django.workflows.durations import parse_duration

logger = logging.getLogger(__name__)

#: The claim statement by vendor, built on first use.
_claims: dict[str, str] = {}


def _claim_sql(connection: Any) -> str:
    """One INSERT that stores nothing when the source holds the digest already."""
    found = _claims.get(connection.vendor)
    if found is None:
        quote = connection.ops.quote_name
        meta = WebhookDigest._meta
        columns = {field.attname: field.column for field in meta.concrete_fields}
        source, digest, received = (
            quote(str(columns[name])) for name in ("source", "digest", "received_at")
        )
        into = f"INTO {quote(meta.db_table)} ({source}, {digest}, {received}) VALUES (%s, %s, %s)"
        if connection.vendor == "mysql":
            found = f"INSERT IGNORE {into}"
        else:
            found = f"INSERT {into} ON CONFLICT ({source}, {digest}) DO NOTHING"
        _claims[connection.vendor] = found
    return found


def claim_digest(using: str, source: str, digest: str, now: datetime) -> bool:
    """Record that ``source`` accepted the signed bytes of SHA-256 ``digest``: False
    when it had already (a concurrent claim waits for the other's transaction)."""
    connection = connections[using]
    params = [source, digest, connection.ops.adapt_datetimefield_value(now)]
    with connection.cursor() as cursor:
        cursor.execute(_claim_sql(connection), params)
        return bool(cursor.rowcount == 1)


@contextmanager
def accepted_once(source: str, digest: str | None) -> Iterator[bool]:
    """Whether to store a request's events: inside, in one transaction with the claim
    of its ``digest`` (None: no digest to claim, nothing wrapped), True unless
    ``source`` accepted those signed bytes before. Should the block raise, the claim
    is undone with whatever it stored."""
    if digest is None:
        yield True
        return
    from pikku_django.workflows.api import get_engine

    engine = get_engine()
    with transaction.atomic(using=engine.using):
        new = claim_digest(engine.using, source, digest, engine.clock.now())
        if not new:
            logger.info(
                "Webhook %s: these signed bytes (sha256:%s) were accepted before; "
                "not dispatched again",
                source,
                digest,
            )
        yield new


def digest_retention() -> float | None:
    """``PIKKU["WEBHOOK_DIGEST_RETENTION"]`` in seconds (None: kept for ever);
    ``ValueError`` saying what is wrong when it is not a duration above 0."""
    value = pikku_settings.WEBHOOK_DIGEST_RETENTION
    if value is None:
        return None
    seconds = parse_duration(value, what="PIKKU['WEBHOOK_DIGEST_RETENTION']")
    if seconds <= 0:
        raise ValueError("PIKKU['WEBHOOK_DIGEST_RETENTION'] must be more than 0, or None")
    return seconds


def expired_digests(using: str, now: datetime) -> QuerySet[WebhookDigest]:
    """The digests older than the retention (none when they are kept for ever)."""
    digests = WebhookDigest.objects.using(using).order_by()
    retention = digest_retention()
    if retention is None:
        return digests.none()
    return digests.filter(received_at__lt=now - timedelta(seconds=retention))
