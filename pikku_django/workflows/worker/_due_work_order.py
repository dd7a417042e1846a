"""Which kind of due work a worker thread looks for first: due runs (their passes
claim the steps they reach) or ready steps (a task run's step is stored with its run,
which no pass is due for). A thread keeps to the kind that last kept it busy, and
looks for the other at least once a chain's time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LookOrder:
    """Per thread: which kind it looks for first, and when it next looks for the other."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._local = threading.local()

    def one_unit(
        self,
        runs: Callable[[], int],
        steps: Callable[[bool], int],
        stopping: threading.Event,
    ) -> int:
        """Look for ``runs`` and ``steps`` (each claims and carries on what it finds:
        how much that was; ``steps(busy)`` is told whether the last look found steps)
        in this thread's order: how much was done."""
        local = self._local
        if getattr(local, "steps_first", False):
            done = steps(True)
            now = time.monotonic()
            if (done and now < getattr(local, "next_runs", 0.0)) or stopping.is_set():
                return done
            local.next_runs = now + self.every
            found = runs()
            local.steps_first = found == 0
            return done + found
        done = runs()
        if stopping.is_set():
            return done
        # A thread kept busy by due runs looks for ready steps once a chain's time,
        # not after every run: the steps its passes reach it claims as it goes.
        now = time.monotonic()
        if done and now < getattr(local, "next_steps", 0.0):
            return done
        local.next_steps = now + self.every
        found = steps(False)
        local.steps_first = found > 0 and done == 0
        return done + found
