"""Runs started together: a batch of new runs and their opening steps inserted in
multi-row inserts (PostgreSQL's store inserts them in one statement, ``start_runs``),
the runs whose idempotency key is taken left out, the work announced once."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from pikku_django.models import StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows._values import NewStep


class BulkStarts:
    """Inserts batches of new runs (a mixin of :class:`WorkflowStore`)."""

    #: The database alias (the store's).
    using: str

    if TYPE_CHECKING:

        def notify(self) -> None: ...

    def insert_runs(
        self, runs: Sequence[WorkflowRun], openings: Sequence[tuple[NewStep, datetime]]
    ) -> set[uuid.UUID]:
        """Insert the new ``runs`` (but those whose idempotency key is taken) and the
        opening steps of those made, each scheduled at its time, in the caller's
        transaction, and announce the work once if any run was made: the ids made."""
        if not runs:
            return set()
        keyed = any(run.idempotency_key is not None for run in runs)
        # Django splits the rows only where the database caps a statement's parameters.
        WorkflowRun.objects.using(self.using).bulk_create(runs, ignore_conflicts=keyed)
        ids = [run.id for run in runs]
        made = (
            set(
                WorkflowRun.objects.using(self.using)
                .filter(id__in=ids)
                .values_list("id", flat=True)
            )
            if keyed
            else set(ids)
        )
        steps = scheduled_steps((step, due) for step, due in openings if step.run_id in made)
        if steps:
            WorkflowStep.objects.using(self.using).bulk_create(steps)
        saved(runs, made, self.using)
        if made:
            self.notify()
        return made


def scheduled_steps(openings: Iterable[tuple[NewStep, datetime | None]]) -> list[WorkflowStep]:
    """The rows of new steps, each scheduled at its time."""
    return [
        WorkflowStep(**step.columns(), status=StepStatus.SCHEDULED, available_at=due)
        for step, due in openings
    ]


def saved(runs: Iterable[WorkflowRun], made: set[uuid.UUID], using: str) -> None:
    """Mark the ``runs`` made as saved in ``using`` (the rest as never saved)."""
    for run in runs:
        run._state.adding = run.id not in made
        run._state.db = using
