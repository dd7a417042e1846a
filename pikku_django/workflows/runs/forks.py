"""Re-running a finished run from one of its steps: ``fork_run``.

A fork is a new run of the same workflow, with the same input, that keeps the
recorded results of the steps before the chosen one (copied, so its replay
returns them without running them) and runs the chosen step and everything
after it again. The original run is only read. See docs/guides/forks.md.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError

from pikku_django.models import StepKind, WorkflowEvent, WorkflowRun, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows.compose._parallel import settled
from pikku_django.workflows.compose._published import PUBLISH_PREFIX
from pikku_django.workflows.errors import WorkflowError, WorkflowRunNotFoundError
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.runs._django_signals import RunEvents
from pikku_django.workflows.store.fork import ForkCopy
from pikku_django.workflows.tracing import current_trace_context

if TYPE_CHECKING:
    from pikku_django.workflows.engine import WorkflowEngine

logger = workflow_logger(__name__)

__all__ = [
    "ForkPoint",
    "ForkRefusal",
    "ForkRefusedError",
    "RunForker",
    "StepRef",
    "fork_run",
    "preview_fork",
]

#: A step of the run: its recorded name, or its 1-based position among the run's
#: steps in the order they were recorded (as ``pikku_runs show`` numbers them).
StepRef = str | int


class ForkRefusal(enum.StrEnum):
    """Why a run cannot be forked."""

    #: The run is running or suspended: cancel it or let it end first.
    NOT_FINISHED = "not_finished"
    #: No step of the run has that name or position.
    UNKNOWN_STEP = "unknown_step"
    #: No workflow of the run's name is registered in this code.
    NOT_REGISTERED = "not_registered"
    #: The run was recorded under a version this code does not replay.
    VERSION_MISMATCH = "version_mismatch"
    #: The step is a branch of a parallel group, or a group is open around it.
    IN_PARALLEL_GROUP = "in_parallel_group"
    #: A step before the fork point never reached its outcome.
    UNSETTLED_STEP = "unsettled_step"


class ForkRefusedError(WorkflowError):
    """The run cannot be forked from that step; ``reason`` says why."""

    code = "FORK_REFUSED"

    def __init__(self, reason: ForkRefusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ForkPoint:
    """Where a run is forked: the step run again first, the steps kept, and the
    steps recorded from it on (which the fork runs again)."""

    run: WorkflowRun
    step: WorkflowStep
    kept: list[WorkflowStep]
    again: list[WorkflowStep]


def find_fork_point(run: WorkflowRun, steps: Sequence[WorkflowStep], ref: StepRef) -> ForkPoint:
    """The fork point ``ref`` names among the run's ``steps`` (in recorded order);
    ForkRefusedError when none is, or when forking there is not safe."""
    at = _named(run, steps, ref)
    if at.group_id is not None:
        group = next((s.name for s in steps if s.pk == at.group_id), "?")
        raise ForkRefusedError(
            ForkRefusal.IN_PARALLEL_GROUP,
            f"Step {at.name!r} is a branch of parallel group {group!r}: its branches "
            f"run together, so fork from the group's start ({group!r}) instead",
        )
    kept = [s for s in steps if s.pk < at.pk]
    kept_ids = {s.pk for s in kept}
    for step in steps:
        if step.pk > at.pk and step.group_id in kept_ids:
            group = next(s.name for s in kept if s.pk == step.group_id)
            raise ForkRefusedError(
                ForkRefusal.IN_PARALLEL_GROUP,
                f"Step {at.name!r} is inside parallel group {group!r} (its branch "
                f"{step.name!r} was started after it): fork from {group!r} instead",
            )
    for step in kept:
        if not settled(step):
            raise ForkRefusedError(
                ForkRefusal.UNSETTLED_STEP,
                f"Step {step.name!r}, before {at.name!r}, is {step.status} in run {run.id}: "
                f"only settled steps are kept. Fork from {step.name!r} or earlier",
            )
    return ForkPoint(run, at, kept, [s for s in steps if s.pk >= at.pk])


def _named(run: WorkflowRun, steps: Sequence[WorkflowStep], ref: StepRef) -> WorkflowStep:
    if isinstance(ref, bool) or not isinstance(ref, str | int):
        raise TypeError(f"from_step is a step's name (str) or position (int), not {ref!r}")
    if isinstance(ref, int):
        if 1 <= ref <= len(steps):
            return steps[ref - 1]
        what = f"no step at position {ref} (it has {len(steps)})"
    else:
        found = next((s for s in steps if s.name == ref), None)
        if found is not None:
            return found
        names = ", ".join(repr(s.name) for s in steps[:10]) or "none"
        more = f" and {len(steps) - 10} more" if len(steps) > 10 else ""
        what = f"no step named {ref!r} (its steps: {names}{more})"
    raise ForkRefusedError(ForkRefusal.UNKNOWN_STEP, f"Run {run.id} has {what}")


def published_of(kept: Sequence[WorkflowStep]) -> dict[str, Any] | None:
    """The published values the kept ``ctx.set_event`` steps set, the last one of
    each name winning, as the run that recorded them held them."""
    values = {
        s.function: s.result
        for s in kept
        if s.kind == StepKind.PUBLISH and s.name.startswith(PUBLISH_PREFIX)
    }
    return values or None


class RunForker:
    """Forks runs on one engine's database, by its clock."""

    def __init__(self, engine: WorkflowEngine) -> None:
        self.engine = engine
        self.store = engine.store

    def original(self, run_id: uuid.UUID | str) -> WorkflowRun:
        try:
            return self.store.runs().get(id=run_id)
        except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError) as exc:
            raise WorkflowRunNotFoundError(f"No workflow run has id {run_id!r}") from exc

    def definition(self, run: WorkflowRun) -> registry.WorkflowDefinition:
        """The run's registered workflow, if this code may replay the run's steps."""
        if not run.is_terminal:
            raise ForkRefusedError(
                ForkRefusal.NOT_FINISHED,
                f"Run {run.id} is {run.status}: only a completed, failed or cancelled run "
                "is forked (a fork of a run in progress would repeat what it is doing). "
                "Cancel it first",
            )
        definition = registry.get_workflow(run.workflow)
        if definition is None:
            raise ForkRefusedError(
                ForkRefusal.NOT_REGISTERED,
                f"Run {run.id} is of workflow {run.workflow!r}, which this code does not "
                "register: nothing could replay its steps",
            )
        if run.version and run.version not in definition.carried_versions:
            raise ForkRefusedError(
                ForkRefusal.VERSION_MISMATCH,
                f"Run {run.id} was recorded under version {run.version!r} of "
                f"{run.workflow!r}; the deployed code is version {definition.version!r} "
                "and does not replay it (replays=...): its kept steps could not be "
                "replayed as recorded. Deploy that version, or start a new run",
            )
        return definition

    def preview(self, run_id: uuid.UUID | str, from_step: StepRef) -> ForkPoint:
        """Where :meth:`fork` would fork the run (nothing written); the same refusals."""
        run = self.original(run_id)
        self.definition(run)
        steps = list(self.store.steps().filter(run_id=run.pk).order_by("id"))
        return find_fork_point(run, steps, from_step)

    def fork(
        self,
        run_id: uuid.UUID | str,
        from_step: StepRef,
        *,
        priority: int | None = None,
        queue: str | None = None,
    ) -> WorkflowRun:
        """See :func:`pikku_django.workflows.fork_run`."""
        point = self.preview(run_id, from_step)
        run = point.run
        definition = self.definition(run)
        kept_ids = {s.pk for s in point.kept}
        taken = WorkflowEvent.objects.using(self.store.using).filter(
            run_id=run.pk, step__isnull=False
        )
        events = [e for e in taken.order_by("id") if e.step_id in kept_ids]
        copy = ForkCopy(self._new_run(run, definition, point, priority, queue), point.kept, events)
        fork = self.store.create_fork(copy)
        logger.info(
            "Run %s forked from run %s at step %r (%d steps kept)",
            fork.id,
            run.id,
            point.step.name,
            len(point.kept),
        )
        RunEvents(self.engine, self.store.using).run_started(fork)
        return fork

    def _new_run(
        self,
        run: WorkflowRun,
        definition: registry.WorkflowDefinition,
        point: ForkPoint,
        priority: int | None,
        queue: str | None,
    ) -> WorkflowRun:
        now = self.engine.clock.now()
        keyed = run.concurrency_key is not None
        return WorkflowRun(
            workflow=run.workflow,
            input=run.input,
            priority=run.priority if priority is None else registry.check_priority(priority),
            queue=run.queue if queue is None else registry.check_queue(queue),
            concurrency_key=run.concurrency_key,
            concurrency_limit=run.concurrency_limit,
            key_waiting=keyed,
            wake_at=None if keyed else now,
            deadline_at=None
            if definition.timeout is None
            else now + timedelta(seconds=definition.timeout),
            trace_context=current_trace_context(),
            version=run.version or definition.version,
            published=published_of(point.kept),
            forked_from=run,
            forked_at_step=point.step.name,
        )


