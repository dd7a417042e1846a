"""The workflow engine: starting runs, orchestration passes, and step execution.

:class:`WorkflowEngine` is the facade; each concern lives in a private module:
the run state machine (``_runs``), starting runs (``_starting``), whole-run
operations (``_lifecycle``), the pass (``_replay``, with the step recorder the
context talks to), step options (``_options``), claims (``_claims``), execution
(``_execution``), inline steps and runs (``_inline_steps``, ``_inline``), events,
published values and waits (``_sending``, as ``engine.events``), deadlines
(``_deadlines``, as ``engine.deadlines``) and the per-vendor SQL (``store``).

Every write that a step's attempt makes is fenced by that attempt: it lands only
while the step is still ``running`` under the same attempt number, so a worker
that lost its claim can never overwrite the attempt that replaced it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Unpack

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.models import QuerySet

from pikku_django.leases import HeldLease, LeaseService, hold_lease
from pikku_django.models import StepAttempt, WorkflowRun, WorkflowStep
from pikku_django.workflows._values import (
    CarriedRun,
    ClaimedStep,
    DueRun,
    RunLeaseAsk,
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
from pikku_django.workflows.control._deadlines import RunDeadlines
from pikku_django.workflows.passes._after_step import AfterStep, PassAfterStep
from pikku_django.workflows.passes._inline_runs import InlineDriver
from pikku_django.workflows.passes._inline_steps import InlineSteps
from pikku_django.workflows.passes._replay import Replay
from pikku_django.workflows.runs._bulk_start import BulkStarter, BulkStartOptions
from pikku_django.workflows.runs._django_signals import RunEvents
from pikku_django.workflows.runs._first_step import FirstSteps
from pikku_django.workflows.runs._lifecycle import RunLifecycle
from pikku_django.workflows.runs._sending import RunExchange
from pikku_django.workflows.runs._starting import RunStarts, StartOptions
from pikku_django.workflows.runs._state import LEASE_TAKEN_RETRY, RunStates
from pikku_django.workflows.steps._claims import Claims
from pikku_django.workflows.steps._execution import Execution
from pikku_django.workflows.store import NewRun, WorkflowStore, store_for
from pikku_django.workflows.worker.intake import start_waiting_runs

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

    Beside its own methods, ``events`` sends events to runs, reads the values they
    published and waits for their end (:class:`RunExchange`), ``deadlines`` times
    out runs and suspensions (``enforce()``, ``has_due()``), and ``execution``
    settles claimed steps whose function is called elsewhere (async steps).
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
        self._starts = RunStarts(self._lifecycle)
        self._bulk = BulkStarter(self._lifecycle)
        self._claims = Claims(self._states, settings)
        self.execution = Execution(self._states, settings)
        self._inline_steps = InlineSteps(self._states, self._claims, self.execution)
        self._first_steps = FirstSteps(self._inline_steps, settings, self.run_leases_in_store)
        self._lifecycle.find_first_step = self._first_steps.find
        self._replay = Replay(self._inline_steps, settings, self.run_lease)
        self._after_step = PassAfterStep(self._replay, self.execution.wake_at)
        self._driver = InlineDriver(
            self._claims, self.execution, self.orchestrate, self.get_run, self.run_lease
        )
        self._drive = self._driver.drive
        self.events = RunExchange(self._states, self._lifecycle, self._drive)
        self.deadlines = RunDeadlines(self._states, self.cancel, self._drive)

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
        self, workflow: str | Callable[..., Any], input: Any = None, **options: Unpack[StartOptions]
    ) -> WorkflowRun:
        """Create a run (or return the one with this idempotency key) and wake it;
        ``inline`` runs it to an end in this process first. The options are as
        :func:`~pikku_django.workflows.start_workflow` describes them."""
        run, created = self._starts.start(workflow, input, options)
        return self._drive(run.id) if options.get("inline", False) and created else run

    def start_many(
        self,
        workflow: str | Callable[..., Any],
        inputs: Iterable[Any],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
        **options: Unpack[BulkStartOptions],
    ) -> list[WorkflowRun]:
        """Start a run per input together (see
        :func:`~pikku_django.workflows.start_workflows`): the runs, in order."""
        return self._bulk.start(workflow, inputs, idempotency_keys, options)

    def create_runs(self, runs: Sequence[NewRun]) -> list[uuid.UUID]:
        """Create runs of registered workflows, due now (or after their workflow's
        delay) with its priority and queue, in the caller's transaction (for
        intakes): each one's id, the existing run's where its key is taken. Each
        input must already be plain JSON."""
        return self._starts.create_runs(runs)

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
            driven = self._drive(root)
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
                self._drive(root)
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
            return self._drive(run.id)
        return self.get_run(run.id)

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
        self,
        step_id: int,
        result: Any,
        attempt: int,
        *,
        wake: bool | str | Wake = True,
        token: int | None = None,
    ) -> Settled | None:
        """Record the result of ``attempt``; WorkflowStepSupersededError if it was replaced.

        ``wake`` wakes the step's run for any worker (True), or not (False, or
        ``"pass"``: this thread passes the run next). ``token``: the claim's
        (:attr:`ClaimedStep.claim_token`), refused once the step was claimed again
        (None: fenced by ``attempt`` alone). Returns what the write found (None when
        the result was not storable and failed the step instead).
        """
        return self.execution.set_result(step_id, result, attempt, wake=Wake.of(wake), token=token)

    def set_step_error(
        self,
        step_id: int,
        error: BaseException | dict[str, Any],
        attempt: int,
        *,
        wake: bool | str | Wake = True,
        final: bool = False,
        token: int | None = None,
    ) -> bool:
        """Record that ``attempt`` failed; True if no attempt is left (see
        :meth:`set_step_result` for ``wake`` and ``token``)."""
        return self.execution.set_error(
            step_id, error, attempt, wake=Wake.of(wake), final=final, token=token
        )

    def refresh_step_lease(
        self, step_id: int, lease_ms: int | None, attempt: int, token: int | None = None
    ) -> bool:
        """Extend (or, with None, park) the claim of ``attempt`` (with the claim
        ``token``; None: whichever); False once it was replaced."""
        return self.store.refresh_lease(step_id, lease_ms, attempt, token)

    def execute_step(self, claimed: ClaimedStep, *, wake: bool | str | Wake = True) -> StepOutcome:
        """Run a claimed queued step and record its outcome, fenced by its attempt.

        ``wake="pass"`` (:attr:`Wake.PASS`) leaves the run of a succeeded step for
        this thread to pass next.
        """
        return self.execution.execute_step(claimed, wake=Wake.of(wake))

    def execute_and_pass(
        self, claimed: ClaimedStep, claimer: StepClaimer, held: HeldLease
    ) -> tuple[StepOutcome, AfterStep | None]:
        """Run a claimed queued step of a run this thread carries under ``held`` (its
        run lease), and pass the run after its success with that success recorded
        (the next step stored claimed by ``claimer``, or the run ended): how the step
        ended, and what the pass after it did (None: not written; pass it as usual)."""
        taken: list[AfterStep] = []
        release = held.lease if self.run_leases_in_store() else None

        def then(result: Any) -> Settled | None:
            after = self._after_step.run(claimed, result, claimer, held, release)
            if after is None:
                return None
            taken.append(after)
            return after.settled

        outcome = self.execution.execute_step(claimed, wake=Wake.PASS, then=then)
        return outcome, taken[0] if taken else None

    # -- finding work --------------------------------------------------------------

    def claim_due_runs(self, limit: int = 1) -> list[uuid.UUID]:
        """Runs that need a pass now; each is pushed back by the pass timeout meanwhile."""
        return self._claims.due_runs(limit)

    def claim_due_run_rows(
        self, limit: int = 1, *, lease_holder: str = "", claimer: StepClaimer | None = None
    ) -> list[DueRun]:
        """:meth:`claim_due_runs`, each run as the claim read it (for :meth:`orchestrate`).
        With ``lease_holder``, where the runs' database holds their leases too, each
        run's lease is taken for that holder by the claim itself (``DueRun.lease``),
        and with ``claimer`` each run's first step found at its start is stored
        claimed by it (see :meth:`first_step_claimed`)."""
        ask = None
        if lease_holder and self.run_leases_in_store():
            first = self._first_steps.ask(claimer)
            ask = RunLeaseAsk(run_lease_key(""), lease_holder, self.config.run_lease_ms, first)
        return self._claims.due_run_rows(limit, ask)

    def first_step_claimed(self, due: DueRun, claimer: StepClaimer) -> ClaimedStep | None:
        """The first step the claim of ``due`` stored claimed by ``claimer``: run it
        (carrying its run) in place of the run's first pass. None: it stored none."""
        return self._first_steps.claimed(due, claimer.worker)

    def run_leases_in_store(self) -> bool:
        """Whether run leases are rows of the runs' own database, which its store can
        take and release with other work."""
        from pikku_django.leases.database import DatabaseLeaseService

        leases = self.leases
        return (
            self.store.takes_run_leases
            and isinstance(leases, DatabaseLeaseService)
            and leases.using == self.using
        )

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

    def work_once(self, queues: Iterable[str] | None = None, worker: str = "") -> int:
        """Do one unit of due work (a pass, or a step), after starting the intakes'
        runs: how many units were done (each item given its run counts)."""
        done = start_waiting_runs(self)
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
