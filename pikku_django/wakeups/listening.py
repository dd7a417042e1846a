"""Listening (PostgreSQL's LISTEN): a connection of its own, one shared per process and
channel, or notices kept on a request's own connection."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.db import connections

from pikku_django.pooling import Pooling, pooling_of
from pikku_django.wakeups.channels import (
    WORK_CHANNEL,
    listen_alias,
    notifies,
)

logger = logging.getLogger(__name__)

#: Seconds a listener waits for one notification before it checks whether to go on.
NOTIFY_TIMEOUT = 1.0
#: Seconds a shared listener stays connected after its last waiter left.
LINGER = 2.0


class ChannelListener:
    """LISTEN on ``channel`` through alias ``using`` on a connection of its own (never
    a request's), calling ``on_notify`` with each payload on the listening thread.

    It waits at most ``timeout`` for each notification, so that stopping is noticed;
    reconnects ``retry_after`` seconds after a failure; calls ``on_listen`` after each
    (re)connect (anything announced meanwhile was missed: look again).
    """

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
        notification or timeout) says no."""
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
    intake_payloads: Iterable[str],
    on_intake: Callable[[], None],
    wake: Callable[[], None],
    retry_after: float,
) -> ChannelListener | None:
    """A worker's listener for new work on ``using``'s database, or None where it polls.

    Each notification calls ``wake`` (after ``on_intake`` when its payload is one of
    ``intake_payloads``); so does each (re)connect, for what was missed meanwhile."""
    through = listen_alias(using)
    if through is None:
        return None
    payloads = {p for p in intake_payloads if p}

    def notified(payload: str) -> None:
        if payload in payloads:
            on_intake()
        wake()

    def listened() -> None:
        on_intake()
        wake()

    return ChannelListener(
        through, WORK_CHANNEL, notified, on_listen=listened, retry_after=retry_after
    )


class SharedListener:
    """One LISTEN on ``channel`` per process and database, shared by every waiter.

    The first subscriber starts it; it ends :data:`LINGER` seconds after the last one
    left. Where ``using`` cannot be listened to, nothing is started and subscribers are
    never called (they poll).
    """

    def __init__(self, using: str, channel: str) -> None:
        self.using = using
        self.channel = channel
        self._lock = threading.Lock()
        self._subscribers: defaultdict[str | None, set[Callable[[], None]]] = defaultdict(set)
        self._left_at = float("-inf")
        self._thread: threading.Thread | None = None
        self._listener: ChannelListener | None = None

    def subscribe(self, callback: Callable[[], None], key: str | None = None) -> Callable[[], None]:
        """Call ``callback`` on each notification whose payload is ``key`` (any, when
        None) and after each (re)connect, until the function returned is called."""
        through = listen_alias(self.using)
        with self._lock:
            self._subscribers[key].add(callback)
            if through is not None and (self._thread is None or not self._thread.is_alive()):
                self._listener = ChannelListener(
                    through, self.channel, self._notified, on_listen=self._listened
                )
                self._thread = threading.Thread(
                    target=self._listener.run,
                    args=(threading.Event(), self._wanted),
                    name=f"pikku-listen-{self.channel}",
                    daemon=True,
                )
                self._thread.start()

        def unsubscribe() -> None:
            with self._lock:
                callbacks = self._subscribers.get(key)
                if callbacks is not None:
                    callbacks.discard(callback)
                    if not callbacks:
                        del self._subscribers[key]
                self._left_at = time.monotonic()

        return unsubscribe

    def wait_listening(self, timeout: float) -> bool:
        """Wait until the listener listens (at most ``timeout``): whether it does."""
        listener = self._listener
        return listener is not None and listener.listening.wait(timeout)

    def interval(self, polled: float, notified: float) -> float:
        """How long a waiter goes without looking itself (the listener's rule)."""
        listener = self._listener
        return polled if listener is None else listener.interval(polled, notified)

    def wait(self, timeout: float) -> None:
        """Return on the next notification, or after ``timeout`` seconds."""
        woken = threading.Event()
        unsubscribe = self.subscribe(woken.set)
        try:
            woken.wait(timeout)
        finally:
            unsubscribe()

    def join(self, timeout: float) -> bool:
        """Wait until the listener has ended: whether it has within ``timeout``."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _wanted(self) -> bool:
        with self._lock:
            if self._subscribers or time.monotonic() - self._left_at < LINGER:
                return True
            self._thread = None
            return False

    def _notified(self, payload: str) -> None:
        with self._lock:
            targets = [*self._subscribers.get(payload, ()), *self._subscribers.get(None, ())]
        for callback in targets:
            callback()

    def _listened(self) -> None:
        with self._lock:
            targets = [c for callbacks in self._subscribers.values() for c in callbacks]
        for callback in targets:
            callback()


_shared: dict[tuple[str, str], SharedListener] = {}
_shared_lock = threading.Lock()


def shared_listener(using: str, channel: str) -> SharedListener:
    """The process's listener on ``channel`` of ``using``'s database."""
    with _shared_lock:
        found = _shared.get((using, channel))
        if found is None:
            found = _shared[(using, channel)] = SharedListener(using, channel)
        return found


def idle_listeners(timeout: float = 10.0) -> bool:
    """Wait until no shared listener is connected: whether that happened within
    ``timeout`` seconds (before a test database is dropped)."""
    deadline = time.monotonic() + timeout
    return all(
        listener.join(max(0.0, deadline - time.monotonic())) for listener in list(_shared.values())
    )


# -- notices kept on a request's own connection ------------------------------------------

H = TypeVar("H")

#: Per psycopg connection, the handler of each channel it listens on.
_sessions: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def session_listener(connection: Any, channel: str, make: Callable[[], H]) -> H | None:
    """The handler kept for ``channel`` on ``connection``'s database session (made by
    ``make``, its ``on_notify`` given each notification), notifications already
    received handed to it first; None where the session cannot listen.

    It cannot without notifications, behind a transaction pooler, inside a
    transaction (a LISTEN would count only from its commit), on psycopg 2, or when the
    connection ends with the request (a LISTEN each request would cost more than it saves).
    """
    if not notifies(connection.alias) or pooling_of(connection.alias) is Pooling.TRANSACTION:
        return None
    if connection.settings_dict.get("CONN_MAX_AGE") == 0 and not getattr(connection, "pool", None):
        return None
    if connection.in_atomic_block or not connection.get_autocommit():  # connects if need be
        return None
    raw = connection.connection
    if not hasattr(raw, "add_notify_handler"):  # psycopg2
        return None
    handlers = _sessions.get(raw)
    if handlers is not None and channel in handlers:
        try:
            _take_notifications(raw)
        except Exception:  # the connection broke: the caller reads instead
            logger.debug("Reading notifications failed", exc_info=True)
            del _sessions[raw]
            return None
        found: H = handlers[channel]
        return found
    handler = make()
    with connection.wrap_database_errors:
        raw.execute(f"LISTEN {channel}")
    if handlers is None:
        handlers = _sessions[raw] = {}
        raw.add_notify_handler(lambda notice: _dispatch(handlers, notice))
    handlers[channel] = handler
    return handler


def _dispatch(handlers: dict[str, Any], notice: Any) -> None:
    handler = handlers.get(notice.channel)
    if handler is not None:
        handler.on_notify(notice)


def _take_notifications(raw: Any) -> None:
    """Hand notifications already received on ``raw`` to its handlers, without waiting."""
    pgconn = raw.pgconn
    pgconn.consume_input()
    while (notify := pgconn.notifies()) is not None:
        if pgconn.notify_handler is not None:
            pgconn.notify_handler(notify)
