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
        self._lock = threading.Lock()
        self._running = 0
        self._reserved = 0
        self._handed: deque[Unit] = deque()
        #: A look found every free slot reserved by a claim under way, which may have
        #: begun before the work that look was woken for was committed.
        self._missed = False
        self._look_again = False

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
        it may take; 0 when other claims under way or handed units hold them all."""
        with self._lock:
            free = self.threads - self._running - self._reserved - len(self._handed)
            wanted = max(0, min(free, self.most))
            if not wanted and self._reserved:
                self._missed = True
            self._reserved += wanted
            return wanted

    def claimed(self, reserved: int, units: list[Unit]) -> Unit | None:
        """A claim that reserved ``reserved`` slots took ``units`` (at most that
        many): the first is the calling thread's to run, the others wait to be taken
        by free threads; the slots left over are freed."""
        if len(units) > reserved:
            raise ValueError(f"a claim of {reserved} took {len(units)} units")
        with self._lock:
            self._reserved -= reserved
            if self._missed and len(units) < reserved:
                # It left slots free: what the look that missed was woken for may
                # be due still, and a thread must look for it.
                self._missed, self._look_again = False, True
            if not units:
                return None
            self._running += 1
            self._handed.extend(units[1:])
            return units[0]

    def look_again(self) -> bool:
        """Whether a thread must look for due work again: a look found every free
        slot reserved while a claim was under way, and that claim left slots free
        (it may have begun before the work was committed). Asked once."""
        with self._lock:
            again, self._look_again = self._look_again, False
            return again

    def done(self) -> None:
        """The calling thread ended the unit it ran: its slot is free again."""
        with self._lock:
            self._running -= 1

    def waiting(self) -> int:
        """How many handed units wait for a thread to take them."""
        with self._lock:
            return len(self._handed)
