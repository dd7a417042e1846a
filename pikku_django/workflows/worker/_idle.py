"""Where a worker's idle threads wait for work.

One idle thread at a time, the poller, looks for work again on a timer (the poll
interval, or sooner when something falls due); the others wait until they are told
there is work. A thread that finds work wakes one more, so a burst of work draws
in threads one by one instead of every idle thread querying the database at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: How long an idle thread that is not the poller waits at most before it looks
#: anyway (the poller looks on every poll interval, so this is only a safety net).
FOLLOWER_WAIT = 30.0


class IdleThreads:
    """The idle threads of one worker, and the one among them that polls."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._poller: int | None = None
        #: A wake-up told that no waiting thread has taken yet: the next to wait takes it.
        self._owed = 0

    def polls(self, index: int) -> bool:
        """Whether thread ``index`` is to poll when it next waits (no other thread does)."""
        with self._cond:
            if self._poller is None:
                self._poller = index
            return self._poller == index

    def wait(
        self,
        index: int,
        timeout: float,
        stopping: threading.Event,
        handed: Callable[[], int] = lambda: 0,
    ) -> None:
        """Wait to be woken, or ``timeout`` seconds as the poller (else at most
        :data:`FOLLOWER_WAIT`); return at once when stopping, a wake-up is owed or
        work was ``handed`` to the idle threads (see :meth:`wake`)."""
        with self._cond:
            if stopping.is_set() or handed():
                return
            if not self._take_owed():
                poller = self._poller == index
                if self._cond.wait(timeout if poller else FOLLOWER_WAIT):
                    self._take_owed()
            if self._poller == index:
                self._poller = None  # looking now; another idle thread may take the role

    def _take_owed(self) -> bool:
        """Take the owed wake-up, if there is one (under the lock)."""
        owed, self._owed = self._owed, 0
        return owed > 0

    def wake_one(self) -> None:
        """There is work: wake one waiting thread (or the next one to wait)."""
        with self._cond:
            self._owed = 1
            self._cond.notify(1)

    def wake(self, n: int) -> None:
        """Work was handed to ``n`` idle threads: wake that many (one about to wait
        sees the work first, and does not)."""
        with self._cond:
            self._owed = 1
            self._cond.notify(n)

    def wake_all(self) -> None:
        """Wake every waiting thread (to stop)."""
        with self._cond:
            self._cond.notify_all()


class PollCadence:
    """How often an idle worker looks for work without being told.

    Every ``poll_interval`` seconds; while the worker's LISTEN works
    (:mod:`pikku_django.wakeups`) and no queue has limits (a limited queue's freed slot
    is not announced), every ``notified_interval`` instead: new work is announced, and
    the worker's next-due look wakes it for timers and lapsing leases. Intakes that are
    only polled are looked at every poll interval while the worker is busy or notified
    (and for two poll intervals after), so that what a run's work leaves them (a
    deadline to watch) is seen as soon as before.
    """

    def __init__(
        self,
        poll_interval: float,
        notified_interval: float,
        *,
        listening: Callable[[], bool] = lambda: False,
        limited: bool = False,
    ) -> None:
        self.poll_interval = poll_interval
        self.notified_interval = max(poll_interval, notified_interval)
        self._listening = listening
        self.limited = limited
        self._active_at = float("-inf")

    def busy(self) -> None:
        """The worker did work, or was told of some."""
        self._active_at = time.monotonic()

    def interval(self) -> float:
        """The longest an idle worker waits before it looks for work itself."""
        if self.limited or not self._listening():
            return self.poll_interval
        return self.notified_interval

    def intake_interval(self) -> float:
        """The longest between looks at the intakes (those not notified, or any)."""
        if time.monotonic() - self._active_at < 2 * self.poll_interval:
            return self.poll_interval
        return self.interval()
