"""A worker's tally: the steps it holds, and what it has done (passes, steps, errors,
and how each claimed step ended), for its progress lines and its hand-back."""

from __future__ import annotations

import threading

from pikku_django.workflows._values import ClaimedStep, StepOutcome

#: The progress counter each outcome of a claimed step adds to.
COUNTED = {
    StepOutcome.SUCCEEDED: "finished",
    StepOutcome.RETRYING: "retried",
    StepOutcome.SUPERSEDED: "superseded",
}


class WorkerTally:
    """What one worker holds and has done; safe to share between its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[int, ClaimedStep] = {}
        self.passes = 0
        self.steps = 0
        self.errors = 0
        #: Progress counters: claimed steps, and how each claimed step ended.
        self.counts = dict.fromkeys(
            ("claimed", "finished", "failed", "retried", "recovered", "superseded"), 0
        )

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def passed(self) -> None:
        """One more orchestration pass."""
        with self._lock:
            self.passes += 1

    def failed_unit(self) -> None:
        """One more error that ended a thread's unit of work."""
        with self._lock:
            self.errors += 1

    def began(self, claimed: ClaimedStep) -> None:
        with self._lock:
            self._in_flight[claimed.step_id] = claimed
            self.counts["claimed"] += 1
            if claimed.reclaimed:
                self.counts["recovered"] += 1

    def ended(self, claimed: ClaimedStep, outcome: StepOutcome) -> None:
        with self._lock:
            self.counts[COUNTED.get(outcome, "failed")] += 1
            self._in_flight.pop(claimed.step_id, None)
            self.steps += 1

    def in_flight(self) -> list[ClaimedStep]:
        """The steps held right now."""
        with self._lock:
            return list(self._in_flight.values())

    def progress(self) -> str:
        """The progress line's figures."""
        c = self.counts
        return (
            f"{self.passes} passes; steps claimed {c['claimed']}, finished {c['finished']}, "
            f"failed {c['failed']}, retried {c['retried']}, recovered {c['recovered']}, "
            f"superseded {c['superseded']}; {self.errors} errors"
        )
