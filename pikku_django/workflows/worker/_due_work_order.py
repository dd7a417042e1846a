"""Which kind of due work a worker thread looks for first: due runs (their passes
claim the steps they reach) or ready steps (a task run's step is stored with its run,
which no pass is due for). A thread keeps to the kind that last kept it busy, and
looks for the other at least once a chain's time (first then, so that a batch the
one kind fills never crowds the other out)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from pikku_django.workflows.logcontext import workflow_logger

logger = workflow_logger(__name__)

T = TypeVar("T")


class LookOrder:
    """Per thread: which kind it looks for first, and when it next looks for the other."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._local = threading.local()

    def claim(
        self,
        runs: Callable[[int], list[T]],
        steps: Callable[[int, bool], list[T]],
        wanted: int,
        stopping: threading.Event,
    ) -> list[T]:
        """Claim up to ``wanted`` units with ``runs(n)`` and ``steps(n, busy)`` (each
        claims up to ``n``; ``busy``: whether the last look found steps) in this
        thread's order: what was claimed."""
        local = self._local
        now = time.monotonic()
        if getattr(local, "steps_first", False):
            if now >= getattr(local, "next_runs", 0.0):
                local.next_runs = now + self.every
                found = runs(wanted)
                local.steps_first = not found
                return found + _then(lambda n: steps(n, True), wanted, found, stopping)
            found = steps(wanted, True)
            if found or stopping.is_set():
                return found
            local.next_runs = now + self.every
            got = runs(wanted)
            local.steps_first = not got
            return got
        # A thread kept busy by due runs looks for ready steps once a chain's time,
        # not on every look: the steps its passes reach it claims as it goes.
        if now >= getattr(local, "next_steps", 0.0):
            local.next_steps = now + self.every
            found = steps(wanted, False)
            got = _then(runs, wanted, found, stopping)
            local.steps_first = bool(found) and not got
            return got + found
        got = runs(wanted)
        if got or stopping.is_set():
            return got
        local.next_steps = now + self.every
        found = steps(wanted, False)
        local.steps_first = bool(found)
        return found


def _then(
    look: Callable[[int], list[T]], wanted: int, found: list[T], stopping: threading.Event
) -> list[T]:
    """The second look of a claim, for what the first left of ``wanted``. Should it
    fail once the first ``found`` units, those are still run (the error is logged):
    they are claimed, and nothing else would run them before their leases lapse."""
    if len(found) >= wanted or stopping.is_set():
        return []
    if not found:
        return look(wanted)
    try:
        return look(wanted - len(found))
    except Exception:
        logger.exception("A look for due work failed; running what was claimed before it")
        return []
