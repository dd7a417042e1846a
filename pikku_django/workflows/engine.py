"""The workflow engine: starting runs, orchestration passes, and step execution.

Every write that a step's attempt makes is fenced by that attempt: it lands only
while the step is still ``running`` under the same attempt number, so a worker
that lost its claim can never overwrite the attempt that replaced it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from pikku_django.conf import pikku_settings
from pikku_django.dbclock import EpochMs, process_now_ms
from pikku_django.leases import (
    HeldLease,
    LeaseLostError,
    LeaseService,
    LeaseTakenError,
    hold_lease,
)
from pikku_django.models import (
    TERMINAL_RUN_STATUSES,
    RunStatus,
    StepAttempt,
    StepKind,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.workflows import registry
from pikku_django.workflows.clock import Clock
from pikku_django.workflows.context import Pause, WorkflowContext, fresh, retry_delay_for
from pikku_django.workflows.durations import Duration, parse_duration
from pikku_django.workflows.errors import (
    NonDeterministicWorkflowError,
    NotSerializableError,
    StepFailedError,
    StepFunctionNotFoundError,
    WorkflowDefinitionError,
    WorkflowNotFoundError,
    WorkflowRunNotFoundError,
    WorkflowRunStateError,
    WorkflowStepLeaseExpiredError,
    WorkflowStepSupersededError,
    serialize_error,
)
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.sql import (
    WAKE_NONE,
    WAKE_NOW,
    NewStep,
    Settled,
    notify_work,
    step_columns,
    step_writes,
)

logger = workflow_logger(__name__)

#: How long a pass whose run lease is held elsewhere waits before trying again.
LEASE_TAKEN_RETRY = timedelta(seconds=1)

#: The name ``ctx.do(..., on_error=...)`` gives a compensation step: ``<step>:on_error``.
COMPENSATION_NAME = re.compile(r"(?P<step>.+):on_error(?:#\d+)?")


def to_json(value: Any, what: str) -> Any:
    """``value`` as it will read back from the database; NotSerializableError if not JSON."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise NotSerializableError(
            f"{what} is not JSON-serialisable ({exc}); return plain dicts, lists, str, "
            f"int, float, bool or None"
        ) from exc


@dataclass(frozen=True)
class StepOptions:
    """How one ``ctx.do`` call runs its step, after defaults are applied."""

    kind: str
    function: str
    fn: Callable[..., Any] | None
    retries: int
    retry_delay: float
    backoff: str
    queue: str
    transactional: bool


@dataclass(frozen=True)
class ClaimedStep:
    """A step this worker has claimed: its writes must carry ``attempt``."""

    step_id: int
    run_id: uuid.UUID
    name: str
    function: str
    input: Any
    attempt: int
    transactional: bool
    lease_ms: int
    queue: str
    #: Whether the step was taken from a worker whose lease lapsed (a recovery).
    reclaimed: bool = False
    #: The run as the pass that claimed this step left it (see CarriedRun).
    carried: CarriedRun | None = field(default=None, compare=False, repr=False)
    #: When the claim was made (this process's monotonic clock): renewals count from it.
    claimed_at: float = field(default_factory=time.monotonic, compare=False, repr=False)


@dataclass
class CarriedRun:
    """A run as a worker thread's last pass left it, when that pass stopped at the
    step it claimed: every other step it read was settled, and settled steps do not
    change. Once the claimed step succeeds, the thread's next pass (under the run
    lease it kept) starts from here instead of reading the run and its steps again;
    every write of a pass stays guarded by the run's status in the database.
    """

    run: WorkflowRun
    steps: dict[str, WorkflowStep]


