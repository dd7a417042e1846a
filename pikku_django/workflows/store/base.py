"""What the engine asks of the database holding its runs, steps and attempts.

Each operation is one atomic unit and is written once per database vendor (see
:func:`pikku_django.workflows.store.store_for`). Values written are handed back as
a read of the database returns them.
"""

from __future__ import annotations

import abc
import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.db.models import QuerySet

from pikku_django.leases.base import Lease
from pikku_django.models import StepAttempt, WorkflowRun, WorkflowStep
from pikku_django.workflows._values import (
    Chained,
    DueRun,
    NewStep,
    NextDue,
    RunLeaseAsk,
    Settled,
    StepDone,
    Wake,
)
from pikku_django.workflows.config import EngineConfig, engine_config
from pikku_django.workflows.control._pause_conditions import paused_look
from pikku_django.workflows.control.queues import Rate
from pikku_django.workflows.runs._options import RunOptions
from pikku_django.workflows.store.bulk_starts import BulkStarts
from pikku_django.workflows.store.decisions import Decision, Started
from pikku_django.workflows.store.fork import RunForks
from pikku_django.workflows.store.queue_writes import QueueWrites
from pikku_django.workflows.store.run_writes import RunWrites
from pikku_django.workflows.store.step_writes import StepWrites


def columns(model: type[models.Model], names: Sequence[str], quote: Callable[[str], str]) -> str:
    """The quoted columns of ``model``'s fields ``names`` (field or attribute names)."""
    meta = model._meta
    by_name = {f.name: f for f in meta.concrete_fields} | {
        f.attname: f for f in meta.concrete_fields
    }
    return ", ".join(quote(str(by_name[name].column)) for name in names)


@dataclass(frozen=True)
class NewRun:
    """A run handed to the engine to create: a registered workflow's name, its input
    (plain JSON) and, optionally, the idempotency key that makes it unique and its
    run options (None: the defaults, due at once)."""

    workflow: str
    input: Any
    idempotency_key: str | None = None
    options: RunOptions | None = None

    @property
    def run_options(self) -> RunOptions:
        return self.options or RunOptions()

    def row(self, now: datetime) -> WorkflowRun:
        """The new run's row, due at ``now`` (or its own later ``start_at``): no opening
        or first step, and no trace context or version, as intakes have always made it."""
        return WorkflowRun(
            workflow=self.workflow,
            input=self.input,
            idempotency_key=self.idempotency_key,
            **self.run_options.run_columns(now),
        )


@dataclass(frozen=True)
class LimitedClaim:
    """What one limited queue's claim of fresh steps made: each step as claimed and
    its lease; the rate slots it found free (0 without a rate) and the steps it
    wanted (the caller's limit, bounded by the queue's room)."""

    steps: list[tuple[WorkflowStep, int]]
    slots: int
    wanted: int

    @property
    def slots_short(self) -> bool:
        """Whether the rate's free slots, not the ready steps or the room, bounded the
        claim (the queue may lack slots it has not made yet)."""
        return self.slots < self.wanted and len(self.steps) == self.slots


class FreshClaims:
    """The claims of steps not attempted yet that a store may make in one statement
    (see :class:`WorkflowStore`); by default it has none, and its callers claim
    through :meth:`WorkflowStore.lock_ready_steps`."""

    def claim_fresh_steps(
        self,
        now: datetime,
        queues: Sequence[str],
        limit: int,
        *,
        worker: str,
        leases: Mapping[str, int],
        default_lease_ms: int,
        exclude: Sequence[str] = (),
        started_at: datetime | None = None,
    ) -> list[tuple[WorkflowStep, int]]:
        """Claim, in one statement where the database allows, ready steps that have not
        been attempted yet (scheduled or pending, and due) of running worker runs in
        ``queues`` (all when empty) but not in ``exclude``, as their next attempt under
        this worker's lease (``leases`` by queue, else ``default_lease_ms``, capped by
        each one's timeout), started at ``started_at`` (None: now), in the claim order:
        each step as claimed and its lease. Empty where the store has no such
        statement: the caller claims through :meth:`lock_ready_steps`."""
        return []

    def claim_fresh_limited(
        self,
        now: datetime,
        queue: str,
        limit: int,
        *,
        worker: str,
        lease_ms: int,
        concurrency: int | None,
        rate: Rate | None,
    ) -> LimitedClaim | None:
        """:meth:`claim_fresh_steps` of the limited ``queue`` alone, in one statement
        that counts its limits: at most ``concurrency`` of its steps under a live
        lease, and one free rate slot (see ``_rates``) locked and stamped per claim.
        None where the store has no such statement."""
        return None

    def retries_or_lapsed_exist(self, now: datetime, queues: Sequence[str]) -> bool:
        """Whether a queued step of ``queues`` (all when empty) is ready but not fresh:
        a failed attempt's retry is due, or a claim lapsed. True where the store cannot
        tell cheaply (its callers then claim in the claim order)."""
        return True

    def first_fresh_queue(self, now: datetime, queues: Sequence[str]) -> str | None:
        """The queue of the first step :meth:`claim_fresh_steps` would claim from
        ``queues`` (all when empty), or None (also where the store cannot tell)."""
        return None


