"""The workflow engine: starting runs, orchestration passes, and step execution.

:class:`WorkflowEngine` is the facade; each concern lives in a private module:
the run state machine (``_runs``), whole-run operations (``_lifecycle``), the pass
(``_replay``, with the step recorder the context talks to), step options
(``_options``), claims (``_claims``), execution (``_execution``), inline steps and
runs (``_inline_steps``, ``_inline``) and the per-vendor SQL (``store``).

Every write that a step's attempt makes is fenced by that attempt: it lands only
while the step is still ``running`` under the same attempt number, so a worker
that lost its claim can never overwrite the attempt that replaced it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.models import QuerySet
from django.utils import timezone

from pikku_django import signals
from pikku_django.leases import HeldLease, LeaseService, hold_lease
from pikku_django.models import StepAttempt, WorkflowRun, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows._claims import Claims
from pikku_django.workflows._deadlines import RunDeadlines
from pikku_django.workflows._debounce import check_debounce
from pikku_django.workflows._events import RunEvents
from pikku_django.workflows._execution import Execution
from pikku_django.workflows._inline import InlineDriver
from pikku_django.workflows._inline_steps import InlineSteps
from pikku_django.workflows._lifecycle import RunLifecycle
from pikku_django.workflows._published import published_values
from pikku_django.workflows._replay import Replay
from pikku_django.workflows._run_options import resolve_run_options
from pikku_django.workflows._run_waits import wait_for_run
from pikku_django.workflows._runs import LEASE_TAKEN_RETRY, RunStates
from pikku_django.workflows._sending import EventSender, RunRef
from pikku_django.workflows._signals_in import SentEvent
from pikku_django.workflows._values import (
    CarriedRun,
    ClaimedStep,
    DueRun,
    Settled,
    StepClaimer,
    StepOptions,
    StepOutcome,
    Wake,
    default_worker_id,
    to_json,
)
from pikku_django.workflows.clock import Clock
from pikku_django.workflows.config import EngineConfig, engine_config
from pikku_django.workflows.durations import Duration
from pikku_django.workflows.errors import WorkflowNotFoundError
from pikku_django.workflows.intake import intakes
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.store import NewRun, WorkflowStore, store_for

logger = workflow_logger(__name__)

__all__ = [
    "LEASE_TAKEN_RETRY",
    "CarriedRun",
    "ClaimedStep",
    "DueRun",
    "StepClaimer",
    "StepOptions",
    "StepOutcome",
    "Wake",
    "WorkflowEngine",
    "default_worker_id",
    "run_lease_key",
    "to_json",
]


def run_lease_key(run_id: uuid.UUID | str) -> str:
    """The lease key every orchestration pass of run ``run_id`` holds."""
    return f"workflow-run:{run_id}"


class WorkflowEngine:
    """Runs workflows stored in the ``using`` database.

    ``leases`` holds each run's orchestration lease (default: the project's lease
    service); ``clock`` decides when sleeps and retries are due; ``config`` holds the
    settings it runs by (default: the project's ``PIKKU``, read again when it changes).
    """

    def __init__(
        self,
        using: str | None = None,
        *,
        leases: LeaseService | None = None,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
    ) -> None:
        self._config = config
        self.using = using or self.config.database
        if self.using not in connections:
            raise ImproperlyConfigured(
                f"PIKKU['WORKFLOW_DATABASE'] is {self.using!r}, which is not in DATABASES"
            )
        self._leases = leases
        self.clock = clock or Clock()
        settings = lambda: self._config or engine_config()  # noqa: E731
        self.store: WorkflowStore = store_for(self.using, settings)
        self._states = RunStates(self.store, self.clock, RunEvents(self, self.using))
        self._lifecycle = RunLifecycle(self._states)
        self._claims = Claims(self._states, settings)
        self._execution = Execution(self._states, settings)
        self._inline_steps = InlineSteps(self._states, self._claims, self._execution)
        self._replay = Replay(self._inline_steps, settings, self.run_lease)
        self._driver = InlineDriver(
            self._claims, self._execution, self.orchestrate, self.get_run, self.run_lease
        )
        self._sender = EventSender(self._states, self._lifecycle, self.drive_inline)
        self._deadlines = RunDeadlines(self._states, self.cancel, self.drive_inline)

    # -- plumbing ---------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        """The settings this engine runs by."""
        return self._config or engine_config()

    @property
    def leases(self) -> LeaseService:
        if self._leases is None:
            from pikku_django.leases import get_lease_service

            self._leases = get_lease_service()
        return self._leases

    def runs(self) -> QuerySet[WorkflowRun]:
        return self.store.runs()

    def steps(self) -> QuerySet[WorkflowStep]:
        return self.store.steps()

    def attempts(self) -> QuerySet[StepAttempt]:
        return self.store.attempts()

    # -- starting, resuming, cancelling ---------------------------------------------

    def start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        inline: bool = False,
        priority: int | None = None,
        queue: str | None = None,
        start_at: datetime | None = None,
        delay: Duration | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        deadline: datetime | None = None,
        timeout: Duration | None = None,
        debounce: Duration | None = None,
    ) -> WorkflowRun:
        """Create a run (or return the one with this idempotency key) and wake it;
        ``inline`` runs it to an end in this process first. ``priority``, ``queue``,
        ``start_at``, ``delay``, the concurrency key and limit, ``deadline``,
        ``timeout`` and ``debounce`` are as
        :func:`~pikku_django.workflows.start_workflow` describes them."""
        definition = self._definition(workflow)
        window = check_debounce(debounce, idempotency_key, inline)
        options = resolve_run_options(
            definition,
            self.clock.now(),
            priority=priority,
            queue=queue,
            start_at=start_at,
            delay=delay,
            inline=inline,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            input=input,
            deadline=deadline,
            timeout=timeout,
            debounce=window,
        )
        run, created = self._lifecycle.start(
            definition,
            input,
            idempotency_key=idempotency_key,
            inline=inline,
            options=options,
            debounced=window is not None,
        )
        return self.drive_inline(run.id) if inline and created else run

    @staticmethod
    def _definition(workflow: str | Callable[..., Any]) -> registry.WorkflowDefinition:
        definition = registry.get_workflow(workflow)
        if definition is None:
            raise WorkflowNotFoundError(
                f"No workflow is registered as {workflow!r}. Registered: "
                f"{', '.join(registry.workflow_names()) or 'none'}"
            )
        return definition

    def create_runs(self, runs: Sequence[NewRun]) -> list[uuid.UUID]:
        """Create runs of registered workflows, due now (or after their workflow's
        delay) with its priority and queue, in the caller's transaction (for
        intakes): each one's id, the existing run's where its key is taken. Each
        input must already be plain JSON."""
        before = timezone.now()
        now = self.clock.now()
        ids = self.store.create_runs([self._with_defaults(new, now) for new in runs], now)
        if self._states.events.listened(signals.run_started) or logger.isEnabledFor(logging.INFO):
            # The runs made now, not the existing ones whose key was taken.
            for run in self.runs().filter(id__in=ids, created_at__gte=before):
                with log_context(workflow=run.workflow, run_id=str(run.id)):
                    logger.info("Run started")
                self._states.events.run_started(run)
        return ids

    @staticmethod
    def _with_defaults(new: NewRun, now: datetime) -> NewRun:
        definition = registry.get_workflow(new.workflow)
        if definition is None or new.options is not None:
            return new
        return replace(new, options=resolve_run_options(definition, now, input=new.input))

    def create_run(
        self, workflow: str, payload: Any, *, idempotency_key: str | None = None
    ) -> WorkflowRun:
        """Insert one run, due now, in the caller's transaction (see :meth:`create_runs`)."""
        (run_id,) = self.create_runs([NewRun(workflow, payload, idempotency_key)])
        return self.get_run(run_id)

    def get_run(self, run_id: uuid.UUID | str) -> WorkflowRun:
        return self._lifecycle.get(run_id)

    def resume(self, run_id: uuid.UUID | str, data: Any = None) -> WorkflowRun:
        """Resume a suspended run; its ``ctx.suspend()`` returns ``data``."""
        run = self._lifecycle.resume(run_id, data)
        if run.inline:
            # A resumed inline child is driven through its root run, so the
            # parents waiting on it (which no worker picks up) carry on too.
            root = self._states.inline_root(run.id)
            driven = self.drive_inline(root)
            return driven if root == run.id else self.get_run(run.id)
        return self.get_run(run.id)

    def cancel(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """Cancel a run that has not finished, and the child runs it is waiting for."""
        run, cancelled = self._lifecycle.cancel(run_id)
        if cancelled and run.inline:
            # An inline parent waiting on this run has just had its step failed;
            # no worker picks inline runs up, so carry the root on here.
            root = self._states.inline_root(run.id)
            if root != run.id:
                self.drive_inline(root)
        return self.get_run(run.id) if cancelled else run

    def retry(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """Retry a failed run from the step whose failure failed it.

        That step (and its compensation, if that failed too) is given one more
        attempt, which a worker claims as usual: earlier attempts stay in the
        history. A failed child run behind a child step is retried with it. A run
        that failed outside any step (its body raised) is woken to replay.
        WorkflowRunStateError if the run is not failed.
        """
        run = self._lifecycle.retry(run_id)
        if run.inline:
            return self.drive_inline(run.id)
        return self.get_run(run.id)

    # -- events, published values, waiting for a run ------------------------------------

    def send_event(
        self, run: RunRef, name: str, data: Any = None, *, event_id: str | None = None
    ) -> SentEvent:
        """Send the event ``name`` to a run (see :func:`~pikku_django.workflows.send_event`)."""
        return self._sender.send(run, name, data, event_id)

    def send_event_with_start(
        self,
        workflow: str | Callable[..., Any],
        idempotency_key: str,
        name: str,
        data: Any = None,
        *,
        input: Any = None,
        event_id: str | None = None,
        priority: int | None = None,
        queue: str | None = None,
    ) -> SentEvent:
        """Send an event to the run of ``idempotency_key``, starting it when none holds it."""
        definition = self._definition(workflow)
        options = resolve_run_options(definition, self.clock.now(), priority=priority, queue=queue)
        return self._sender.send_with_start(
            definition, idempotency_key, name, data, input=input, event_id=event_id, options=options
        )

    def published_values(self, run_id: uuid.UUID | str) -> dict[str, Any]:
        """The values the run has published with ``ctx.set_event``, by name."""
        return published_values(self.store, run_id)

    def wait_for_run(
        self, run_id: uuid.UUID | str, timeout: float, *, poll_interval: float | None = None
    ) -> WorkflowRun:
        """The run once it has ended; RunWaitTimeoutError after ``timeout`` seconds."""
        return wait_for_run(
            self.using, run_id, timeout, poll_interval, notifying=self.store.notifying
        )

    # -- orchestration ----------------------------------------------------------

    def run_lease(self, run_id: uuid.UUID | str) -> HeldLease:
        """The lease every orchestration pass of the run holds, for a ``with`` block."""
        return hold_lease(
            run_lease_key(run_id), ttl_ms=self.config.run_lease_ms, service=self.leases
        )

    def orchestrate(
        self,
        run_id: uuid.UUID | str,
        *,
        claimer: StepClaimer | None = None,
        held: HeldLease | None = None,
        carried: CarriedRun | None = None,
        due: DueRun | None = None,
    ) -> ClaimedStep | None:
        """One orchestration pass over a run, holding the run's lease.

        With a ``claimer``, a queued step the pass reaches is stored already claimed
        by that worker and returned, for it to execute next. ``held`` is the run's
        lease (from :meth:`run_lease`) when the caller holds it across several
        passes; otherwise the pass takes and releases it. ``carried`` (with
        ``held``) is the run as the caller's previous pass left it; ``due`` the run as
        :meth:`claim_due_run_rows` read it, so the pass does not read it again.
        """
        return self._replay.orchestrate(run_id, claimer, held, carried, due)

    def retry_pass_soon(self, run_id: uuid.UUID) -> None:
        """Wake a run a second from now: spends no retry budget."""
        self._states.wake_soon(run_id)

    def wake_run(self, run_id: uuid.UUID, at: datetime | None = None) -> None:
        """Mark a run as needing a pass (now, or at ``at``)."""
        self._states.wake(run_id, at)

    # -- claims and fenced writes -------------------------------------------------

    def claim_step(
        self, step_id: int, *, lease_ms: int | None = None, worker: str = ""
    ) -> ClaimedStep | None:
        """Claim one step for execution, by the claim decision; None if not claimable."""
        return self._claims.claim_step(step_id, lease_ms=lease_ms, worker=worker)

    def claim_step_for_execution(
        self, run_id: uuid.UUID | str, step_name: str, function: str, lease_ms: int
    ) -> ClaimedStep | None:
        """Claim the step ``step_name`` of a run that should call ``function``."""
        return self._claims.claim_named(run_id, step_name, function, lease_ms)

    def set_step_result(
        self, step_id: int, result: Any, attempt: int, *, wake: bool | str | Wake = True
    ) -> Settled | None:
        """Record the result of ``attempt``; WorkflowStepSupersededError if it was replaced.

        ``wake`` wakes the step's run for any worker (True), or not (False, or
        ``"pass"``: this thread passes the run next). Returns what the write found
        (None when the result was not storable and failed the step instead).
        """
        return self._execution.set_result(step_id, result, attempt, wake=Wake.of(wake))

    def set_step_error(
        self,
        step_id: int,
        error: BaseException | dict[str, Any],
        attempt: int,
        *,
        wake: bool | str | Wake = True,
        final: bool = False,
    ) -> bool:
        """Record that ``attempt`` failed; True if no attempt is left (see
        :meth:`set_step_result` for ``wake``)."""
        return self._execution.set_error(step_id, error, attempt, wake=Wake.of(wake), final=final)

    def refresh_step_lease(self, step_id: int, lease_ms: int | None, attempt: int) -> bool:
        """Extend (or, with None, park) the claim of ``attempt``; False once it was replaced."""
        return self.store.refresh_lease(step_id, lease_ms, attempt)

    def execute_step(self, claimed: ClaimedStep, *, wake: bool | str | Wake = True) -> StepOutcome:
        """Run a claimed queued step and record its outcome, fenced by its attempt.

        ``wake="pass"`` (:attr:`Wake.PASS`) leaves the run of a succeeded step for
        this thread to pass next.
        """
        return self._execution.execute_step(claimed, wake=Wake.of(wake))

    def step_attempt_started(self, claimed: ClaimedStep) -> tuple[Any, float]:
        """Announce that a claimed step's attempt starts (signals, span): the token
        :meth:`settle_step_call` takes, for a step whose function is called elsewhere."""
        return self._execution.attempt_started(claimed)

    def settle_step_call(
        self,
        claimed: ClaimedStep,
        started: tuple[Any, float],
        *,
        value: Any = None,
        error: Exception | None = None,
    ) -> StepOutcome:
        """Record what a claimed step's function returned or raised, fenced by its
        attempt, as :meth:`execute_step` does; its run is woken for any worker."""
        info, began = started
        return self._execution.settle_call(claimed, Wake.NOW, info, began, value=value, error=error)

    # -- finding work --------------------------------------------------------------

    def claim_due_runs(self, limit: int = 1) -> list[uuid.UUID]:
        """Runs that need a pass now; each is pushed back by the pass timeout meanwhile."""
        return self._claims.due_runs(limit)

    def claim_due_run_rows(self, limit: int = 1) -> list[DueRun]:
        """:meth:`claim_due_runs`, each run as the claim read it (for :meth:`orchestrate`)."""
        return self._claims.due_run_rows(limit)

    def claim_due_steps(
        self,
        queues: Iterable[str] | None = None,
        limit: int = 1,
        worker: str = "",
        *,
        busy: bool = False,
    ) -> list[ClaimedStep]:
        """Claim queued steps that are ready: scheduled, due for retry, or whose claim
        lapsed (``busy``: the caller's last look found some, so claim before looking)."""
        return self._claims.due_steps(queues, limit, worker, busy=busy)

    def enforce_deadlines(self, limit: int = 100) -> int:
        """Fail the runs past their deadline and time out the suspensions past theirs:
        how many were (workers do this on every look for due work)."""
        return self._deadlines.enforce(limit)

    def deadlines_due(self) -> bool:
        """Whether a run's deadline or a suspension's timeout is past now."""
        return self._deadlines.has_due()

    def start_waiting_runs(self, limit: int = 100) -> int:
        """Start the runs that registered intakes (stored webhook events...) hold for
        this engine: how many items now have their run."""
        return sum(intake.start_waiting(self, limit) for intake in intakes())

    def work_once(self, queues: Iterable[str] | None = None, worker: str = "") -> int:
        """Do one unit of due work (a pass, or a step), after starting the intakes'
        runs: how many units were done (each item given its run counts)."""
        done = self.start_waiting_runs()
        for run_id in self.claim_due_runs(1):
            self.orchestrate(run_id)
            done += 1
        for claimed in self.claim_due_steps(queues, 1, worker):
            self.execute_step(claimed)
            done += 1
        return done

    def run_until_idle(self, queues: Iterable[str] | None = None, max_units: int = 100_000) -> int:
        """Do due work in this thread until none is left now; how many units were done."""
        total = 0
        while total < max_units:
            done = self.work_once(queues)
            if not done:
                return total
            total += done
        raise RuntimeError(f"run_until_idle did {max_units} units and work was still due")

    def drive_inline(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """Run an inline run to an end (or suspension) in this process."""
        return self._driver.drive(run_id)
