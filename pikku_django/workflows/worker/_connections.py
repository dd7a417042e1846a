"""What a worker thread does with its database connections after a unit of work."""

from __future__ import annotations

from django.db import connections


def release_connections() -> None:
    """Close this thread's connections that are broken or past a positive ``CONN_MAX_AGE``.

    Django's ``close_old_connections()`` closes a connection whose ``CONN_MAX_AGE`` is 0
    every time, which in a worker means after every pass or step, losing the connection
    set-up and its prepared statements. A worker thread is one long unit of work, not a
    request: it keeps such a connection until it becomes unusable. ``CONN_MAX_AGE`` of
    ``None`` or above 0 behaves as in Django.
    """
    for conn in connections.all(initialized_only=True):
        if conn.settings_dict.get("CONN_MAX_AGE") == 0:
            conn.close_at = None  # set again on the next connect
        conn.close_if_unusable_or_obsolete()
