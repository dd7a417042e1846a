"""When a worker asks the intakes for their waiting runs, and the asking itself."""

from __future__ import annotations

import threading
import time

from pikku_django.workflows.worker._idle import PollCadence
from pikku_django.workflows.worker.intake import RunStarter, intakes, seconds_until_due

#: How many waiting items of each intake one look starts runs for.
INTAKE_BATCH = 100


class IntakeLooks:
    """One worker's looks at the intakes: at once when told that one has work
    (``waiting``, set by a notification on PostgreSQL), when one said it falls due
    (a cron tick, a deadline), else once an intake interval of the cadence."""

    def __init__(self, engine: RunStarter, cadence: PollCadence) -> None:
        self.engine = engine
        self.cadence = cadence
        #: Set when an intake has work now: the next thread to look asks them all.
        self.waiting = threading.Event()
        self.waiting.set()  # at start
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._due_at = float("inf")

    def next_look(self) -> float:
        """When (``time.monotonic()``) the intakes are asked next, unless told sooner."""
        return min(self._last + self.cadence.intake_interval(), self._due_at)

    def start_waiting(self) -> int:
        """Ask each intake to start its waiting runs, in one thread at a time, if a
        look is due: how many items now have their run."""
        if not self.waiting.is_set() and time.monotonic() < self.next_look():
            return 0
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            self.waiting.clear()
            self._last, self._due_at = time.monotonic(), float("inf")
            started = 0
            for intake in intakes():
                linked = intake.start_waiting(self.engine, INTAKE_BATCH)
                if linked >= INTAKE_BATCH:  # there may be more
                    self.waiting.set()
                started += linked
                due = seconds_until_due(intake, self.engine)  # e.g. a cron schedule's tick
                if due is not None:
                    self._due_at = min(self._due_at, time.monotonic() + due)
            return started
        finally:
            self._lock.release()
