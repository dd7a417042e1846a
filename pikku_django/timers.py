"""One background thread per process that starts callbacks when they fall due.

Lease renewals are due only when a block outlives a fraction of its lease; most
blocks end first. Scheduling them here costs no thread until one is due, and the
callback runs on a thread of its own, so a slow callback delays no other.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Timer:
    """A scheduled callback; :meth:`cancel` before it is due stops it from starting."""

    __slots__ = ("cancelled", "due", "fn", "name")

    def __init__(self, due: float, fn: Callable[[], None], name: str) -> None:
        self.due = due
        self.fn = fn
        self.name = name
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Timers:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def call_later(self, delay: float, fn: Callable[[], None], name: str) -> Timer:
        timer = Timer(time.monotonic() + delay, fn, name)
        with self._cond:
            heapq.heappush(self._heap, (timer.due, next(self._seq), timer))
            if len(self._heap) > 1024:
                self._drop_cancelled()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="pikku-timers", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is timer:
                self._cond.notify()
        return timer

    def _drop_cancelled(self) -> None:
        live = [entry for entry in self._heap if not entry[2].cancelled]
        if len(live) < len(self._heap):
            heapq.heapify(live)
            self._heap = live

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    if wait is not None and wait <= 0:
                        timer = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(wait)
            try:
                threading.Thread(target=timer.fn, name=timer.name, daemon=True).start()
            except Exception:
                logger.exception("Could not start %s", timer.name)

    def reset_after_fork(self) -> None:
        self._cond = threading.Condition()
        self._heap = []
        self._thread = None


_timers = _Timers()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_timers.reset_after_fork)


def call_later(delay: float, fn: Callable[[], None], *, name: str) -> Timer:
    """Start ``fn`` on a new daemon thread named ``name`` after ``delay`` seconds."""
    return _timers.call_later(delay, fn, name)
