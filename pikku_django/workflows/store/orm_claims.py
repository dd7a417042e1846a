"""The claim decision of the ORM stores: made in Python, each outcome one guarded
UPDATE (PostgreSQL's is one statement, in ``postgresql_sql``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from pikku_django.dbclock import EpochMs
from pikku_django.models import AttemptStatus, RunStatus, StepKind, StepStatus, WorkflowStep
from pikku_django.workflows.control._pause_conditions import paused
from pikku_django.workflows.errors import WorkflowStepLeaseExpiredError, serialize_error
from pikku_django.workflows.store.base import WorkflowStore
from pikku_django.workflows.store.decisions import Decision, Started, Verdict


class OrmClaims(WorkflowStore):
    """Claims through the ORM."""

    #: The claim token of a step stored claimed (its first claim).
    first_claim_token = 1

    def next_claim_token(self) -> Any:
        """The claim token a claim of a step sets (an expression on its row)."""
        return F("claim_token") + 1

    def decide_claim(
        self, step: WorkflowStep, *, lease_ms: int, worker: str, pausable: bool, now: datetime
    ) -> Decision:
        pausable = pausable and step.kind == StepKind.QUEUED
        status, attempt = step.status, step.attempt
        exhausted = attempt >= step.attempts_allowed
        if status in (StepStatus.SUCCEEDED, StepStatus.SUSPENDED):
            return Decision(Verdict.NONE, attempt=attempt)
        if status == StepStatus.RUNNING:
            lease = step.lease_expires_at
            if lease is None or lease >= step.store_now:  # type: ignore[attr-defined]
                return Decision(Verdict.NONE, attempt=attempt)  # live, or parked on a child
            if self._past_timeout(step):
                return Decision(Verdict.TIMED_OUT, attempt=attempt)
            lapsed = Q(status=status, attempt=attempt, lease_expires_at__lt=EpochMs())
            if exhausted:
                won = self._fail_lease_expired(step, lapsed)
                return Decision(Verdict.EXPIRED, won, attempt=attempt)
            started = self.claim_attempt(
                step, lapsed, lease_ms=lease_ms, worker=worker, pausable=pausable
            )
            return _decided(attempt, True, started)
        due = step.available_at
        if due is not None and due > now:
            return Decision(Verdict.NONE, attempt=attempt)  # a retry waits for its delay
        if status == StepStatus.FAILED and exhausted:
            return Decision(Verdict.NONE, attempt=attempt)
        # failed with an attempt left, pending or scheduled
        guard = Q(status=status, attempt=attempt)
        started = self.claim_attempt(
            step, guard, lease_ms=lease_ms, worker=worker, pausable=pausable
        )
        return _decided(attempt, False, started)

    def _past_timeout(self, step: WorkflowStep) -> bool:
        """Whether the lapsed attempt of ``step`` began at least its timeout ago."""
        if step.timeout is None:
            return False
        started = (
            self.attempts()
            .filter(step_id=step.id, attempt=step.attempt)
            .values_list("started_at", flat=True)
            .first()
        )
        return started is None or started + timedelta(seconds=step.timeout) <= timezone.now()

    def _fail_lease_expired(self, step: WorkflowStep, guard: Q) -> bool:
        """Fail ``step``, whose lapsed claim had no attempt left: whether this did."""
        error = serialize_error(WorkflowStepLeaseExpiredError(step.name, step.attempts_allowed))
        with self.atomic():
            won = (
                self.steps()
                .filter(guard, id=step.id)
                .update(
                    status=StepStatus.FAILED,
                    error=error,
                    lease_expires_at=None,
                    available_at=None,
                    updated_at=timezone.now(),
                )
            )
            if won:
                self.attempts().filter(step_id=step.id, attempt=step.attempt).update(
                    status=StepStatus.FAILED, error=error, finished_at=timezone.now()
                )
        return bool(won)

    def claim_attempt(
        self,
        step: WorkflowStep,
        guard: Q,
        *,
        lease_ms: int,
        worker: str,
        pausable: bool = False,
    ) -> Started | None:
        attempt = step.attempt + 1
        # Only a step of a running run is claimed, by whichever route: a cancelled
        # (or otherwise settled) run's steps never run again.
        live_runs = self.runs().filter(status=RunStatus.RUNNING).values("id")
        now = timezone.now()
        # Within a claim's transaction no savepoint: a failure here ends that claim.
        with transaction.atomic(using=self.using, savepoint=False):
            claimable = self.steps().filter(guard, id=step.id, run_id__in=live_runs)
            if pausable:
                claimable = claimable.exclude(paused(self.using))
            won = claimable.update(
                status=StepStatus.RUNNING,
                attempt=attempt,
                claim_token=self.next_claim_token(),
                result=None,
                error=None,
                available_at=None,
                lease_expires_at=EpochMs() + lease_ms,
                updated_at=now,
            )
            if not won:
                return None
            if step.status == StepStatus.RUNNING:
                # The attempt whose claim lapsed is closed as replaced, never with an
                # outcome: whatever it still writes is refused.
                self.attempts().filter(
                    step_id=step.id, attempt=step.attempt, status=AttemptStatus.RUNNING
                ).update(status=AttemptStatus.SUPERSEDED, finished_at=now)
            # Started when its lease starts (``now`` was read before the lease's clock):
            # a lease capped at the timeout then lapses no sooner than the timeout.
            row = self.attempts().create(
                step_id=step.id,
                attempt=attempt,
                status=StepStatus.RUNNING,
                worker=worker[:255],
                started_at=now,
            )
            token = self.steps().filter(id=step.id).values_list("claim_token", flat=True).get()
        return Started(row.started_at, int(token))


def _decided(attempt: int, reclaimed: bool, started: Started | None) -> Decision:
    """The decision to claim ``attempt`` + 1, and whether the claim was made."""
    if started is None:
        return Decision(Verdict.CLAIM, False, attempt, reclaimed)
    return Decision(Verdict.CLAIM, True, attempt, reclaimed, started.at, started.claim_token)
