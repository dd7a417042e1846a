"""PostgreSQL LISTEN in a thread of its own: the one listener every waiter shares.

The worker (new work wakes its threads), waits for a run's end and the status
stream each listen on a channel. :class:`ChannelListener` holds the one rule
for all of them: its own connection (never a request's), a bounded wait for each
notification so that stopping is noticed, reconnecting a while after a failure,
a call after each (re)connect (anything announced meanwhile was missed: look
again), and :meth:`ChannelListener.interval`, how long a waiter may go without
looking itself (long while the listener listens, short while it does not).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from django.db import connections

from pikku_django.workflows.intake import intakes
from pikku_django.workflows.store import CHANNEL

logger = logging.getLogger(__name__)

#: Seconds a listener waits for one notification before it checks whether to go on.
NOTIFY_TIMEOUT = 1.0


class ChannelListener:
    """LISTEN on ``channel`` of database ``using``, calling ``on_notify`` with each
    notification's payload (on the listening thread)."""

    def __init__(
        self,
        using: str,
        channel: str,
        on_notify: Callable[[str], None],
        *,
        on_listen: Callable[[], None] | None = None,
        retry_after: float = 1.0,
        timeout: float = NOTIFY_TIMEOUT,
    ) -> None:
        self.using = using
        self.channel = channel
        self.on_notify = on_notify
        self.on_listen = on_listen
        self.retry_after = retry_after
        self.timeout = timeout
        #: Set while the LISTEN connection works (cleared when it fails or ends).
        self.listening = threading.Event()

    def interval(self, polled: float, notified: float) -> float:
        """How long a waiter goes without looking itself: ``notified`` while this
        listener listens (a notification wakes it sooner), else ``polled``."""
        return notified if self.listening.is_set() else polled

    def run(self, stopping: threading.Event, keep_going: Callable[[], bool] | None = None) -> None:
        """Listen until ``stopping`` is set, or until ``keep_going`` (asked after each
        notification or timeout) says no; reconnect ``retry_after`` seconds after the
        connection fails."""
        template = connections[self.using]
        try:
            while not stopping.is_set():
                conn = type(template)(template.settings_dict, self.using)
                try:
                    conn.ensure_connection()
                    raw = conn.connection
                    raw.autocommit = True
                    raw.execute(f"LISTEN {self.channel}")
                    self.listening.set()
                    if self.on_listen is not None:
                        self.on_listen()
                    while not stopping.is_set():
                        for notice in raw.notifies(timeout=self.timeout, stop_after=1):
                            self.on_notify(notice.payload)
                        if keep_going is not None and not keep_going():
                            return
                except Exception:
                    self.listening.clear()
                    if stopping.is_set() or (keep_going is not None and not keep_going()):
                        return
                    logger.warning(
                        "LISTEN %s failed; reconnecting in %gs",
                        self.channel,
                        self.retry_after,
                        exc_info=True,
                    )
                    stopping.wait(self.retry_after)
                finally:
                    with contextlib.suppress(Exception):  # the connection is gone either way
                        conn.close()
        finally:
            self.listening.clear()


def work_listener(
    using: str,
    intake_waiting: threading.Event,
    wake: Callable[[], None],
    retry_after: float,
) -> ChannelListener:
    """The worker's listener on the workers' channel: each notification calls ``wake``
    (and sets ``intake_waiting`` when an intake has work); so does each (re)connect,
    for what was announced while not listening."""
    payloads = {i.notify_payload for i in intakes() if i.notify_payload}

    def notified(payload: str) -> None:
        if payload in payloads:
            intake_waiting.set()
        wake()

    def listened() -> None:
        intake_waiting.set()
        wake()

    return ChannelListener(
        using,
        CHANNEL,
        notified,
        on_listen=listened,
        retry_after=retry_after,
    )
