"""A webhook source's switch and secrets as a request sees them.

With ``PIKKU["WEBHOOK_STATE_CACHE"]`` (on by default), an enabled source's state is
kept on the database connection between requests instead of being read on each:

* PostgreSQL: the connection listens on
  :data:`~pikku_django.webhooks.sql.SOURCES_CHANNEL`, which a trigger notifies
  whenever a source's row or a credential value changes, and drops what it keeps when
  a notification arrives. Such a state is marked ``cached``: the view has it
  confirmed by the database before its answer stands, through the gate of the
  statement that stores the request's events, or by reading it afresh.
* SQLite: what is kept holds while nothing has changed in the database since it was
  read: no other connection committed (``PRAGMA data_version``) and this one changed
  no row (``total_changes``) but through :func:`own_writes`. That is exact, so such a
  state needs no confirmation.

Only enabled sources are kept, so a 404 is always answered from a fresh read. Other
databases, and a connection inside a transaction, read the state on every request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from pikku_django.conf import pikku_settings
from pikku_django.prepared import fetch
from pikku_django.webhooks.credentials import configured_values, decrypt_cached
from pikku_django.webhooks.sql import SOURCES_CHANNEL, Gate, fingerprint_of, read_source_state

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceState:
    """A source's switch (None: no row, an unknown source) and its credential's values.

    ``secrets`` are the values from settings, then the stored ones newest first.
    ``gate`` is what a stored event is checked against; ``cached`` says the state
    was kept from an earlier request and has not been confirmed since.
    """

    enabled: bool | None
    secrets: list[str]
    gate: Gate
    cached: bool = False


@dataclass
class _Kept:
    """What one connection keeps: states by (source, credential); on SQLite, with the
    ``(data_version, total_changes)`` they hold for."""

    states: dict[tuple[str, str], SourceState] = field(default_factory=dict)
    generation: int = 0
    exact: bool = False
    token: tuple[int, int] | None = None

    def on_notify(self, notify: Any) -> None:
        if notify.channel == SOURCES_CHANNEL:
            self.states.clear()
            self.generation += 1


def _kept_on(connection: Any) -> _Kept | None:
    """What Django's ``connection`` keeps for its current driver connection."""
    found = getattr(connection, "_pikku_kept", None)
    return found[1] if found is not None and found[0] is connection.connection else None


def _keep_on(connection: Any, kept: _Kept | None) -> None:
    connection._pikku_kept = None if kept is None else (connection.connection, kept)


def source_state(
    source: str, credential: str | None, using: str = "default", *, fresh: bool = False
) -> SourceState:
    """``source``'s state for a request on ``using``: kept, or read (``fresh`` always reads)."""
    credential = credential or ""
    kept = _kept_for(using)
    if kept is not None and not fresh:
        found = kept.states.get((source, credential))
        if found is not None:
            return found
    generation = kept.generation if kept is not None else 0
    enabled, ciphertexts = read_source_state(using, source, credential)
    secrets = configured_values(credential) if credential else []
    secrets += [decrypt_cached(token) for token in reversed(ciphertexts)]
    state = SourceState(enabled, secrets, Gate(source, credential, fingerprint_of(ciphertexts)))
    if kept is not None:
        if enabled and kept.generation == generation:
            kept.states[(source, credential)] = SourceState(
                enabled, secrets, state.gate, cached=not kept.exact
            )
        else:  # switched off (or changed again) since it was kept: keep nothing
            kept.states.pop((source, credential), None)
    return state


def _kept_for(using: str) -> _Kept | None:
    """The states ``using``'s connection keeps, or None when it keeps none.

    Only with the setting on, outside a transaction (a LISTEN inside one would only
    count from its commit), on SQLite, or on PostgreSQL (psycopg 3) when the
    connection outlives the request (``CONN_MAX_AGE`` or a pool). PostgreSQL takes in
    the notifications already received first, and LISTENs on a connection's first
    call; SQLite drops what it keeps when the database changed since.
    """
    if not pikku_settings.WEBHOOK_STATE_CACHE:
        return None
    connection = connections[using]
    vendor = connection.vendor
    if vendor == "sqlite":
        if connection.in_atomic_block or not connection.get_autocommit():
            return None
        return _kept_on_sqlite(connection)
    if vendor != "postgresql":
        return None
    if connection.settings_dict.get("CONN_MAX_AGE") == 0 and not getattr(connection, "pool", None):
        return None  # a new connection every request: keeping would cost a LISTEN each
    if connection.in_atomic_block or not connection.get_autocommit():  # connects if need be
        return None
    raw = connection.connection
    if not hasattr(raw, "add_notify_handler"):  # psycopg2
        return None
    kept = _kept_on(connection)
    if kept is not None:
        try:
            _take_notifications(raw)
        except Exception:  # the connection broke: read instead, and let that report it
            logger.debug("Reading notifications failed; the state is read", exc_info=True)
            _keep_on(connection, None)
            return None
        return kept
    kept = _Kept()
    with connection.wrap_database_errors:
        raw.execute(f"LISTEN {SOURCES_CHANNEL}")
    raw.add_notify_handler(kept.on_notify)
    _keep_on(connection, kept)
    return kept


def _kept_on_sqlite(connection: Any) -> _Kept:
    raw = connection.connection
    kept = _kept_on(connection)
    if kept is None:
        kept = _Kept(exact=True)
        _keep_on(connection, kept)
    token = (fetch(connection.alias, "PRAGMA data_version", [])[0][0], raw.total_changes)
    if token != kept.token:
        kept.states.clear()
        kept.generation += 1
        kept.token = token
    return kept


@contextmanager
def own_writes(using: str) -> Iterator[None]:
    """Rows written inside are none of a source's state: on SQLite, what ``using``'s
    connection keeps stays kept across them (when nothing else changed first)."""
    connection = connections[using]
    kept = _kept_on(connection) if connection.vendor == "sqlite" else None
    raw = connection.connection
    before = raw.total_changes if kept is not None else None
    yield
    if kept is not None and kept.token is not None and kept.token[1] == before:
        kept.token = (kept.token[0], raw.total_changes)


def _take_notifications(raw: Any) -> None:
    """Hand notifications already received on ``raw`` to its handlers, without waiting."""
    pgconn = raw.pgconn
    pgconn.consume_input()
    while (notify := pgconn.notifies()) is not None:
        if pgconn.notify_handler is not None:
            pgconn.notify_handler(notify)
