"""A run's recorded steps as a pass holds them, and the memo of each run's steps a
process keeps between passes, so a pass reads only the steps that can have changed
since, not all of the run's steps."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q

from pikku_django.models import StepKind, StepStatus, WorkflowStep
from pikku_django.workflows.store.base import WorkflowStore

#: Every status but succeeded: the statuses of the ``pikku_step_open`` index.
OPEN_STATUSES = tuple(s for s in StepStatus.values if s != StepStatus.SUCCEEDED)


class RecordedSteps(dict[str, WorkflowStep]):
    """A run's recorded steps by name, and whether any is a ``ctx.patched`` marker
    (kept up to date as steps are added, so no pass looks through them for one)."""

    __slots__ = ("patch_markers",)

    def __init__(self, steps: Iterable[WorkflowStep] = ()) -> None:
        super().__init__((step.name, step) for step in steps)
        self.patch_markers = any(step.kind == StepKind.PATCH for step in self.values())

    def copy_steps(self) -> RecordedSteps:
        """A copy, made without a look at each step."""
        copied = RecordedSteps()
        copied.update(self)
        copied.patch_markers = self.patch_markers
        return copied

    def add(self, step: WorkflowStep) -> None:
        self[step.name] = step
        if step.kind == StepKind.PATCH:
            self.patch_markers = True


def recorded_steps(steps: dict[str, WorkflowStep]) -> RecordedSteps:
    """``steps`` as :class:`RecordedSteps` (the same object when it is one)."""
    return steps if isinstance(steps, RecordedSteps) else RecordedSteps(steps.values())


@dataclass(frozen=True)
class _Entry:
    #: The steps the run's last pass here ended with; its succeeded steps never change.
    #: Looked through only when a pass loads them, not each time a pass keeps them.
    steps: RecordedSteps


class StepMemo:
    """Steps of recently passed runs, by run, for at most ``max_runs`` runs."""

    def __init__(self, max_runs: int = 512) -> None:
        self.max_runs = max_runs
        self._lock = threading.Lock()
        self._runs: OrderedDict[uuid.UUID, _Entry] = OrderedDict()

    def load(self, store: WorkflowStore, run_id: uuid.UUID) -> RecordedSteps:
        """The run's steps by name: the memo's succeeded steps, with what may have
        changed read again (steps not succeeded, and steps stored after the memo)."""
        with self._lock:
            entry = self._runs.get(run_id)
            if entry is not None:
                self._runs.move_to_end(run_id)
        steps = store.steps().filter(run_id=run_id).order_by()
        if entry is None:
            return RecordedSteps(steps)
        # A copy (made in one step: a pass that lost the run's lease may still add
        # to the dict), without the steps that had not succeeded: those are read again.
        fresh = entry.steps.copy_steps()
        open_names: list[str] = []
        max_id = 0
        succeeded = StepStatus.SUCCEEDED.value
        for step in fresh.values():
            if step.id > max_id:
                max_id = step.id
            if step.status != succeeded:
                open_names.append(step.name)
        open_ids = [fresh.pop(name).id for name in open_names]
        changed = Q(id__gt=max_id) | Q(status__in=OPEN_STATUSES)
        if open_ids:
            changed |= Q(id__in=open_ids)
        for step in steps.filter(changed):
            fresh.add(step)
        return fresh

    def keep(self, run_id: uuid.UUID, steps: RecordedSteps) -> None:
        """Remember the steps a pass ended with (the pass's own dict, not a copy:
        later passes that carry it on only bring it further up to date)."""
        entry = _Entry(steps)
        with self._lock:
            self._runs[run_id] = entry
            self._runs.move_to_end(run_id)
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)

    def forget(self, run_id: uuid.UUID) -> None:
        """Drop the run's memo (it ended, or is passed no more here)."""
        with self._lock:
            self._runs.pop(run_id, None)
