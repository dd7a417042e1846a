"""The step-level writes a pass makes besides claiming and settling attempts: steps
it records itself (markers, groups, waits), a withdrawn attempt, a parallel group's
count of open branches, the events sent to runs, and the run locks and owed passes
these take; with the fence of every claimed attempt's write."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from pikku_django.models import (
    Backoff,
    RunStatus,
    StepAttempt,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStep,
)


def running_attempt(step_id: int, attempt: int, token: int | None) -> Q:
    """The fence of every write and refresh of a claimed attempt: the step still
    running under ``attempt`` and the claim ``token`` (None: the attempt alone), so
    that the writes of a replaced attempt, or of a claim lost with a failed-over
    database, match nothing."""
    fence = Q(id=step_id, attempt=attempt, status=StepStatus.RUNNING)
    return fence if token is None else fence & Q(claim_token=token)


@dataclass(frozen=True)
class StepRow:
    """A step a pass records itself, with the columns it sets (the model's defaults
    for the rest)."""

    run_id: uuid.UUID
    name: str
    kind: str
    status: str = StepStatus.PENDING
    function: str = ""
    input: Any = None
    result: Any = None
    error: Any = None
    attempt: int = 0
    retries: int = 5
    retry_delay: float = 0
    backoff: str = Backoff.FIXED
    queue: str = "default"
    transactional: bool = False
    timeout: float | None = None
    available_at: datetime | None = None
    priority: int = 0
    group_id: int | None = None

    def columns(self) -> dict[str, Any]:
        """The step's columns as model field values."""
        return dict(vars(self))


@dataclass(frozen=True)
class Recorded:
    """A step :meth:`StepWrites.record_step` wrote, or found stored first (``new``
    False)."""

    step: WorkflowStep
    new: bool


class BranchSettled(enum.Enum):
    """What a settled child branch did to its parallel group's count."""

    #: The group was joined already (or is gone): nothing to do.
    JOINED = "joined"
    #: Other branches are still open.
    OPEN = "open"
    #: The last open branch settled: the run needs a pass.
    LAST = "last"
    #: A branch failed: the run needs a pass at once (a fail-fast join cancels the rest).
    FAILED = "failed"

    @property
    def wakes_run(self) -> bool:
        return self in (BranchSettled.LAST, BranchSettled.FAILED)


class StepWrites:
    """The step-level writes of a store (through the ORM, on every database)."""

    #: The database alias (the store's).
    using: str

    def record_step(self, row: StepRow) -> Recorded:
        """Insert ``row``, unless another pass of the run stored a step of its name
        first (that step, then)."""
        steps = WorkflowStep.objects.using(self.using)
        try:
            with transaction.atomic(using=self.using):
                return Recorded(steps.create(**row.columns()), new=True)
        except IntegrityError:
            return Recorded(steps.get(run_id=row.run_id, name=row.name), new=False)

    def withdraw_attempt(
        self, step_id: int, attempt: int, *, error: Any, token: int | None = None
    ) -> bool:
        """Suspend a step whose ``attempt`` cannot run (its function is missing here),
        as if that attempt never started: the step back at the attempt before it, the
        attempt's history row deleted, ``error`` recorded. Fenced by the attempt and
        its claim ``token``: False (nothing written) if the attempt was replaced."""
        with transaction.atomic(using=self.using):
            won = (
                WorkflowStep.objects.using(self.using)
                .filter(running_attempt(step_id, attempt, token))
                .update(
                    status=StepStatus.SUSPENDED,
                    error=error,
                    lease_expires_at=None,
                    attempt=attempt - 1,
                    updated_at=timezone.now(),
                )
            )
            if won:
                StepAttempt.objects.using(self.using).filter(
                    step_id=step_id, attempt=attempt
                ).delete()
        return bool(won)

    def settle_branch(self, group_id: int, *, failed: bool) -> BranchSettled:
        """Count a child branch of the parallel group ``group_id`` settled.

        The row's update serialises the group's branches, and each reads the count
        its own update left, so exactly the one that brings it to zero sees zero.
        """
        group = WorkflowStep.objects.using(self.using).order_by().filter(id=group_id)
        counted = group.filter(status=StepStatus.RUNNING).update(
            open_branches=F("open_branches") - 1
        )
        if not counted:
            return BranchSettled.JOINED
        if failed:
            return BranchSettled.FAILED
        left = group.values_list("open_branches", flat=True).first()
        return BranchSettled.LAST if left is not None and left <= 0 else BranchSettled.OPEN

    def lock_run(self, run_id: uuid.UUID | str) -> bool:
        """Take the run's row lock for the caller's transaction (a write that changes
        nothing, so it locks on every database): whether the run exists."""
        runs = WorkflowRun.objects.using(self.using)
        return bool(runs.filter(id=run_id).update(wakes=F("wakes")))

    def locked_run_status(self, run_id: uuid.UUID) -> str | None:
        """The run's status, its row locked for the caller's transaction where the
        database locks rows (None if there is no such run)."""
        runs = WorkflowRun.objects.using(self.using).select_for_update().filter(id=run_id)
        status: str | None = runs.values_list("status", flat=True).first()
        return status

    def due_for_pass(self, run_id: uuid.UUID, at: datetime) -> bool:
        """Make the running run ``run_id`` due for a pass at ``at`` (not counted as a
        wake): whether it is running."""
        runs = WorkflowRun.objects.using(self.using)
        return bool(
            runs.filter(id=run_id, status=RunStatus.RUNNING).update(
                wake_at=at, updated_at=timezone.now()
            )
        )

    def add_event(
        self, run_id: uuid.UUID, name: str, event_id: str, data: Any
    ) -> WorkflowEvent | None:
        """Store an event sent to the run; None (nothing written) if the run has one
        with ``event_id`` already."""
        try:
            with transaction.atomic(using=self.using):
                return WorkflowEvent.objects.using(self.using).create(
                    run_id=run_id, name=name, event_id=event_id, data=data
                )
        except IntegrityError:
            return None

    def take_event(self, event_id: int, step_id: int) -> None:
        """Record that the wait step ``step_id`` took the event (row id ``event_id``)."""
        WorkflowEvent.objects.using(self.using).filter(id=event_id).update(step_id=step_id)
