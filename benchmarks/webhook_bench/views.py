"""The baselines of ``benchmarks/webhooks.py``: what a careful user would write by hand.

* ``raw``: the floor. The GitHub signature checked with ``hmac`` + ``compare_digest``,
  then one prepared ``INSERT`` of the body under its unique delivery id, on a raw
  driver connection of the thread's own in autocommit (psycopg with ``prepare=True``;
  sqlite3, which keeps its statements prepared).
* ``notify`` (PostgreSQL): ``raw`` plus a ``pg_notify`` to wake workers, in one
  transaction: what waking a worker at once costs, since PostgreSQL serialises the
  commits of transactions that notify.
* ``defer``: the signature checked the same way, then, in one transaction, the row
  written through the ORM and a Procrastinate job deferred for it (its Django
  integration defers on Django's connection, so both commit or neither does).
  PostgreSQL only.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from webhook_bench.models import RawDelivery

_local = threading.local()
TABLE = RawDelivery._meta.db_table
PG_INSERT = (
    f"INSERT INTO {TABLE} (delivery, body) VALUES (%s, %s) ON CONFLICT (delivery) DO NOTHING"
)
PG_NOTIFY = "SELECT pg_notify('pikku_bench_webhook', '')"
SQLITE_INSERT = (
    f"INSERT INTO {TABLE} (delivery, body) VALUES (?, ?) ON CONFLICT (delivery) DO NOTHING"
)


def signed(request: HttpRequest) -> bool:
    """Whether X-Hub-Signature-256 is the HMAC-SHA256 of the body under the secret."""
    header = request.headers.get("X-Hub-Signature-256", "")
    if not header.startswith("sha256="):
        return False
    try:
        given = bytes.fromhex(header[7:])
    except ValueError:
        return False
    key = settings.BENCH_WEBHOOK_SECRET.encode()
    return hmac.compare_digest(hmac.new(key, request.body, hashlib.sha256).digest(), given)


def _raw_connection() -> Any:
    conn = getattr(_local, "conn", None)
    if conn is None:
        db = settings.DATABASES["default"]
        if connection.vendor == "postgresql":
            import psycopg

            params = {k.lower(): db[k] for k in ("HOST", "PORT", "USER", "PASSWORD") if db.get(k)}
            conn = psycopg.connect(dbname=db["NAME"], autocommit=True, **params)
        else:
            import sqlite3

            conn = sqlite3.connect(db["NAME"], timeout=20, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
        _local.conn = conn
    return conn


def close_raw_connection() -> None:
    """Close this thread's raw connection, if it opened one."""
    conn = getattr(_local, "conn", None)
    if conn is not None:
        conn.close()
        _local.conn = None


@csrf_exempt
def raw(request: HttpRequest) -> HttpResponse:
    if not signed(request):
        return JsonResponse({"error": "bad signature"}, status=401)
    delivery = request.headers.get("X-GitHub-Delivery", "")
    conn = _raw_connection()
    if connection.vendor == "postgresql":
        conn.execute(PG_INSERT, (delivery, request.body), prepare=True)
    else:
        conn.execute(SQLITE_INSERT, (delivery, request.body))
    return JsonResponse({"received": 1})


@csrf_exempt
def notify(request: HttpRequest) -> HttpResponse:
    if not signed(request):
        return JsonResponse({"error": "bad signature"}, status=401)
    delivery = request.headers.get("X-GitHub-Delivery", "")
    conn = _raw_connection()
    with conn.transaction():
        conn.execute(PG_INSERT, (delivery, request.body), prepare=True)
        conn.execute(PG_NOTIFY, prepare=True)
    return JsonResponse({"received": 1})


@csrf_exempt
def defer(request: HttpRequest) -> HttpResponse:
    from webhook_bench.tasks import handle_delivery

    if not signed(request):
        return JsonResponse({"error": "bad signature"}, status=401)
    delivery = request.headers.get("X-GitHub-Delivery", "")
    with transaction.atomic():
        RawDelivery.objects.create(delivery=delivery, body=request.body)
        handle_delivery.defer(delivery=delivery)
    return JsonResponse({"received": 1})
