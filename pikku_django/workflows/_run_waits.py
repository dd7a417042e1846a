"""Waiting for a run to end: woken by NOTIFY on PostgreSQL, by polling elsewhere."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

from django.core.exceptions import ValidationError
from django.db import connections

from pikku_django.models import TERMINAL_RUN_STATUSES, WorkflowRun
from pikku_django.workflows._listen import ChannelListener
from pikku_django.workflows.errors import RunWaitTimeoutError, WorkflowRunNotFoundError
from pikku_django.workflows.store.base import RUN_DONE_CHANNEL

#: Seconds between looks when nothing wakes the wait (PostgreSQL: a safety net).
POLL_INTERVAL = 0.2
NOTIFIED_POLL_INTERVAL = 2.0


def announce_run_end(using: str, run_id: uuid.UUID, *, notifying: bool = True) -> None:
    """Tell waiting callers that the run ended, once the current transaction commits
    (PostgreSQL, unless ``PIKKU["WORKER_NOTIFY"]`` is off)."""
    connection = connections[using]
    if connection.vendor != "postgresql" or not notifying:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [RUN_DONE_CHANNEL, str(run_id)])


class RunEndListener:
    """One ``LISTEN`` per process and database, waking the waits on each run."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._lock = threading.Lock()
        self._waits: defaultdict[str, set[threading.Event]] = defaultdict(set)
        self._thread: threading.Thread | None = None
        self.channel = self._channel()

    def _channel(self) -> ChannelListener:
        # Anything announced while not listening: every wait looks again.
        return ChannelListener(
            self.using, RUN_DONE_CHANNEL, self._wake, on_listen=lambda: self._wake(None)
        )

    def register(self, run_id: str) -> threading.Event:
        """An event set when ``run_id`` is announced; listens first (a few seconds at most)."""
        woken = threading.Event()
        with self._lock:
            self._waits[run_id].add(woken)
            if self._thread is None or not self._thread.is_alive():
                self.channel = self._channel()  # its own state: an ending one may linger
                self._thread = threading.Thread(
                    target=self.channel.run,
                    args=(threading.Event(), self._waited_on),
                    name="pikku-run-waits",
                    daemon=True,
                )
                self._thread.start()
            channel = self.channel
        channel.listening.wait(2.0)
        return woken

    def interval(self, polled: float, notified: float) -> float:
        """How long a wait goes without reading the run itself (the listener's rule)."""
        return self.channel.interval(polled, notified)

    def unregister(self, run_id: str, woken: threading.Event) -> None:
        with self._lock:
            waits = self._waits.get(run_id)
            if waits is not None:
                waits.discard(woken)
                if not waits:
                    del self._waits[run_id]

    def _waited_on(self) -> bool:
        """Whether a wait is registered; if not, the listener ends (a later wait
        listens again)."""
        with self._lock:
            if self._waits:
                return True
            self._thread = None
            return False

    def _wake(self, run_id: str | None) -> None:
        with self._lock:
            targets = (
                list(self._waits.get(run_id, ()))
                if run_id is not None
                else [w for waits in self._waits.values() for w in waits]
            )
        for woken in targets:
            woken.set()


_listeners: dict[str, RunEndListener] = {}
_listeners_lock = threading.Lock()


def _listener(using: str) -> RunEndListener:
    with _listeners_lock:
        if using not in _listeners:
            _listeners[using] = RunEndListener(using)
        return _listeners[using]


def idle_listeners(timeout: float = 10.0) -> bool:
    """Wait until no process-wide LISTEN for run ends is open (none waits): whether
    that happened within ``timeout`` seconds (before a test database is dropped)."""
    deadline = time.monotonic() + timeout
    for listener in list(_listeners.values()):
        thread = listener._thread
        if thread is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
    return True


def wait_for_run(
    using: str,
    run_id: uuid.UUID | str,
    timeout: float,
    poll_interval: float | None = None,
    *,
    notifying: bool = True,
) -> WorkflowRun:
    """The run once it has ended (completed, failed or cancelled);
    :class:`RunWaitTimeoutError` when it has not within ``timeout`` seconds. On
    PostgreSQL with ``notifying``, woken by the run's end; else it polls."""
    if timeout < 0:
        raise ValueError(f"timeout must be 0 or more seconds, not {timeout!r}")
    notified = notifying and connections[using].vendor == "postgresql"
    deadline = time.monotonic() + timeout
    key = str(run_id)
    listener = _listener(using) if notified else None
    woken = listener.register(key) if listener is not None else threading.Event()
    try:
        while True:
            run = _read(using, run_id)
            if run.status in TERMINAL_RUN_STATUSES:
                return run
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunWaitTimeoutError(run.id, run.status, timeout)
            if poll_interval:
                interval = poll_interval
            elif listener is not None:
                interval = listener.interval(POLL_INTERVAL, NOTIFIED_POLL_INTERVAL)
            else:
                interval = POLL_INTERVAL
            woken.wait(min(interval, left))
            woken.clear()
    finally:
        if listener is not None:
            listener.unregister(key, woken)


def _read(using: str, run_id: uuid.UUID | str) -> WorkflowRun:
    try:
        return WorkflowRun.objects.using(using).get(id=run_id)
    except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError) as exc:
        raise WorkflowRunNotFoundError(f"No workflow run has id {run_id!r}") from exc
