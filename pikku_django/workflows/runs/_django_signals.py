"""Sending :mod:`pikku_django.signals` from the engine, once the write they report commits."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from pikku_django import signals
from pikku_django.models import RunStatus, StepAttempt, WorkflowRun
from pikku_django.workflows._values import CarriedRun, ClaimedStep, Settled


@dataclass(frozen=True)
class AttemptInfo:
    """What the step-attempt signals say about the run and the claim."""

    run_id: uuid.UUID
    workflow: str
    step: str
    attempt: int
    queue: str
    worker: str
    claim_latency: float | None
    trace_context: Any

    def arguments(self) -> dict[str, Any]:
        """The arguments every step-attempt signal has."""
        return {
            "run_id": self.run_id,
            "workflow": self.workflow,
            "step": self.step,
            "attempt": self.attempt,
            "queue": self.queue,
            "worker": self.worker,
        }


STEP_SIGNALS = (
    signals.step_attempt_started,
    signals.step_attempt_succeeded,
    signals.step_attempt_failed,
    signals.step_attempt_superseded,
)


def seconds_since(moment: datetime | None) -> float | None:
    return None if moment is None else max(0.0, (timezone.now() - moment).total_seconds())


def carried_attempt_info(claimed: ClaimedStep, carried: CarriedRun) -> AttemptInfo | None:
    """The attempt's info from the run its pass carries, without a query; None when
    the carried run lacks something (a field not loaded, the step's creation time)."""
    run = carried.run
    step = carried.steps.get(claimed.name)
    if not claimed.worker or step is None or step.id != claimed.step_id:
        return None
    if {"workflow", "trace_context"} & run.get_deferred_fields():
        return None
    latency = None
    if claimed.attempt == 1:
        created: datetime | None = step.created_at  # None until the row is read back
        if created is None:  # stored by the statement that claimed it
            latency = 0.0
        elif claimed.started_at is not None:
            latency = max(0.0, (claimed.started_at - created).total_seconds())
        else:
            return None
    return AttemptInfo(
        claimed.run_id,
        run.workflow,
        claimed.name,
        claimed.attempt,
        claimed.queue,
        claimed.worker,
        latency,
        run.trace_context,
    )


class RunEvents:
    """Sends the engine's signals, with ``sender`` the engine, after the current
    transaction on its database commits (at once outside one)."""

    def __init__(self, sender: Any, using: str) -> None:
        self.sender = sender
        self.using = using

    def listened(self, *which: Signal) -> bool:
        return any(signal.has_listeners(self.sender) for signal in which)

    def send(self, signal: Signal, **kwargs: Any) -> None:
        if not signal.has_listeners(self.sender):
            return
        transaction.on_commit(lambda: signals.send(signal, self.sender, **kwargs), using=self.using)

    def send_lazily(self, signal: Signal, arguments: Callable[[], dict[str, Any]]) -> None:
        """As :meth:`send`, with the arguments made only when someone listens."""
        if signal.has_listeners(self.sender):
            self.send(signal, **arguments())

    # -- runs ------------------------------------------------------------------------------

    def run_started(self, run: WorkflowRun, parent_run_id: uuid.UUID | None = None) -> None:
        self.send(
            signals.run_started,
            run_id=run.id,
            workflow=run.workflow,
            input=run.input,
            parent_run_id=parent_run_id,
            trace_context=run.trace_context,
        )

    def run_finished(self, run: WorkflowRun, status: str, error: Any = None) -> None:
        error_type = error.get("type") if isinstance(error, dict) else None
        self.send(
            signals.run_finished,
            run_id=run.id,
            workflow=run.workflow,
            status=str(status),
            error_type=error_type,
            duration=seconds_since(run.created_at),
        )

    def run_completed_by_step(self, settled: Settled) -> None:
        """:meth:`run_finished` for a run its last step's settle completed."""
        if signals.run_finished.has_listeners(self.sender):
            run = WorkflowRun(id=settled.run_id, workflow=settled.workflow)
            run.created_at = settled.run_created_at  # type: ignore[assignment]
            self.run_finished(run, RunStatus.COMPLETED)

    def run_suspended(self, run: WorkflowRun, reason: str) -> None:
        self.send(signals.run_suspended, run_id=run.id, workflow=run.workflow, reason=reason)

    def run_pass_started(self, run: WorkflowRun) -> None:
        self.send(
            signals.run_pass_started,
            run_id=run.id,
            workflow=run.workflow,
            trace_context=run.trace_context,
        )

    def run_pass_finished(self, run: WorkflowRun) -> None:
        """The pass over ``run`` ended (in a ``finally``): its status is read afresh."""

        def arguments() -> dict[str, Any]:
            try:
                found = WorkflowRun.objects.using(self.using).filter(id=run.id)
                status: str | None = found.values_list("status", flat=True).first()
            except Exception:  # the pass's own error is what matters
                status = None
            return {
                "run_id": run.id,
                "workflow": run.workflow,
                "trace_context": run.trace_context,
                "status": status,
            }

        self.send_lazily(signals.run_pass_finished, arguments)

    # -- steps -----------------------------------------------------------------------------

    def attempt_info(self, claimed: ClaimedStep) -> AttemptInfo | None:
        """The run and claim of a step's attempt (one query), or None when nobody listens."""
        if not self.listened(*STEP_SIGNALS):
            return None
        if claimed.carried is not None:
            carried = carried_attempt_info(claimed, claimed.carried)
            if carried is not None:
                return carried
        row = (
            StepAttempt.objects.using(self.using)
            .of_attempt(claimed.step_id, claimed.attempt)
            .values(
                "worker",
                "started_at",
                "step__created_at",
                "step__run__workflow",
                "step__run__trace_context",
            )
            .first()
        )
        if row is None:  # no attempt row (yet): what the run says
            run = WorkflowRun.objects.using(self.using).filter(id=claimed.run_id)
            found = run.values_list("workflow", "trace_context").first()
            workflow, trace_context = found if found is not None else ("", None)
            return AttemptInfo(
                claimed.run_id,
                workflow,
                claimed.name,
                claimed.attempt,
                claimed.queue,
                "",
                None,
                trace_context,
            )
        latency = None
        if (
            claimed.attempt == 1 and row["step__created_at"] is not None
        ):  # later ones wait a retry delay
            latency = max(0.0, (row["started_at"] - row["step__created_at"]).total_seconds())
        return AttemptInfo(
            claimed.run_id,
            row["step__run__workflow"],
            claimed.name,
            claimed.attempt,
            claimed.queue,
            row["worker"],
            latency,
            row["step__run__trace_context"],
        )

    def inline_attempt_info(
        self, run: WorkflowRun, step: str, queue: str, worker: str
    ) -> AttemptInfo | None:
        """The first attempt of an inline step, run in the pass (claimed at once)."""
        if not self.listened(*STEP_SIGNALS):
            return None
        return AttemptInfo(run.id, run.workflow, step, 1, queue, worker, 0.0, run.trace_context)

    def step_attempt_started(self, info: AttemptInfo | None) -> None:
        if info is not None:
            self.send(
                signals.step_attempt_started,
                **info.arguments(),
                claim_latency=info.claim_latency,
                trace_context=info.trace_context,
            )

    def step_attempt_succeeded(self, info: AttemptInfo | None, duration: float) -> None:
        if info is not None:
            self.send(signals.step_attempt_succeeded, **info.arguments(), duration=duration)

    def step_attempt_failed(
        self,
        info: AttemptInfo | None,
        duration: float,
        error: BaseException,
        *,
        will_retry: bool,
    ) -> None:
        if info is not None:
            self.send(
                signals.step_attempt_failed,
                **info.arguments(),
                duration=duration,
                error_type=type(error).__name__,
                error_message=str(error),
                will_retry=will_retry,
                exception=error,
            )

    def step_attempt_superseded(self, info: AttemptInfo | None, duration: float) -> None:
        """The attempt lost its lease to a later one: nothing it did was recorded."""
        if info is not None:
            self.send(signals.step_attempt_superseded, **info.arguments(), duration=duration)
