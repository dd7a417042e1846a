"""The workflow engine's vendor-specific SQL: waking idle workers on PostgreSQL."""

from __future__ import annotations

from django.db import connections

#: The PostgreSQL channel that new work is announced on.
CHANNEL = "pikku_work"


def notify_work(using: str) -> None:
    """Announce new work (delivered when the current transaction commits)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])


def listen_sql() -> str:
    return f"LISTEN {CHANNEL}"
