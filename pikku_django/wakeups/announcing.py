"""Announcing new work and runs' ends (PostgreSQL's NOTIFY), coalesced per process."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from pikku_django.wakeups.channels import ANY_WORK, RUN_DONE_CHANNEL, WORK_CHANNEL, notifies

logger = logging.getLogger(__name__)

#: Seconds between a process's announcements on one database and payload.
WINDOW = 0.01
#: Seconds before an announcement that failed (the database was away) is tried again.
RETRY = 1.0
#: Seconds the announcing thread keeps its connection once it has nothing to announce.
IDLE_CLOSE = 1.0


def announce(
    using: str, payload: str = ANY_WORK, *, channel: str = WORK_CHANNEL, notifying: bool = True
) -> None:
    """Announce ``payload`` on ``channel`` as the current transaction commits (at once
    outside one); nothing where ``using`` carries no notifications or not ``notifying``."""
    if not notifying or not notifies(using):
        return
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def announce_run_end(using: str, run_id: Any, *, notifying: bool = True) -> None:
    """Tell the waits on run ``run_id`` that it ended, as the transaction commits."""
    announce(using, str(run_id), channel=RUN_DONE_CHANNEL, notifying=notifying)


@dataclass
class _Owed:
    """The announcements of one database and payload."""

    #: When the last one was made (this process's monotonic clock).
    last: float = float("-inf")
    #: Whether writes that committed since need one.
    owed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Announcer:
    """This process's announcements of new work, coalesced.

    PostgreSQL commits the transactions that ``NOTIFY`` one at a time, so a process
    writing hundreds of receipts or runs a second would queue its commits behind each
    other's announcements. The first write of a window announces itself in its own
    statement (:meth:`inline`); the writes after it do not, and once they have
    committed one announcement from a background thread covers them all, no later than
    ``window`` after the one before it (:meth:`after_commit`).
    """

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._cond = threading.Condition()
        self._by_key: dict[tuple[str, str], _Owed] = {}
        self._thread: threading.Thread | None = None

    def _owed(self, using: str, payload: str) -> _Owed:
        key = (using, payload)
        found = self._by_key.get(key)
        if found is None:
            with self._cond:
                found = self._by_key.setdefault(key, _Owed())
        return found

    def inline(self, using: str, payload: str = ANY_WORK) -> bool:
        """Whether a write about to be made should announce itself in its statement: the
        first of its window. Else call :meth:`after_commit` once it is written."""
        owed = self._owed(using, payload)
        now = time.monotonic()
        with owed.lock:
            if now - owed.last < self.window:
                return False
            owed.last = now
            return True

    def after_commit(self, using: str, payload: str = ANY_WORK) -> None:
        """A write that did not announce itself was made in this thread: once it has
        committed (at once outside a transaction), an announcement covers it."""
        transaction.on_commit(lambda: self._owe(using, payload), using=using)

    def _owe(self, using: str, payload: str) -> None:
        owed = self._owed(using, payload)
        with owed.lock:
            owed.owed = True
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="pikku-announce", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        """Make the owed announcements, each a window after the one before it."""
        while True:
            with self._cond:
                due = self._next_due()
                while due is None:
                    if not self._cond.wait(IDLE_CLOSE):
                        connections.close_all()  # this thread's: nothing to announce
                    due = self._next_due()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            for (using, payload), owed in list(self._by_key.items()):
                self._announce_if_due(using, payload, owed)

    def _next_due(self) -> float | None:
        dues = [o.last + self.window for o in self._by_key.values() if o.owed]
        return min(dues) if dues else None

    def _announce_if_due(self, using: str, payload: str, owed: _Owed) -> None:
        now = time.monotonic()
        with owed.lock:
            if not owed.owed or now < owed.last + self.window:
                return
            owed.owed, owed.last = False, now
        try:
            announce(using, payload)
        except Exception:
            logger.warning(
                "Could not announce new work on %r; trying again in %gs",
                using,
                RETRY,
                exc_info=True,
            )
            connections[using].close()
            with owed.lock:
                owed.owed, owed.last = True, now + RETRY - self.window


#: The process's announcer.
announcer = Announcer()