def fork_run(
    run_id: uuid.UUID | str,
    from_step: StepRef,
    *,
    using: str | None = None,
    priority: int | None = None,
    queue: str | None = None,
) -> WorkflowRun:
    """Start a new run of a finished run's workflow, re-run from the step ``from_step``
    (its recorded name, or its 1-based position in the run's recorded steps), and
    return it. The original run is left exactly as it was.

    The new run has a new id, the original's input, priority, queue and concurrency
    key (``priority`` and ``queue`` override them), no idempotency key, the
    workflow's timeout counted from now, and ``forked_from`` / ``forked_at_step``
    naming the original and the step. It is due at once, for a worker.

    - Steps before ``from_step`` are kept: their recorded results (and failures the
      workflow caught) are copied, so the replay returns them without running them.
      Their effects, a transactional step's included, happened once, in the
      original, and are not repeated. A kept child-workflow step points at the
      original's child run; published values set by kept steps are kept.
    - ``from_step`` and every step after it run again, as in a new run: their
      effects (charges, emails, a transactional step's writes) happen again, and
      child workflows from there on are new child runs.
    - Events: an event the original received is copied only when a kept
      ``wait_for_event`` step took it; the others are not, and a wait from the fork
      point on waits for an event sent to the new run.

    Refused with :class:`ForkRefusedError` (``reason`` a :class:`ForkRefusal`): a run
    still running or suspended (cancel it first); a step the run does not have; a
    workflow this code does not register; a run recorded under a version the
    deployed code does not replay; a step that is a branch of a parallel group, or
    inside an open group (fork from the group's step, which re-runs the whole
    group); a step before the fork point that never settled.
    ``WorkflowRunNotFoundError`` when no run has that id. ``using`` is the
    database of the runs (default ``PIKKU["WORKFLOW_DATABASE"]``).
    """
    return forker(using).fork(run_id, from_step, priority=priority, queue=queue)


def preview_fork(
    run_id: uuid.UUID | str, from_step: StepRef, *, using: str | None = None
) -> ForkPoint:
    """What :func:`fork_run` would keep and run again (nothing written): its refusals
    raised as it raises them."""
    return forker(using).preview(run_id, from_step)


def forker(using: str | None) -> RunForker:
    """The forker on the project's engine, or on one for the database ``using``."""
    from pikku_django.workflows.api import get_engine
    from pikku_django.workflows.engine import WorkflowEngine

    engine = get_engine()
    if using is not None and using != engine.using:
        engine = WorkflowEngine(using)
    return RunForker(engine)
