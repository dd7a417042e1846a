"""Paused queues as claims see them: the condition each claim of a queued step adds,
and each process's look at which queues are paused, for passes deciding whether to
claim the step they reach.

The condition is what holds a pause: a claim checks the pause table in the statement
that takes the step. The look only spares passes a claim that would be refused; a
refused claim forgets it, so the next pass reads the table again.
"""

from __future__ import annotations

import time

from django.db.models import Exists, OuterRef, QuerySet, Subquery

from pikku_django.models import QueuePause, WorkflowStep

#: Seconds a process keeps its look at the paused queues before reading them again.
PAUSED_LOOK_SECONDS = 5.0


def paused(using: str) -> Exists:
    """True for a step (or row with a ``queue``) whose queue is paused (``OuterRef``)."""
    return Exists(QueuePause.objects.using(using).filter(queue=OuterRef("queue")))


def without_paused(steps: QuerySet[WorkflowStep], using: str) -> QuerySet[WorkflowStep]:
    """``steps`` but those of paused queues, each step's queue looked up by the pause
    table's unique index as it is read: a LIMITed scalar subquery, which the planner
    never makes a join (a NOT EXISTS may become an anti join that reads a whole
    backlog rather than the claim order's first steps)."""
    pause = QueuePause.objects.using(using).filter(queue=OuterRef("queue"))
    first = pause.order_by().values("id")[:1]
    return steps.alias(queue_paused=Subquery(first)).filter(queue_paused__isnull=True)


class PausedLook:
    """This process's look at the paused queues, per database, read at most every
    :data:`PAUSED_LOOK_SECONDS` (and again after :meth:`forget`)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, frozenset[str]]] = {}

    def is_paused(self, using: str, queue: str) -> bool:
        """Whether ``queue`` was paused when this process last looked."""
        seen = self._seen.get(using)
        now = time.monotonic()
        if seen is None or now - seen[0] >= PAUSED_LOOK_SECONDS:
            names = QueuePause.objects.using(using).values_list("queue", flat=True)
            seen = (now, frozenset(names))
            self._seen[using] = seen
        return queue in seen[1]

    def forget(self, using: str | None = None) -> None:
        """Read the paused queues again at the next look (of ``using``, or every one)."""
        if using is None:
            self._seen.clear()
        else:
            self._seen.pop(using, None)


#: The look of this process.
paused_look = PausedLook()
