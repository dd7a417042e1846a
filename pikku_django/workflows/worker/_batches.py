"""Batched claims: a worker thread that looks for due work claims, in one claim, as
many units (due runs, ready steps) as its worker has free threads, keeps one and
hands the others to free threads.

Each thread is a slot. A slot is free, reserved by a claim under way, held by a
unit claimed but not started yet (handed over), or running a unit. A claim asks for
at most the free slots, which it reserves first: what a worker has claimed and not
started never outnumbers its threads free to start it at once, so a busy worker
never holds work an idle one could run. Every unit is claimed as it would be alone
(its own attempt, claim token and lease, or run lease); one handed over keeps its
lease until the free thread that takes it starts it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from pikku_django.workflows._values import ClaimedStep, DueRun

#: Seconds a look waits at most, at a time, for the claims under way that hold every
#: free slot to end (each ends as soon as its statement returns).
RESERVED_WAIT = 1.0


@dataclass(frozen=True)
class Unit:
    """One unit of due work a claim took: a run due for a pass (``due``, with the
    first step its claim stored claimed, if any), or a claimed step (``claimed``)."""

    run_id: Any
    claimed: ClaimedStep | None = None
    due: DueRun | None = None


class Batches:
    """A worker's slots, and the units claimed for free threads not started yet."""

    def __init__(self, threads: int, most: int) -> None:
        self.threads = threads
        #: The most units one claim takes (``PIKKU["WORKER_CLAIM_BATCH"]``).
        self.most = max(1, most)
        self._lock = threading.Condition()
        self._running = 0
        self._reserved = 0
        self._handed: deque[Unit] = deque()

    def take(self) -> Unit | None:
        """A unit handed over, for the calling (free) thread to start: its slot is
        now that thread's; None if none waits."""
        with self._lock:
            if not self._handed:
                return None
            self._running += 1
            return self._handed.popleft()

    def reserve(self) -> int:
        """Reserve the free slots for a claim (at most :attr:`most`): how many units
        it may take; 0 when handed units hold them all. While claims under way hold
        every free slot, it waits for them to end first: they may have begun before
        the work this look was woken for was stored, and leave slots free for it."""
        with self._lock:
            while self._free() <= 0 and self._reserved:
                self._lock.wait(RESERVED_WAIT)
            wanted = max(0, min(self._free(), self.most))
            self._reserved += wanted
            return wanted

    def _free(self) -> int:
        return self.threads - self._running - self._reserved - len(self._handed)

    def claimed(self, reserved: int, units: list[Unit]) -> Unit | None:
        """A claim that reserved ``reserved`` slots took ``units`` (at most that
        many): the first is the calling thread's to run, the others wait to be taken
        by free threads; the slots left over are freed."""
        if len(units) > reserved:
            raise ValueError(f"a claim of {reserved} took {len(units)} units")
        with self._lock:
            self._reserved -= reserved
            self._lock.notify_all()
            if not units:
                return None
            self._running += 1
            self._handed.extend(units[1:])
            return units[0]

    def done(self) -> None:
        """The calling thread ended the unit it ran: its slot is free again."""
        with self._lock:
            self._running -= 1
            self._lock.notify_all()

    def waiting(self) -> int:
        """How many handed units wait for a thread to take them."""
        with self._lock:
            return len(self._handed)