class ChainedWrites:
    """A step's success written in one statement with what the pass after it does
    (claim the next step, or end the run), where the store has such statements; by
    default it has none, and its callers write both in one transaction."""

    #: Whether :meth:`settle_then_claim` and :meth:`settle_then_finish` are statements.
    chains_in_one_statement = False
    #: Whether :meth:`claim_due_runs_leased` takes run leases held by ``pikku_lease``
    #: (and, asked to, stores each claimed run's first step claimed).
    takes_run_leases = False

    def claim_due_runs_leased(
        self, now: datetime, until: datetime, limit: int, ask: RunLeaseAsk
    ) -> list[DueRun]:
        """:meth:`WorkflowStore.claim_due_run_rows`, each run's lease in the lease
        table taken by ``ask`` in the same statement (``DueRun.lease``, or
        ``lease_refused`` while another holder has it)."""
        raise NotImplementedError

    def json_as_stored(self, value: Any) -> Any:
        """``value`` (read back from JSON) as a read of a JSON column returns it."""
        return value

    def settle_then_claim(
        self,
        done: StepDone,
        step: NewStep,
        *,
        lease_ms: int,
        worker: str,
        park_wakes: int,
        pass_wake_at: datetime,
    ) -> Chained | None:
        """Record ``done`` and, if its result was stored as given, store ``step``
        claimed by ``worker`` as :meth:`WorkflowStore.insert_claimed` does; else the
        run falls due at ``pass_wake_at``. None when the attempt was superseded."""
        raise NotImplementedError

    def settle_then_finish(
        self,
        done: StepDone,
        run_id: uuid.UUID,
        status: str,
        output: Any,
        error: Any,
        *,
        wake_at: datetime,
        pass_wake_at: datetime,
        release: Lease | None = None,
    ) -> Chained | None:
        """Record ``done`` and end its run as :meth:`WorkflowStore.finish_run` does;
        where a plain parent step waits on the run, the run falls due at
        ``pass_wake_at`` instead (``finished`` None). With ``release`` (the run's
        lease, in the lease table), the lease is released once the run ended
        (``released``). None when superseded."""
        raise NotImplementedError


class KeyedStarts:
    """How starts of one idempotency key meet: in turns where the database needs it,
    and a taken key's run read past the caller's snapshot."""

    #: The database alias (the store's).
    using: str

    def key_turn(self, workflow: str, idempotency_key: str) -> AbstractContextManager[Any]:
        """Held while a start of ``idempotency_key`` inserts or changes its run, where
        the database needs concurrent starts of one key to take turns."""
        return contextlib.nullcontext()

    def keyed_run(self, workflow: str, idempotency_key: str) -> WorkflowRun:
        """The run of ``workflow`` holding ``idempotency_key``, as last committed (a
        locking read: a repeatable-read snapshot taken before it was may not show
        it), for a start whose insert found the key taken. DoesNotExist if none."""
        with transaction.atomic(using=self.using):
            taken = WorkflowRun.objects.using(self.using).select_for_update()
            return taken.get(workflow=workflow, idempotency_key=idempotency_key)


