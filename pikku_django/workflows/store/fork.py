"""The store's one write of a fork: a new run with the kept steps of the run it
re-runs copied into it (see :mod:`pikku_django.workflows.runs.forks`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db.models import QuerySet

from pikku_django.models import WorkflowEvent, WorkflowRun, WorkflowStep

#: Rows per INSERT when copying kept steps and events.
BATCH = 500

#: The columns a kept step is copied with (its id, run, group, timestamps and lease
#: are the copy's own).
STEP_COLUMNS = (
    "name",
    "kind",
    "function",
    "input",
    "status",
    "result",
    "error",
    "retries",
    "retry_delay",
    "backoff",
    "attempt",
    "child_run_id",
    "queue",
    "priority",
    "transactional",
    "timeout",
    "available_at",
)


@dataclass(frozen=True)
class ForkCopy:
    """What a fork writes: the new run (not saved yet), the original's steps it
    keeps (settled, in the order they were recorded) and the events those steps took."""

    run: WorkflowRun
    kept: Sequence[WorkflowStep]
    events: Sequence[WorkflowEvent]


class RunForks:
    """Writes a fork in one transaction; the original run is only read."""

    using: str

    if TYPE_CHECKING:  # the store's own (see WorkflowStore)

        def atomic(self) -> AbstractContextManager[Any]: ...

        def notify(self) -> None: ...

        def steps(self) -> QuerySet[WorkflowStep]: ...

    def create_fork(self, copy: ForkCopy) -> WorkflowRun:
        """Insert ``copy.run`` with a copy of each kept step (its parallel group
        pointing at the group's copy, no lease, no attempt history: the original
        keeps that) and of each event a kept step took, then announce the work."""
        run = copy.run
        with self.atomic():
            run.save(force_insert=True, using=self.using)
            rows = [
                WorkflowStep(run_id=run.pk, **{c: getattr(s, c) for c in STEP_COLUMNS})
                for s in copy.kept
            ]
            self.steps().bulk_create(rows, batch_size=BATCH)
            # Ids as the database gave them (bulk_create does not return them everywhere).
            ids = dict(self.steps().filter(run_id=run.pk).values_list("name", "id"))
            self._relink_groups(copy.kept, ids)
            self._copy_events(run.pk, copy, ids)
            if not run.inline:
                self.notify()
        return run

    def _relink_groups(self, kept: Sequence[WorkflowStep], ids: dict[str, int]) -> None:
        names = {s.pk: s.name for s in kept}
        branches: dict[int, list[int]] = {}
        for step in kept:
            if step.group_id is not None and step.group_id in names:
                branches.setdefault(ids[names[step.group_id]], []).append(ids[step.name])
        for group, members in branches.items():
            self.steps().filter(id__in=members).update(group_id=group)

    def _copy_events(self, run_id: uuid.UUID, copy: ForkCopy, ids: dict[str, int]) -> None:
        names = {s.pk: s.name for s in copy.kept}
        events = WorkflowEvent.objects.using(self.using)
        events.bulk_create(
            [
                WorkflowEvent(
                    run_id=run_id,
                    name=event.name,
                    event_id=event.event_id,
                    data=event.data,
                    step_id=ids[names[event.step_id]],
                )
                for event in copy.events
                if event.step_id in names
            ],
            batch_size=BATCH,
        )


__all__ = ["ForkCopy", "RunForks"]
