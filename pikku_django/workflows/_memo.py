"""The memo of each run's succeeded steps a process keeps between passes, so a pass
reads only the steps that can have changed since, not all of the run's steps."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q

from pikku_django.models import StepStatus, WorkflowStep
from pikku_django.workflows.store.base import WorkflowStore

#: Every status but succeeded: the statuses of the ``pikku_step_open`` index.
OPEN_STATUSES = tuple(s for s in StepStatus.values if s != StepStatus.SUCCEEDED)


@dataclass(frozen=True)
class _Entry:
    #: The run's succeeded steps by name; a succeeded step never changes.
    succeeded: dict[str, WorkflowStep]
    #: The highest step id seen: steps stored later have higher ids.
    max_id: int
    #: The steps seen that had not succeeded: they are read again.
    open_ids: tuple[int, ...]


class StepMemo:
    """Succeeded steps of recently passed runs, by run, for at most ``max_runs`` runs."""

    def __init__(self, max_runs: int = 512) -> None:
        self.max_runs = max_runs
        self._lock = threading.Lock()
        self._runs: OrderedDict[uuid.UUID, _Entry] = OrderedDict()

    def load(self, store: WorkflowStore, run_id: uuid.UUID) -> dict[str, WorkflowStep]:
        """The run's steps by name: the memo, with what may have changed read again
        (steps not yet succeeded, and steps stored after the memo was made)."""
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is not None:
                self._runs.move_to_end(run_id)
        steps = store.steps().filter(run_id=run_id).order_by()
        if entry is None:
            return {step.name: step for step in steps}
        changed = Q(id__gt=entry.max_id) | Q(status__in=OPEN_STATUSES)
        if entry.open_ids:
            changed |= Q(id__in=entry.open_ids)
        fresh = dict(entry.succeeded)
        for step in steps.filter(changed):
            fresh[step.name] = step
        return fresh

    def keep(self, run_id: uuid.UUID, steps: Iterable[WorkflowStep]) -> None:
        """Remember the steps a pass ended with."""
        succeeded: dict[str, WorkflowStep] = {}
        open_ids: list[int] = []
        max_id = 0
        for step in steps:
            max_id = max(max_id, step.id)
            if step.status == StepStatus.SUCCEEDED:
                succeeded[step.name] = step
            else:
                open_ids.append(step.id)
        entry = _Entry(succeeded, max_id, tuple(open_ids))
        with self._lock:
            self._runs[run_id] = entry
            self._runs.move_to_end(run_id)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)

    def forget(self, run_id: uuid.UUID) -> None:
        """Drop the run's memo (it ended, or is passed no more here)."""
        with self._lock:
            self._runs.pop(run_id, None)