class WorkflowStore(
    RunWrites,
    QueueWrites,
    BulkStarts,
    KeyedStarts,
    FreshClaims,
    ChainedWrites,
    StepWrites,
    RunForks,
    abc.ABC,
):
    """The workflow tables' operations on one database (``using``)."""

    vendor: str = ""
    #: Whether :meth:`ready_steps_exist` says no only when no step is ready (else it
    #: may say yes to let the claim's own query decide).
    exact_ready_look: bool = False
    #: Whether the database takes one worker process at a time (one writer).
    one_worker_process: bool = False
    #: Whether a run's input is searched as text (the admin's and pikku_runs' search).
    searches_input_text: bool = False

    def __init__(self, using: str, config: Callable[[], EngineConfig] = engine_config) -> None:
        self.using = using
        self._config = config

    @property
    def config(self) -> EngineConfig:
        """The settings the store's engine runs by."""
        return self._config()

    @property
    def notifying(self) -> bool:
        """Whether new work is announced (``PIKKU["WORKER_NOTIFY"]``)."""
        return self._config().notify

    def queue_paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused, as this process last looked (at most a few
        seconds ago): claims check the pause themselves; this spares a pass a claim
        that would be refused."""
        return paused_look.is_paused(self.using, queue)

    @property
    def prepared(self) -> bool:
        """Whether statements are prepared (``PIKKU["PREPARED_STATEMENTS"]``)."""
        return self._config().prepared_statements

    # -- plumbing -------------------------------------------------------------------

    def runs(self) -> QuerySet[WorkflowRun]:
        return WorkflowRun.objects.using(self.using)

    def steps(self) -> QuerySet[WorkflowStep]:
        return WorkflowStep.objects.using(self.using)

    def attempts(self) -> QuerySet[StepAttempt]:
        return StepAttempt.objects.using(self.using)

    @abc.abstractmethod
    def atomic(self) -> AbstractContextManager[Any]:
        """A transaction (or savepoint) on the store's database."""

    @abc.abstractmethod
    def notify(self) -> None:
        """Tell idle workers there is new work, when the current transaction commits."""

    @abc.abstractmethod
    def claims_serialised(self) -> AbstractContextManager[Any]:
        """A lock this process's claims take in turn where the database needs it."""

    # -- steps: the hot path -----------------------------------------------------------

    @abc.abstractmethod
    def insert_settled(
        self,
        step: NewStep,
        *,
        status: str,
        result: Any,
        error: Any,
        available_at: datetime | None,
        worker: str,
        started_at: datetime,
    ) -> tuple[int, Any] | None:
        """Insert a step with its first attempt already settled, while its run is
        running: its id and result as stored; None (nothing written) if the step
        exists or the run is no longer running."""

    @abc.abstractmethod
    def insert_claimed(
        self, step: NewStep, *, lease_ms: int, worker: str, park_wakes: int
    ) -> tuple[int, Any, int] | None:
        """Insert a step running as attempt 1 under this worker's lease, and park its
        run unless it was woken since ``park_wakes``: its id, input as stored and
        claim token (the store's first); None
        (nothing written) if the step exists or the run is no longer running."""

    @abc.abstractmethod
    def settle(
        self,
        step_id: int,
        attempt: int,
        status: str,
        *,
        result: Any = None,
        error: Any = None,
        available_at: datetime | None = None,
        retries: int | None = None,
        wake: Wake = Wake.NONE,
        wake_at: datetime | None = None,
        token: int | None = None,
    ) -> Settled | None:
        """Write an attempt's outcome on its step and history row, fenced by
        ``attempt`` and its claim ``token`` (only while the step is still running
        under that claim; None: under that attempt, whichever claim). With
        :attr:`Wake.NOW` wake its run at ``wake_at`` (counted, announced); with
        :attr:`Wake.PASS` make it due at ``wake_at`` (not counted).

        None if the attempt was superseded (nothing written).
        """

    @abc.abstractmethod
    def claim_attempt(
        self,
        step: WorkflowStep,
        guard: models.Q,
        *,
        lease_ms: int,
        worker: str,
        pausable: bool = False,
    ) -> Started | None:
        """Start attempt ``step.attempt + 1`` under this worker's lease, with the
        step's next claim token, if the step still matches ``guard``, its run is
        running and (``pausable``) its queue is not paused (one guarded UPDATE, and the
        attempt's history row): when the attempt started as recorded and its claim
        token, or None when this caller did not win."""

    @abc.abstractmethod
    def decide_claim(
        self, step: WorkflowStep, *, lease_ms: int, worker: str, pausable: bool, now: datetime
    ) -> Decision:
        """The claim decision for ``step`` (read with ``store_now``), the one rule of
        this store: if claimable, its next attempt claimed under ``lease_ms`` (if its
        run is running and, ``pausable`` and queued, its queue not paused); a lapsed
        claim with no attempt left failed. ``now``: the engine's clock, which retries
        are due by."""

    @abc.abstractmethod
    def refresh_lease(
        self, step_id: int, lease_ms: int | None, attempt: int, token: int | None = None
    ) -> bool:
        """Extend (or, with None, park) the claim of ``attempt`` with the claim
        ``token`` (None: whichever); False once replaced."""

    # -- finding work --------------------------------------------------------------------

    def claim_due_runs(self, now: datetime, until: datetime, limit: int) -> list[uuid.UUID]:
        """Runs due at ``now`` (oldest due first, skipping locked ones), each pushed
        back to ``until`` while its pass runs."""
        return [due.run.id for due in self.claim_due_run_rows(now, until, limit)]

    @abc.abstractmethod
    def claim_due_run_rows(self, now: datetime, until: datetime, limit: int) -> list[DueRun]:
        """:meth:`claim_due_runs`, each run as the claim read and left it, and whether
        it had steps (so that its pass need not read either again)."""

    @abc.abstractmethod
    def ready_steps_exist(self, now: datetime, queues: Sequence[str]) -> bool:
        """Whether a queued step may be ready to claim (a cheap look, before claiming)."""

    @abc.abstractmethod
    def lock_ready_steps(
        self, now: datetime, queues: Sequence[str], limit: int, full: Sequence[str] = ()
    ) -> list[WorkflowStep]:
        """Ready queued steps of running worker runs (none of the queues ``full``,
        nor of a paused queue), in the claim order, locked for the caller's
        transaction (others skipped), with ``store_now`` (epoch ms) on each."""

    @abc.abstractmethod
    def limited_claim(self, queues: Sequence[str]) -> AbstractContextManager[Any]:
        """A transaction in which this caller alone counts and claims the steps of
        the concurrency-limited ``queues``, across all workers, until it commits."""

    @abc.abstractmethod
    def live_claims(self, queue: str) -> int:
        """How many of ``queue``'s steps are claimed under a lease that has not lapsed."""

    @abc.abstractmethod
    def ready_steps_of(self, run_ids: Sequence[uuid.UUID], now: datetime) -> list[WorkflowStep]:
        """Ready queued steps of the runs ``run_ids`` (an inline tree), oldest first."""

    @abc.abstractmethod
    def next_due(self, now: datetime, queues: Sequence[str]) -> NextDue:
        """When queued work next falls due after ``now``."""

    @abc.abstractmethod
    def next_due_of(self, run_ids: Sequence[uuid.UUID]) -> datetime | None:
        """When a queued step or timer of the runs ``run_ids`` next falls due."""

    @abc.abstractmethod
    def stalled_runs(self, idle_since: datetime, limit: int) -> list[uuid.UUID]:
        """Running worker runs that nothing will wake: not due, no step in flight,
        unchanged since ``idle_since``."""

    @abc.abstractmethod
    def work_pending(self, until: datetime, queues: Sequence[str]) -> bool:
        """Whether a run is due, or a queued step (of a queue not paused) ready or
        running, by ``until``."""

    # -- runs --------------------------------------------------------------------------

    @abc.abstractmethod
    def finish_run(
        self,
        run_id: uuid.UUID,
        status: str,
        output: Any,
        error: Any,
        *,
        wake_at: datetime | None = None,
    ) -> bool | None:
        """End a run no plain parent step waits on in one statement (parallel branches
        waiting on it settle with it, their run woken at ``wake_at``), its end announced
        to those waiting for it: whether it changed; None where the caller must do it
        in a transaction (a parent waits, or the store has no one-statement form)."""

    @abc.abstractmethod
    def create_run(
        self, run: WorkflowRun, opening: NewStep | None, due_at: datetime | None
    ) -> None:
        """Insert the new ``run`` (IntegrityError if its idempotency key is taken) and,
        with ``opening``, its first queued step, scheduled at ``due_at``, together (in
        the caller's transaction, if any); announce the work unless the run is inline."""

    @abc.abstractmethod
    def create_runs(self, runs: Sequence[NewRun], wake_at: datetime) -> list[uuid.UUID]:
        """Create ``runs``, due at ``wake_at`` (or their own later ``start_at``), in the
        caller's transaction: each one's id, which is the existing run's where its
        idempotency key is taken."""