@dataclass(frozen=True)
class StepClaimer:
    """A worker thread that runs the queued step a pass reaches, when it may."""

    worker: str
    #: The queues the worker serves (all when empty).
    queues: tuple[str, ...] = ()

    def takes(self, options: StepOptions) -> bool:
        return (
            options.kind == StepKind.QUEUED
            and (not self.queues or options.queue in self.queues)
            and registry.get_step(options.function) is not None
        )


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class WorkflowEngine:
    """Runs workflows stored in the ``using`` database.

    ``leases`` holds each run's orchestration lease (default: the project's lease
    service); ``clock`` decides when sleeps and retries are due.
    """

    def __init__(
        self,
        using: str | None = None,
        *,
        leases: LeaseService | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.using = using or pikku_settings.WORKFLOW_DATABASE
        if self.using not in connections:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                f"PIKKU['WORKFLOW_DATABASE'] is {self.using!r}, which is not in DATABASES"
            )
        self._leases = leases
        self.clock = clock or Clock()
        self._sqlite_claims = threading.Lock()
        self.writes = step_writes(self)

    # -- plumbing ---------------------------------------------------------------

    @property
    def leases(self) -> LeaseService:
        if self._leases is None:
            from pikku_django.leases import get_lease_service

            self._leases = get_lease_service()
        return self._leases

    @property
    def vendor(self) -> str:
        return connections[self.using].vendor

    def runs(self) -> Any:
        return WorkflowRun.objects.using(self.using)

    def steps(self) -> Any:
        return WorkflowStep.objects.using(self.using)

    def attempts(self) -> Any:
        return StepAttempt.objects.using(self.using)

    def atomic(self) -> Any:
        return transaction.atomic(using=self.using)

    def notify(self) -> None:
        """Tell idle workers there is new work (PostgreSQL; others poll)."""
        if pikku_settings.WORKER_NOTIFY:
            notify_work(self.using)

    def lease_ms_for_queue(self, queue: str) -> int:
        per_queue = pikku_settings.QUEUE_LEASE_MS or {}
        return int(per_queue.get(queue, pikku_settings.STEP_LEASE_MS))

    # -- starting, resuming, cancelling ----------------------------------------------

    def start(
        self,
        workflow: str | Callable[..., Any],
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        inline: bool = False,
    ) -> WorkflowRun:
        """Create a run (or return the one with this idempotency key) and wake it."""
        definition = registry.get_workflow(workflow)
        if definition is None:
            raise WorkflowNotFoundError(
                f"No workflow is registered as {workflow!r}. Registered: "
                f"{', '.join(registry.workflow_names()) or 'none'}"
            )
        payload = to_json(input, "The workflow input")
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 255
        ):
            raise ValueError("idempotency_key must be a str of 1 to 255 characters")
        if idempotency_key is not None:
            existing = (
                self.runs()
                .filter(workflow=definition.name, idempotency_key=idempotency_key)
                .first()
            )
            if existing is not None:
                return existing
        try:
            with self.atomic():
                run = self.runs().create(
                    workflow=definition.name,
                    input=payload,
                    inline=inline,
                    idempotency_key=idempotency_key,
                    wake_at=None if inline else self.clock.now(),
                )
                if not inline:
                    self.notify()
        except IntegrityError:
            if idempotency_key is None:
                raise
            return self.runs().get(workflow=definition.name, idempotency_key=idempotency_key)
        logger.info("Started workflow %s run %s", definition.name, run.id)
        if inline:
            return self.drive_inline(run.id)
        return run

    def create_run(
        self, workflow: str, payload: Any, *, idempotency_key: str | None = None
    ) -> WorkflowRun:
        """Insert a run of a registered workflow, due now, in the caller's transaction.

        No idempotency look-up first: the caller's own unique constraint (or this
        run's) decides. ``payload`` must already be plain JSON.
        """
        run = self.runs().create(
            workflow=workflow,
            input=payload,
            idempotency_key=idempotency_key,
            wake_at=self.clock.now(),
        )
        self.notify()
        return run

    def get_run(self, run_id: uuid.UUID | str) -> WorkflowRun:
        try:
            return self.runs().get(id=run_id)
        except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError) as exc:
            # A malformed id (ValidationError from the UUID field) matches no run either.
            raise WorkflowRunNotFoundError(f"No workflow run has id {run_id!r}") from exc

    def resume(self, run_id: uuid.UUID | str, data: Any = None) -> WorkflowRun:
        """Resume a suspended run; its ``ctx.suspend()`` returns ``data``."""
        payload = to_json(data, "The resume data")
        run = self.get_run(run_id)
        with self.atomic():
            changed = (
                self.runs()
                .filter(id=run.id, status=RunStatus.SUSPENDED)
                .update(
                    status=RunStatus.RUNNING,
                    suspend_reason="",
                    wake_at=None if run.inline else self.clock.now(),
                    wakes=F("wakes") + 1,
                    updated_at=timezone.now(),
                )
            )
            if not changed:
                run.refresh_from_db()
                raise WorkflowRunStateError(
                    f"Run {run.id} is {run.status}, not suspended: only a suspended run resumes"
                )
            now = self.clock.now()
            for step in self.steps().filter(run_id=run.id, status=StepStatus.SUSPENDED):
                if step.kind == StepKind.SUSPEND:
                    self._finish_marker(step, StepStatus.SUCCEEDED, result=payload)
                else:
                    # A function that was missing: hand the step to a worker again.
                    self.steps().filter(id=step.id, status=StepStatus.SUSPENDED).update(
                        status=StepStatus.SCHEDULED,
                        available_at=now,
                        error=None,
                        updated_at=timezone.now(),
                    )
            self.notify()
        logger.info("Resumed workflow run %s", run.id)
        if run.inline:
            # A resumed inline child is driven through its root run, so the
            # parents waiting on it (which no worker picks up) carry on too.
            root = self._inline_root(run.id)
            driven = self.drive_inline(root)
            return driven if root == run.id else self.get_run(run.id)
        return self.get_run(run.id)

    def cancel(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """Cancel a run that has not finished, and the child runs it is waiting for."""
        run = self.get_run(run_id)
        with self.atomic():
            changed = (
                self.runs()
                .filter(id=run.id, status__in=(RunStatus.RUNNING, RunStatus.SUSPENDED))
                .update(status=RunStatus.CANCELLED, wake_at=None, updated_at=timezone.now())
            )
            if not changed:
                run.refresh_from_db()
                if run.status == RunStatus.CANCELLED:
                    return run
                raise WorkflowRunStateError(f"Run {run.id} is {run.status}: it cannot be cancelled")
            children = list(
                self.steps()
                .filter(run_id=run.id, kind=StepKind.CHILD, child_run__isnull=False)
                .values_list("child_run_id", flat=True)
            )
            self._settle_parents(run.id, RunStatus.CANCELLED, None, None)
        for child in children:
            with contextlib.suppress(WorkflowRunStateError):
                self.cancel(child)
        logger.info("Cancelled workflow run %s", run.id)
        if run.inline:
            # An inline parent waiting on this run has just had its step failed;
            # no worker picks inline runs up, so carry the root on here.
            root = self._inline_root(run.id)
            if root != run.id:
                self.drive_inline(root)
        return self.get_run(run.id)

    def retry(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """Retry a failed run from the step whose failure failed it.

        That step (and its compensation, if that failed too) is given one more
        attempt, which a worker claims as usual: earlier attempts stay in the
        history. A failed child run behind a child step is retried with it. A run
        that failed outside any step (its body raised) is woken to replay.
        WorkflowRunStateError if the run is not failed.
        """
        run = self.get_run(run_id)
        with self.atomic():
            reopened = self._reopen_failed_run(run)
            if not run.inline:
                self.notify()
        logger.info("Retrying workflow run %s (steps: %s)", run.id, ", ".join(reopened) or "none")
        if run.inline:
            return self.drive_inline(run.id)
        return self.get_run(run.id)

    def _reopen_failed_run(self, run: WorkflowRun) -> list[str]:
        """Set a failed run running again and reopen its failed steps: their names."""
        now = self.clock.now()
        changed = (
            self.runs()
            .filter(id=run.id, status=RunStatus.FAILED)
            .update(
                status=RunStatus.RUNNING,
                output=None,
                error=None,
                suspend_reason="",
                wake_at=None if run.inline else now,
                wakes=F("wakes") + 1,
                updated_at=timezone.now(),
            )
        )
        if not changed:
            current = self.get_run(run.id)
            raise WorkflowRunStateError(
                f"Run {run.id} is {current.status}, not failed: only a failed run is retried"
            )
        steps = self._steps_that_failed_run(run.id)
        for step in steps:
            self._reopen_step(step, now)
        return [step.name for step in steps]

    def _steps_that_failed_run(self, run_id: uuid.UUID) -> list[WorkflowStep]:
        """The last step the run reached, if its failure was final, with its failed compensation.

        Replay creates steps in the order the workflow reaches them, so the step
        whose failure ended the run is the last one but for its compensation;
        failures the workflow caught and carried on from are left as they are.
        """
        steps = list(self.steps().filter(run_id=run_id).order_by("id"))
        names = {step.name for step in steps}

        def compensates(step: WorkflowStep) -> str | None:
            match = COMPENSATION_NAME.fullmatch(step.name)
            return match["step"] if match and match["step"] in names else None

        def failed_for_good(step: WorkflowStep) -> bool:
            return step.status == StepStatus.FAILED and step.attempt >= step.attempts_allowed

        reached = [step for step in steps if compensates(step) is None]
        if not reached or not failed_for_good(reached[-1]):
            return []
        last = reached[-1]
        return [last] + [s for s in steps if compensates(s) == last.name and failed_for_good(s)]

    def _reopen_step(self, step: WorkflowStep, now: datetime) -> None:
        """Give a finally failed step one more attempt (a child step: wait for its child again)."""
        if step.kind == StepKind.CHILD:
            self._reopen_child_step(step)
            return
        won = (
            self.steps()
            .filter(id=step.id, status=StepStatus.FAILED, attempt=step.attempt)
            .update(
                retries=step.attempt,  # attempt < retries + 1: claimable once more
                available_at=now,
                lease_expires_at=None,
                updated_at=timezone.now(),
            )
        )
        if not won:
            raise WorkflowRunStateError(
                f"Step {step.name!r} of run {step.run_id} changed while it was being retried"
            )

    def _reopen_child_step(self, step: WorkflowStep) -> None:
        child = self.runs().filter(id=step.child_run_id).first() if step.child_run_id else None
        if child is None or child.status == RunStatus.CANCELLED:
            what = "no longer exists" if child is None else f"{child.id} was cancelled"
            raise WorkflowRunStateError(
                f"Step {step.name!r} of run {step.run_id} waited for a child run that {what}: "
                "it cannot be retried; start a new run"
            )
        attempt = step.attempt + 1
        won = (
            self.steps()
            .filter(id=step.id, status=StepStatus.FAILED, attempt=step.attempt)
            .update(
                status=StepStatus.RUNNING,
                attempt=attempt,
                retries=step.retries + 1,
                result=None,
                error=None,
                lease_expires_at=None,  # parked on its child run, as when it started
                updated_at=timezone.now(),
            )
        )
        if not won:
            raise WorkflowRunStateError(
                f"Step {step.name!r} of run {step.run_id} changed while it was being retried"
            )
        self.attempts().create(step_id=step.id, attempt=attempt, status=StepStatus.RUNNING)
        step.status, step.attempt, step.retries = StepStatus.RUNNING, attempt, step.retries + 1
        if child.status == RunStatus.FAILED:
            self._reopen_failed_run(child)
        elif child.status == RunStatus.COMPLETED:
            # Retried on its own meanwhile: its output settles the step now.
            self._finish_marker(step, StepStatus.SUCCEEDED, result=child.output)
        # A child running again (retried on its own) settles the step when it ends.

    def _inline_root(self, run_id: uuid.UUID) -> uuid.UUID:
        """The top run of the tree of parent runs that ``run_id`` is a child of."""
        seen = {run_id}
        while True:
            parent = (
                self.steps()
                .filter(child_run_id=run_id, kind=StepKind.CHILD)
                .values_list("run_id", flat=True)
                .first()
            )
            if parent is None or parent in seen:
                return run_id
            seen.add(parent)
            run_id = parent

    # -- orchestration ----------------------------------------------------------

    def run_lease(self, run_id: uuid.UUID | str) -> HeldLease:
        """The lease every orchestration pass of the run holds, for a ``with`` block."""
        return hold_lease(
            f"workflow-run:{run_id}", ttl_ms=pikku_settings.RUN_LEASE_MS, service=self.leases
        )

    def orchestrate(
        self,
        run_id: uuid.UUID | str,
        *,
        claimer: StepClaimer | None = None,
        held: HeldLease | None = None,
        carried: CarriedRun | None = None,
    ) -> ClaimedStep | None:
        """One orchestration pass over a run, holding the run's lease.

        With a ``claimer``, a queued step the pass reaches is stored already claimed
        by that worker and returned, for it to execute next. ``held`` is the run's
        lease (from :meth:`run_lease`) when the caller holds it across several
        passes; otherwise the pass takes and releases it. ``carried`` (with
        ``held``) is the run as the caller's previous pass left it.
        """
        with log_context(run_id=str(run_id), step=None, attempt=None):
            return self._orchestrate(run_id, claimer, held, carried)

    def _orchestrate(
        self,
        run_id: uuid.UUID | str,
        claimer: StepClaimer | None,
        held: HeldLease | None,
        carried: CarriedRun | None = None,
    ) -> ClaimedStep | None:
        if held is not None and carried is not None:
            run, steps = carried.run, carried.steps
        else:
            run = self.runs().filter(id=run_id).order_by().first()
            steps = None
        if run is None or run.status != RunStatus.RUNNING:
            return None  # settled or suspended: not replayed, no lease taken
        claimed = None
        try:
            # Every write of the pass is guarded by the run's status (and a park by
            # its wake count), so the run read before the lease is enough.
            if held is None:
                with self.run_lease(run.id):
                    claimed = self._pass(run, claimer)
            else:
                held.vouch()
                claimed = self._pass(run, claimer, steps)
                held.vouch()
        except DatabaseError:
            logger.exception("An orchestration pass of run %s hit a database error", run.id)
            self.retry_pass_soon(run.id)
        except (LeaseTakenError, LeaseLostError) as exc:
            current = self.runs().filter(id=run.id).only("status").first()
            if current is not None and current.status == RunStatus.RUNNING:
                logger.info(
                    "Run %s is orchestrated elsewhere (%s); waking it again shortly",
                    run.id,
                    type(exc).__name__,
                )
                self.retry_pass_soon(run.id)
            # else: the pass wrote its outcome; it stands
        # A step claimed by the pass is fenced by its own attempt: it runs even if
        # the run lease was lost afterwards.
        return claimed

    def retry_pass_soon(self, run_id: uuid.UUID) -> None:
        """Wake a run a second from now: spends no retry budget."""
        try:
            self.runs().filter(id=run_id, status=RunStatus.RUNNING).update(
                wake_at=self.clock.now() + LEASE_TAKEN_RETRY, wakes=F("wakes") + 1
            )
        except DatabaseError:
            logger.exception(
                "Could not reschedule run %s; its pass timeout or the recovery sweep will",
                run_id,
            )

    def _pass(
        self,
        run: WorkflowRun,
        claimer: StepClaimer | None = None,
        steps: dict[str, WorkflowStep] | None = None,
    ) -> ClaimedStep | None:
        seen_wakes = run.wakes
        definition = registry.get_workflow(run.workflow)
        if definition is None:
            self._suspend_run(
                run,
                f"WORKFLOW_NOT_FOUND: no workflow is registered as {run.workflow!r}",
            )
            return None
        if steps is None:
            steps = {step.name: step for step in self.steps().filter(run_id=run.id).order_by()}
        ctx = WorkflowContext(self, run, steps)
        ctx.claimer = None if run.inline else claimer
        try:
            output = definition.fn(ctx, ctx.input)
        except Pause as pause:
            if ctx.claim_request is not None and claimer is not None:
                return self._claim_new_step(ctx, seen_wakes, claimer, *ctx.claim_request)
            self._park(run, seen_wakes, pause.wake_at)
            return None
        except StepFunctionNotFoundError as exc:
            self._suspend_run(run, f"RPC_NOT_FOUND: {exc}")
            return None
        except (WorkflowStepSupersededError, LeaseLostError, DatabaseError):
            raise
        except Exception as exc:
            self._finish_run(run, RunStatus.FAILED, error=serialize_error(exc))
            return None
        try:
            payload = to_json(output, f"The output of workflow {run.workflow!r}")
        except NotSerializableError as exc:
            self._finish_run(run, RunStatus.FAILED, error=serialize_error(exc))
            return None
        self._finish_run(run, RunStatus.COMPLETED, output=payload)
        return None

    def _claim_new_step(
        self,
        ctx: WorkflowContext,
        seen_wakes: int,
        claimer: StepClaimer,
        name: str,
        options: StepOptions,
        payload: Any,
    ) -> ClaimedStep | None:
        """Store the queued step a pass reached as claimed by ``claimer``, parking the run."""
        run = ctx.run
        lease_ms = self.lease_ms_for_queue(options.queue)
        new = _new_step(run, name, StepKind.QUEUED, options, payload)
        stored = self.writes.insert_claimed(
            new, lease_ms=lease_ms, worker=claimer.worker, park_wakes=seen_wakes
        )
        if stored is None:
            # Stored meanwhile by another pass, or the run stopped running: look again.
            self.wake_run(run.id)
            return None
        step_id, stored_input = stored
        row = WorkflowStep(id=step_id, **step_columns(new), status=StepStatus.RUNNING, attempt=1)
        row.input = stored_input
        ctx._remember(row)
        return ClaimedStep(
            step_id=step_id,
            run_id=run.id,
            name=name,
            function=options.function,
            input=stored_input,  # as every later attempt reads it from the database
            attempt=1,
            transactional=options.transactional,
            lease_ms=lease_ms,
            queue=options.queue,
            carried=CarriedRun(run, ctx._steps),
        )

    def _park(self, run: WorkflowRun, seen_wakes: int, wake_at: datetime | None) -> None:
        """Record when the run next needs a pass, unless something woke it meanwhile."""
        self.runs().filter(id=run.id, status=RunStatus.RUNNING, wakes=seen_wakes).update(
            wake_at=None if run.inline else wake_at, updated_at=timezone.now()
        )

    def _finish_run(
        self, run: WorkflowRun, status: str, *, output: Any = None, error: Any = None
    ) -> None:
        changed = self.writes.finish_run(run.id, status, output, error)
        if changed is not None:
            if changed:
                logger.info("Workflow run %s %s", run.id, status)
            return
        with self.atomic():
            changed = (
                self.runs()
                .filter(id=run.id, status=RunStatus.RUNNING)
                .update(
                    status=status,
                    output=output,
                    error=error,
                    wake_at=None,
                    updated_at=timezone.now(),
                )
            )
            if changed:
                self._settle_parents(run.id, status, output, error)
        if changed:
            logger.info("Workflow run %s %s", run.id, status)

    def _settle_parents(self, child_id: uuid.UUID, status: str, output: Any, error: Any) -> None:
        """A child run ended: settle the parent steps waiting on it and wake their runs."""
        parents = list(self.steps().filter(child_run_id=child_id, status=StepStatus.RUNNING))
        for step in parents:
            if status == RunStatus.COMPLETED:
                self._finish_marker(step, StepStatus.SUCCEEDED, result=output)
            else:
                failure = error or {
                    "type": "WorkflowCancelled",
                    "message": f"Child run {child_id} was {status}",
                    "code": "CHILD_" + status.upper(),
                }
                self._finish_marker(step, StepStatus.FAILED, error=failure, final=True)
            self.wake_run(step.run_id)

    def _suspend_run(self, run: WorkflowRun, reason: str) -> None:
        changed = (
            self.runs()
            .filter(id=run.id, status=RunStatus.RUNNING)
            .update(
                status=RunStatus.SUSPENDED,
                suspend_reason=reason,
                wake_at=None,
                updated_at=timezone.now(),
            )
        )
        if changed:
            logger.info("Workflow run %s suspended: %s", run.id, reason)

    def suspend_for_step(self, run: WorkflowRun, step: WorkflowStep) -> None:
        reason = step.error.get("message", "") if isinstance(step.error, dict) else ""
        if step.kind == StepKind.SUSPEND:
            reason = step.input.get("reason", "") if isinstance(step.input, dict) else ""
        elif isinstance(step.error, dict) and step.error.get("code"):
            reason = f"{step.error['code']}: {reason}"
        self._suspend_run(run, reason)

    def wake_run(self, run_id: uuid.UUID, at: datetime | None = None) -> None:
        """Mark a run as needing a pass (now, or at ``at``)."""
        changed = (
            self.runs()
            .filter(id=run_id, status=RunStatus.RUNNING)
            .update(wake_at=at or self.clock.now(), wakes=F("wakes") + 1, updated_at=timezone.now())
        )
        if changed:
            self.notify()

    # -- step creation (called from the workflow context) --------------------------

    def step_options(
        self,
        fn: str | Callable[..., Any],
        *,
        retries: int | None,
        retry_delay: Duration | None,
        backoff: str | None,
        queued: bool | None,
        queue: str | None,
        transactional: bool | None,
    ) -> StepOptions:
        definition = registry.get_step(fn)
        if definition is not None:
            kind = StepKind.INLINE if queued is False else StepKind.QUEUED
            function, callable_ = definition.name, definition.fn
        elif isinstance(fn, str):
            # Named but not registered here: a worker cannot run it either.
            kind, function, callable_ = StepKind.QUEUED, fn, None
        elif callable(fn):
            if queued:
                raise WorkflowDefinitionError(
                    f"{getattr(fn, '__qualname__', fn)!r} cannot be queued: only functions "
                    "registered with @step run on workers. Register it, or leave queued unset "
                    "to run it inline."
                )
            kind = StepKind.INLINE
            function = getattr(fn, "__qualname__", type(fn).__name__)[:255]
            callable_ = fn
        else:
            raise WorkflowDefinitionError(
                f"A step is a registered function, its name, or a callable; got {fn!r}"
            )
        if retries is None:
            retries = (
                definition.retries
                if definition and definition.retries is not None
                else (pikku_settings.STEP_RETRIES)
            )
        registry.check_retries(retries)
        if retry_delay is None:
            delay = (
                definition.retry_delay
                if definition and definition.retry_delay is not None
                else parse_duration(pikku_settings.STEP_RETRY_DELAY, what="STEP_RETRY_DELAY")
            )
        else:
            delay = parse_duration(retry_delay, what="retry_delay")
        if backoff is None:
            backoff = (definition.backoff if definition else None) or pikku_settings.STEP_BACKOFF
        registry.check_backoff(backoff)
        queue = queue or (definition.queue if definition else None) or "default"
        if transactional is None:
            transactional = bool(definition and definition.transactional)
        return StepOptions(
            kind=kind,
            function=function,
            fn=callable_,
            retries=retries,
            retry_delay=delay,
            backoff=str(backoff),
            queue=str(queue)[:100],
            transactional=bool(transactional),
        )

    def _create_step(self, run: WorkflowRun, **fields: Any) -> WorkflowStep:
        try:
            with self.atomic():
                return self.steps().create(run_id=run.id, **fields)
        except IntegrityError:
            # Another pass of the same run created it first (its lease lapsed).
            return self.steps().get(run_id=run.id, name=fields["name"])

    def step_input(self, name: str, data: Any) -> Any:
        """A step's input as stored; NotSerializableError if it is not JSON."""
        return to_json(data, f"The input of step {name!r}")

    def schedule_step(
        self, run: WorkflowRun, name: str, options: StepOptions, data: Any
    ) -> WorkflowStep:
        payload = self.step_input(name, data)
        missing = registry.get_step(options.function) is None
        step = self._create_step(
            run,
            name=name,
            kind=StepKind.QUEUED,
            function=options.function,
            input=payload,
            status=StepStatus.SUSPENDED if missing else StepStatus.SCHEDULED,
            error=serialize_error(StepFunctionNotFoundError(options.function)) if missing else None,
            retries=options.retries,
            retry_delay=options.retry_delay,
            backoff=options.backoff,
            queue=options.queue,
            transactional=options.transactional,
            available_at=self.clock.now(),
        )
        if not missing:
            self.notify()
        return step

    def start_child(self, run: WorkflowRun, name: str, workflow: str, data: Any) -> WorkflowStep:
        payload = to_json(data, f"The input of child workflow step {name!r}")
        with self.atomic():
            step = self._create_step(
                run,
                name=name,
                kind=StepKind.CHILD,
                function=workflow,
                input=payload,
                status=StepStatus.RUNNING,
                attempt=1,
                retries=0,
            )
            if step.child_run_id is None:
                child = self.runs().create(
                    workflow=workflow,
                    input=payload,
                    inline=run.inline,
                    wake_at=None if run.inline else self.clock.now(),
                )
                self.steps().filter(id=step.id).update(child_run=child)
                step.child_run_id = child.id
                self.attempts().get_or_create(step_id=step.id, attempt=1)
                self.notify()
        return step

    def start_sleep(self, run: WorkflowRun, name: str, seconds: float) -> WorkflowStep:
        return self._create_step(
            run,
            name=name,
            kind=StepKind.SLEEP,
            input={"seconds": seconds},
            status=StepStatus.SCHEDULED,
            retries=0,
            available_at=self.clock.now() + timedelta(seconds=seconds),
        )

    def finish_sleep(self, step: WorkflowStep) -> None:
        self._finish_marker(step, StepStatus.SUCCEEDED, result=None)
        step.status = StepStatus.SUCCEEDED

    def start_suspension(self, run: WorkflowRun, name: str, reason: str) -> WorkflowStep:
        return self._create_step(
            run,
            name=name,
            kind=StepKind.SUSPEND,
            input={"reason": reason},
            status=StepStatus.SUSPENDED,
            retries=0,
        )

    def _finish_marker(
        self,
        step: WorkflowStep,
        status: str,
        *,
        result: Any = None,
        error: Any = None,
        final: bool = False,
    ) -> None:
        """Settle a step that has no worker attempt of its own (sleep, suspend, child)."""
        with self.atomic():
            attempt = max(step.attempt, 1)
            self.steps().filter(id=step.id).exclude(status=StepStatus.SUCCEEDED).update(
                status=status,
                result=result,
                error=error,
                attempt=attempt,
                lease_expires_at=None,
                retries=0 if final else step.retries,
                updated_at=timezone.now(),
            )
            self.attempts().update_or_create(
                step_id=step.id,
                attempt=attempt,
                defaults={
                    "status": status,
                    "result": result,
                    "error": error,
                    "finished_at": timezone.now(),
                },
            )

    # -- inline steps -----------------------------------------------------------------

    def run_inline_step(
        self,
        ctx: WorkflowContext,
        name: str,
        step: WorkflowStep | None,
        options: StepOptions,
        data: Any,
    ) -> Any:
        """Run an inline step in this pass: its result, or Pause until a retry is due."""
        run = ctx.run
        if step is None:
            payload = to_json(data, f"The input of step {name!r}")
            step = self._first_inline_attempt(run, name, options, payload)
            ctx._remember(step)
        while True:
            if step.status == StepStatus.SUCCEEDED:
                return fresh(step.result)
            if step.status == StepStatus.FAILED and step.attempt >= step.attempts_allowed:
                raise StepFailedError(step.name, step.error)
            due = step.available_at
            now = self.clock.now()
            if step.status == StepStatus.FAILED and due is not None and due > now:
                if not run.inline:
                    raise Pause(due)
                self.clock.sleep((due - now).total_seconds())
            claimed = self._claim_inline(step)
            if claimed is None:
                raise Pause(self.clock.now() + LEASE_TAKEN_RETRY)
            assert options.fn is not None
            self._execute(claimed, options.fn, wake=False)
            step = self.steps().get(id=step.id)
            ctx._remember(step)

    def _first_inline_attempt(
        self, run: WorkflowRun, name: str, options: StepOptions, payload: Any
    ) -> WorkflowStep:
        """Run a new inline step's first attempt, then write the step with its outcome.

        Nothing is written before the function returns: a crash meanwhile leaves no
        row, and the next pass runs the step again, as it would a lapsed attempt.
        Returns the step as stored, settled (or as another pass of the run stored it
        first); Pause if the run stopped running meanwhile (its outcome is not stored).
        """
        new = _new_step(run, name, StepKind.INLINE, options, payload)
        worker = default_worker_id()
        started = timezone.now()
        assert options.fn is not None
        what = f"The result of step {name!r}"

        def succeeded(result: Any) -> tuple[int, Any] | None:
            try:
                return self.writes.insert_settled(
                    new,
                    status=StepStatus.SUCCEEDED,
                    result=result,
                    error=None,
                    available_at=None,
                    worker=worker,
                    started_at=started,
                )
            except DatabaseError as exc:
                raise _WriteFailedError from exc  # the engine's write, not the step's

        stored: tuple[int, Any] | None = None
        ran = False  # the function returned, but its outcome was not stored
        with log_context(run_id=str(run.id), step=name, attempt=1):
            try:
                # The function gets a copy: the input is stored as it was given.
                if options.transactional:
                    # The function's writes and the step's row commit together.
                    with self.atomic():
                        result = to_json(
                            registry.call_step_function(options.fn, fresh(payload)), what
                        )
                        stored = succeeded(result)
                        if stored is None:
                            raise _StepExistsError  # rolls the function's writes back
                else:
                    result = to_json(registry.call_step_function(options.fn, fresh(payload)), what)
                    stored = succeeded(result)
                if stored is not None:
                    step_id, as_stored = stored
                    return WorkflowStep(
                        id=step_id,
                        **step_columns(new),
                        status=StepStatus.SUCCEEDED,
                        result=as_stored,
                        attempt=1,
                    )
                ran = True
            except _StepExistsError:
                ran = True
            except _WriteFailedError as exc:
                raise exc.__cause__ from None  # type: ignore[misc]
            except StepFunctionNotFoundError as exc:
                columns = step_columns(new)
                del columns["run_id"]  # given as the run
                self._create_step(
                    run,
                    **columns,
                    status=StepStatus.SUSPENDED,
                    error=serialize_error(exc),
                )
                self._suspend_run(run, f"RPC_NOT_FOUND: {exc}")
                raise Pause(None) from None
            except Exception as exc:
                final = isinstance(exc, NotSerializableError)
                exhausted = final or options.retries < 1
                delay = retry_delay_for(
                    WorkflowStep(retry_delay=options.retry_delay, backoff=options.backoff), 1
                )
                if final:
                    new = dataclasses.replace(new, retries=0)
                self.writes.insert_settled(
                    new,
                    status=StepStatus.FAILED,
                    result=None,
                    error=serialize_error(exc),
                    available_at=None if exhausted else self.clock.now() + delay,
                    worker=worker,
                    started_at=started,
                )
                logger.info("Step %s attempt 1 failed: %s", name, exc)
        step = self.steps().filter(run_id=run.id, name=name).first()
        if step is None:
            logger.info("Run %s stopped running during step %s: outcome not stored", run.id, name)
            raise Pause(None)
        if ran:
            logger.warning("Step %s was stored by another pass; its outcome stands", name)
        return step

    def _claim_inline(self, step: WorkflowStep) -> ClaimedStep | None:
        """A new attempt of an inline step (the run lease keeps other passes out)."""
        return self._new_attempt(
            step,
            guard=Q(status=step.status, attempt=step.attempt),
            lease_ms=pikku_settings.RUN_LEASE_MS,
            worker=default_worker_id(),
        )

    # -- claiming queued steps ------------------------------------------------------

    def claim_step(
        self, step_id: int, *, lease_ms: int | None = None, worker: str = ""
    ) -> ClaimedStep | None:
        """Claim one step for execution, by the claim decision; None if not claimable."""
        step = (
            self.steps()
            .annotate(store_now=EpochMs())
            .filter(id=step_id)
            .select_related("run")
            .first()
        )
        if step is None or step.kind != StepKind.QUEUED:
            return None
        if lease_ms is None:
            lease_ms = self.lease_ms_for_queue(step.queue)
        return self._decide_claim(step, lease_ms, worker or default_worker_id())

    def claim_step_for_execution(
        self, run_id: uuid.UUID | str, step_name: str, function: str, lease_ms: int
    ) -> ClaimedStep | None:
        """Claim the step ``step_name`` of a run that should call ``function``."""
        step = (
            self.steps()
            .annotate(store_now=EpochMs())
            .filter(run_id=run_id, name=step_name)
            .select_related("run")
            .first()
        )
        if step is None:
            return None
        if step.function != function:
            raise NonDeterministicWorkflowError(
                f"Step {step_name!r} of run {run_id} calls {step.function!r}, not {function!r}"
            )
        return self._decide_claim(step, lease_ms, default_worker_id())

    def _decide_claim(self, step: WorkflowStep, lease_ms: int, worker: str) -> ClaimedStep | None:
        status, attempt = step.status, step.attempt
        exhausted = attempt >= step.attempts_allowed
        if status in (StepStatus.SUCCEEDED, StepStatus.SUSPENDED):
            return None
        if status == StepStatus.RUNNING:
            lease = step.lease_expires_at
            if lease is None or lease >= step.store_now:
                return None  # live, or parked on a child run
            lapsed = Q(status=status, attempt=attempt, lease_expires_at__lt=EpochMs())
            if exhausted:
                self._fail_lease_expired(step, lapsed)
                return None
            return self._new_attempt(step, guard=lapsed, lease_ms=lease_ms, worker=worker)
        due = step.available_at
        if due is not None and due > self.clock.now():
            return None  # a retry (or a re-drive) waits for its delay, on every route
        if status == StepStatus.FAILED:
            if exhausted:
                return None
            return self._new_attempt(
                step, guard=Q(status=status, attempt=attempt), lease_ms=lease_ms, worker=worker
            )
        # pending or scheduled
        return self._new_attempt(
            step, guard=Q(status=status, attempt=attempt), lease_ms=lease_ms, worker=worker
        )

    def _new_attempt(
        self, step: WorkflowStep, *, guard: Q, lease_ms: int, worker: str
    ) -> ClaimedStep | None:
        attempt = step.attempt + 1
        # Only a step of a running run is claimed, by whichever route: a cancelled
        # (or otherwise settled) run's steps never run again.
        live_runs = self.runs().filter(status=RunStatus.RUNNING).values("id")
        with self.atomic():
            won = (
                self.steps()
                .filter(guard, id=step.id, run_id__in=live_runs)
                .update(
                    status=StepStatus.RUNNING,
                    attempt=attempt,
                    result=None,
                    error=None,
                    available_at=None,
                    lease_expires_at=EpochMs() + lease_ms,
                    updated_at=timezone.now(),
                )
            )
            if not won:
                return None
            self.attempts().create(
                step_id=step.id, attempt=attempt, status=StepStatus.RUNNING, worker=worker[:255]
            )
        return ClaimedStep(
            step_id=step.id,
            run_id=step.run_id,
            name=step.name,
            function=step.function,
            input=step.input,
            attempt=attempt,
            transactional=step.transactional,
            lease_ms=lease_ms,
            queue=step.queue,
            reclaimed=step.status == StepStatus.RUNNING,
        )

    def _fail_lease_expired(self, step: WorkflowStep, guard: Q) -> None:
        exc = WorkflowStepLeaseExpiredError(step.name, step.attempts_allowed)
        error = serialize_error(exc)
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
        if won:
            logger.warning("%s", exc)
            self.wake_run(step.run_id)

    # -- fenced writes ------------------------------------------------------------

    def set_step_result(
        self, step_id: int, result: Any, attempt: int, *, wake: bool | str = True
    ) -> Settled | None:
        """Record the result of ``attempt``; WorkflowStepSupersededError if it was replaced.

        ``wake`` wakes the step's run for any worker (True), or not (False, or
        ``"pass"``: this thread passes the run next). Returns what the write found
        (None when the result was not JSON and failed the step instead).
        """
        try:
            payload = to_json(result, f"The result of step {step_id}")
        except NotSerializableError as exc:
            self.set_step_error(step_id, exc, attempt, wake=wake, final=True)
            return None
        settled = self.writes.settle(
            step_id, attempt, StepStatus.SUCCEEDED, result=payload, wake=_wake_mode(wake)
        )
        if settled is None:
            raise WorkflowStepSupersededError(step_id, attempt)
        return settled

    def set_step_error(
        self,
        step_id: int,
        error: BaseException | dict[str, Any],
        attempt: int,
        *,
        wake: bool | str = True,
        final: bool = False,
    ) -> bool:
        """Record that ``attempt`` failed; True if no attempt is left.

        ``wake`` is as for :meth:`set_step_result`, and applies once no attempt is
        left. Raises WorkflowStepSupersededError if the attempt was replaced.
        """
        data = serialize_error(error) if isinstance(error, BaseException) else dict(error)
        step = self.steps().filter(id=step_id).only("retries", "retry_delay", "backoff").first()
        if step is None:
            raise WorkflowStepSupersededError(step_id, attempt)
        exhausted = final or attempt >= step.attempts_allowed
        retry_at = None if exhausted else self.clock.now() + retry_delay_for(step, attempt)
        settled = self.writes.settle(
            step_id,
            attempt,
            StepStatus.FAILED,
            error=data,
            available_at=retry_at,
            # A final failure spends the remaining attempts, so nothing retries it.
            retries=attempt - 1 if final else None,
            wake=_wake_mode(wake) if exhausted else WAKE_NONE,
        )
        if settled is None:
            raise WorkflowStepSupersededError(step_id, attempt)
        if not exhausted:
            self.notify()
        return exhausted

    def refresh_step_lease(self, step_id: int, lease_ms: int | None, attempt: int) -> bool:
        """Extend (or, with None, park) the claim of ``attempt``; False once it was replaced."""
        expires = None if lease_ms is None else EpochMs() + int(lease_ms)
        return bool(
            self.steps()
            .filter(id=step_id, attempt=attempt, status=StepStatus.RUNNING)
            .update(lease_expires_at=expires)
        )

    # -- executing a claimed step ------------------------------------------------------

    def execute_step(self, claimed: ClaimedStep, *, wake: bool | str = True) -> str:
        """Run a claimed queued step and record its outcome, fenced by its attempt.

        Returns what happened: ``succeeded``, ``retrying``, ``failed``, ``superseded``
        or ``suspended`` (its function is missing). ``wake="pass"`` leaves the run
        of a succeeded step for this thread to pass next (see :meth:`continue_run`).
        """
        definition = registry.get_step(claimed.function)
        with log_context(run_id=str(claimed.run_id), step=claimed.name, attempt=claimed.attempt):
            if definition is None:
                return self._function_missing(claimed)
            return self._execute_in_context(claimed, definition.fn, wake=wake)

    def _execute(self, claimed: ClaimedStep, fn: Callable[..., Any], *, wake: bool | str) -> str:
        with log_context(run_id=str(claimed.run_id), step=claimed.name, attempt=claimed.attempt):
            return self._execute_in_context(claimed, fn, wake=wake)

    def _execute_in_context(
        self, claimed: ClaimedStep, fn: Callable[..., Any], *, wake: bool | str
    ) -> str:
        what = f"The result of step {claimed.name!r}"
        try:
            if claimed.transactional:
                # The function's writes and the fenced result commit together, or
                # not at all: a superseded attempt's writes roll back.
                with self.atomic():
                    result = to_json(registry.call_step_function(fn, claimed.input), what)
                    settled = self.set_step_result(
                        claimed.step_id, result, claimed.attempt, wake=wake
                    )
            else:
                result = to_json(registry.call_step_function(fn, claimed.input), what)
                settled = self.set_step_result(claimed.step_id, result, claimed.attempt, wake=wake)
            if claimed.carried is not None and settled is not None:
                self._carry_result(claimed, claimed.carried, settled)
        except WorkflowStepSupersededError as exc:
            logger.warning("%s: its result was not recorded", exc)
            return "superseded"
        except StepFunctionNotFoundError:
            return self._function_missing(claimed)
        except Exception as exc:
            try:
                exhausted = self.set_step_error(
                    claimed.step_id,
                    exc,
                    claimed.attempt,
                    wake=wake,
                    final=isinstance(exc, NotSerializableError),
                )
            except WorkflowStepSupersededError as superseded:
                logger.warning("%s: its error was not recorded", superseded)
                return "superseded"
            logger.info("Step %s attempt %d failed: %s", claimed.name, claimed.attempt, exc)
            return "failed" if exhausted else "retrying"
        return "succeeded"

    def _carry_result(self, claimed: ClaimedStep, carried: CarriedRun, settled: Settled) -> None:
        """Bring the carried run up to date with its claimed step's success, and with
        its run as the settle found it (cancelled meanwhile, or woken)."""
        step = carried.steps.get(claimed.name)
        if step is None or step.id != claimed.step_id:
            return
        step.status, step.attempt = StepStatus.SUCCEEDED, claimed.attempt
        step.result, step.error = settled.result, None
        step.lease_expires_at = step.available_at = None
        carried.run.status, carried.run.wakes = settled.run_status, settled.run_wakes

    def _function_missing(self, claimed: ClaimedStep) -> str:
        """The current attempt's function is missing: suspend the run (RPC_NOT_FOUND)."""
        error = serialize_error(StepFunctionNotFoundError(claimed.function))
        with self.atomic():
            won = (
                self.steps()
                .filter(id=claimed.step_id, attempt=claimed.attempt, status=StepStatus.RUNNING)
                .update(
                    status=StepStatus.SUSPENDED,
                    error=error,
                    lease_expires_at=None,
                    attempt=claimed.attempt - 1,
                    updated_at=timezone.now(),
                )
            )
            if won:
                self.attempts().filter(step_id=claimed.step_id, attempt=claimed.attempt).delete()
        if not won:
            logger.warning(
                "Superseded attempt %d of step %s found no function %r; left to its new owner",
                claimed.attempt,
                claimed.name,
                claimed.function,
            )
            return "superseded"
        run = self.runs().get(id=claimed.run_id)
        self._suspend_run(run, f"RPC_NOT_FOUND: {error['message']}")
        return "suspended"

    # -- finding work --------------------------------------------------------------

    def claims_serialised(self) -> Any:
        """A lock that one process's claims take in turn on SQLite (a no-op elsewhere)."""
        if self.vendor == "sqlite":
            return self._sqlite_claims
        return _NullLock()

    def claim_due_runs(self, limit: int = 1) -> list[uuid.UUID]:
        """Runs that need a pass now; each is pushed back by the pass timeout meanwhile."""
        now = self.clock.now()
        until = now + timedelta(seconds=pikku_settings.RUN_PASS_TIMEOUT)
        claimed = self.writes.claim_due_runs(now, until, limit)
        if claimed is not None:
            return claimed
        with self.claims_serialised(), self.atomic():
            ids = list(
                self.runs()
                .filter(status=RunStatus.RUNNING, inline=False, wake_at__lte=now)
                .order_by("wake_at")
                .select_for_update(skip_locked=True)
                .values_list("id", flat=True)[:limit]
            )
            if ids:
                self.runs().filter(id__in=ids).update(wake_at=until)
        return ids

    def claim_due_steps(
        self, queues: Iterable[str] | None = None, limit: int = 1, worker: str = ""
    ) -> list[ClaimedStep]:
        """Claim queued steps that are ready: scheduled, due for retry, or whose claim lapsed."""
        now = self.clock.now()
        if not self.writes.ready_steps_exist(now, list(queues or ())):
            return []
        ready = (
            Q(status__in=(StepStatus.SCHEDULED, StepStatus.PENDING), available_at__lte=now)
            | Q(status=StepStatus.FAILED, attempt__lt=F("retries") + 1, available_at__lte=now)
            | Q(status=StepStatus.RUNNING, lease_expires_at__lt=EpochMs())
        )
        qs = self.steps().filter(
            ready,
            kind=StepKind.QUEUED,
            run_id__in=self.runs().filter(status=RunStatus.RUNNING, inline=False).values("id"),
        )
        if queues:
            qs = qs.filter(queue__in=list(queues))
        claimed: list[ClaimedStep] = []
        with self.claims_serialised(), self.atomic():
            candidates = list(
                qs.order_by("id")
                .select_for_update(skip_locked=True)
                .annotate(store_now=EpochMs())[:limit]
            )
            for step in candidates:
                got = self._decide_claim(
                    step, self.lease_ms_for_queue(step.queue), worker or default_worker_id()
                )
                if got is not None:
                    claimed.append(got)
        return claimed

    def start_waiting_runs(self, limit: int = 100) -> int:
        """Start the runs of stored webhook events that wait for one: how many events
        now have their run."""
        from pikku_django.webhooks.dispatch import start_waiting_runs

        return start_waiting_runs(self, limit)

    def work_once(self, queues: Iterable[str] | None = None, worker: str = "") -> int:
        """Do one unit of due work (a pass, or a step), after starting the runs of
        stored webhook events: how many units were done (each event given its run counts)."""
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

    # -- inline runs -------------------------------------------------------------------

    def drive_inline(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """Run an inline run to an end (or suspension) in this process."""
        while True:
            run = self.get_run(run_id)
            if run.status != RunStatus.RUNNING:
                return run
            self.orchestrate(run.id)
            run = self.get_run(run_id)
            if run.status != RunStatus.RUNNING:
                return run
            if self._work_inline_tree(run.id):
                continue
            due = self._next_due_in_tree(run.id)
            if due is None:
                logger.warning("Inline run %s is waiting on work that is not due here", run.id)
                return run
            self.clock.sleep(max(0.0, (due - self.clock.now()).total_seconds()))

    def _tree(self, run_id: uuid.UUID) -> list[uuid.UUID]:
        ids, frontier = [run_id], [run_id]
        while frontier:
            frontier = list(
                self.steps()
                .filter(run_id__in=frontier, child_run__isnull=False)
                .values_list("child_run_id", flat=True)
            )
            ids.extend(frontier)
        return ids

    def _work_inline_tree(self, root: uuid.UUID) -> bool:
        tree = self._tree(root)
        did = False
        now = self.clock.now()
        children = list(
            self.runs()
            .filter(id__in=tree[1:], status=RunStatus.RUNNING)
            .values_list("id", flat=True)
        )
        if children:
            # Progress is a run or step of the tree that changed, not a pass as such:
            # a child that parks on a sleep again has done nothing, and the caller
            # must then wait for the next due time rather than pass it again.
            before = self._tree_state(tree)
            for child_id in children:
                self.orchestrate(child_id)
            did = self._tree_state(tree) != before
        ready = Q(status__in=(StepStatus.SCHEDULED, StepStatus.PENDING), available_at__lte=now) | Q(
            status=StepStatus.FAILED, attempt__lt=F("retries") + 1, available_at__lte=now
        )
        for step in (
            self.steps()
            .annotate(store_now=EpochMs())
            .filter(ready, kind=StepKind.QUEUED, run_id__in=tree)
            .order_by("id")
        ):
            claimed = self._decide_claim(
                step, self.lease_ms_for_queue(step.queue), default_worker_id()
            )
            if claimed is not None:
                self.execute_step(claimed)
                did = True
        return did

    def _tree_state(self, tree: list[uuid.UUID]) -> tuple[set[Any], set[Any]]:
        runs = set(self.runs().filter(id__in=tree).values_list("id", "status"))
        steps = set(self.steps().filter(run_id__in=tree).values_list("id", "status", "attempt"))
        return runs, steps

    def _next_due_in_tree(self, root: uuid.UUID) -> datetime | None:
        tree = self._tree(root)
        dues = [
            d
            for d in self.steps()
            .filter(
                run_id__in=tree,
                status__in=(StepStatus.SCHEDULED, StepStatus.FAILED, StepStatus.PENDING),
                available_at__isnull=False,
            )
            .exclude(status=StepStatus.FAILED, attempt__gte=F("retries") + 1)
            .values_list("available_at", flat=True)
        ]
        return min(dues) if dues else None


class _StepExistsError(Exception):
    """The step was stored by another pass: roll back this attempt's writes."""


class _WriteFailedError(Exception):
    """Storing a step's outcome failed (its cause): not a failure of the step."""


def _new_step(
    run: WorkflowRun, name: str, kind: str, options: StepOptions, payload: Any
) -> NewStep:
    return NewStep(
        run_id=run.id,
        name=name,
        kind=kind,
        function=options.function,
        input=payload,
        retries=options.retries,
        retry_delay=options.retry_delay,
        backoff=options.backoff,
        queue=options.queue,
        transactional=options.transactional,
    )


def _wake_mode(wake: bool | str) -> str:
    # "pass": the thread that settles the step passes its run next. Should it die
    # first, the recovery sweep wakes the run (nothing is left in flight).
    return WAKE_NOW if wake is True else WAKE_NONE


class _NullLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def epoch_ms_now() -> int:
    return process_now_ms()


TERMINAL = TERMINAL_RUN_STATUSES
