"""A webhook source's switch and secrets as a request sees them.

Where the database can notify (with ``PIKKU["WEBHOOK_STATE_CACHE"]``, on by default)
an enabled source's state is kept on the database connection between requests. The
connection listens on :data:`~pikku_django.wakeups.SOURCES_CHANNEL`, which a trigger
notifies whenever a source's row or a credential value changes, and drops what it
keeps when a notification arrives. A state taken from there is marked ``cached``:
the view has it confirmed by the database before its answer stands, through the
gate of the statement that stores the request's events, or by reading it afresh.
Only enabled sources are kept, so a 404 is always answered from a fresh read.
Every other connection (:func:`~pikku_django.wakeups.session_listener` says which)
reads the state on every request. :class:`RequestState` is that rule for one request:
it holds the state, and reads it afresh whenever an answer would otherwise stand on a
kept state nothing has confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from django.db import connections

from pikku_django.conf import pikku_settings
from pikku_django.wakeups import SOURCES_CHANNEL, session_listener
from pikku_django.webhooks.credentials import configured_values, decrypt_cached
from pikku_django.webhooks.sql import Gate, fingerprint_of, read_state


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
    """What one connection keeps: states by (source, credential)."""

    states: dict[tuple[str, str], SourceState] = field(default_factory=dict)
    generation: int = 0

    def on_notify(self, notify: Any) -> None:
        """A source or credential changed: keep nothing from before."""
        self.states.clear()
        self.generation += 1


def source_state(
    source: str, credential: str | None, using: str = "default", *, fresh: bool = False
) -> SourceState:
    """``source``'s state for a request on ``using``: kept, or read (``fresh`` always reads)."""
    credential = credential or ""
    connection = connections[using]
    kept = _kept_for(connection)
    if kept is not None and not fresh:
        found = kept.states.get((source, credential))
        if found is not None:
            return found
    generation = kept.generation if kept is not None else 0
    enabled, ciphertexts = read_state(connection, source, credential)
    secrets = configured_values(credential) if credential else []
    secrets += [decrypt_cached(token, credential) for token in reversed(ciphertexts)]
    state = SourceState(enabled, secrets, Gate(source, credential, fingerprint_of(ciphertexts)))
    if kept is not None:
        if enabled and kept.generation == generation:
            kept.states[(source, credential)] = SourceState(
                enabled, secrets, state.gate, cached=True
            )
        else:  # switched off (or changed again) since it was kept: keep nothing
            kept.states.pop((source, credential), None)
    return state


def _kept_for(connection: Any) -> _Kept | None:
    """The states ``connection`` keeps, or None when it keeps none: with the setting
    on and where its session can listen (:func:`~pikku_django.wakeups.session_listener`:
    PostgreSQL on psycopg 3, no transaction pooler, a connection that outlives the
    request, outside a transaction). Notifications already received are taken in first."""
    if not pikku_settings.WEBHOOK_STATE_CACHE:
        return None
    return session_listener(connection, SOURCES_CHANNEL, _Kept)


class SourceOff(Exception):
    """The source is switched off, or has no row: its route answers 404."""


class RequestState:
    """A source's switch and secrets as one request holds them.

    It starts from a kept state where there is one (only where the store's gate can
    confirm it), and :meth:`confirm` reads afresh when an answer is about to stand
    on a kept state nothing has confirmed yet.
    """

    def __init__(self, source: str, credential: str | None, using: str, *, gated: bool) -> None:
        self.source = source
        self.credential = credential
        self.using = using
        self.gated = gated
        self.state = source_state(source, credential, using, fresh=not gated)
        if not self.state.enabled:  # never a kept state: only enabled ones are kept
            raise SourceOff(source)

    @property
    def secrets(self) -> list[str]:
        return self.state.secrets

    @property
    def gate(self) -> Gate | None:
        """What a stored event is checked against, where the store checks it."""
        return self.state.gate if self.gated else None

    def reread(self) -> None:
        """Read the state afresh; :class:`SourceOff` when the source is now off."""
        self.state = source_state(self.source, self.credential, self.using, fresh=True)
        if not self.state.enabled:
            raise SourceOff(self.source)

    def confirm(self) -> bool:
        """Read afresh if the state is kept and unconfirmed; whether it was read."""
        if not self.state.cached:
            return False
        self.reread()
        return True

    def confirmed(self) -> None:
        """A gated store found the state current: no fresh read is needed."""
        if self.state.cached:
            self.state = replace(self.state, cached=False)
