"""Starting, resuming, cancelling and retrying runs (what users call)."""

from __future__ import annotations

import contextlib
import re
import uuid
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError

from pikku_django.models import RunStatus, StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.wakeups import announce_run_end
from pikku_django.workflows._values import to_json
from pikku_django.workflows.compose._branches import failed_group
from pikku_django.workflows.control._debounce import debounced_start
from pikku_django.workflows.errors import WorkflowRunNotFoundError, WorkflowRunStateError
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.registry import WorkflowDefinition
from pikku_django.workflows.runs._new_run import FindFirstStep, check_idempotency_key, run_row
from pikku_django.workflows.runs._options import RunOptions
from pikku_django.workflows.runs._state import RunStates

logger = workflow_logger(__name__)

#: The name ``ctx.do(..., on_error=...)`` gives a compensation step: ``<step>:on_error``.
COMPENSATION_NAME = re.compile(r"(?P<step>.+):on_error(?:#\d+)?")


class RunLifecycle:
    """The operations on whole runs; driving inline runs is the caller's."""

    def __init__(self, states: RunStates) -> None:
        self.states = states
        self.store = states.store
        self.clock = states.clock
        #: Finds a new run's first step (``WorkflowRun.first_step``); set by the engine.
        self.find_first_step: FindFirstStep | None = None

    def get(self, run_id: uuid.UUID | str) -> WorkflowRun:
        try:
            return self.store.runs().get(id=run_id)
        except (WorkflowRun.DoesNotExist, ValidationError, ValueError, TypeError) as exc:
            # A malformed id (ValidationError from the UUID field) matches no run either.
            raise WorkflowRunNotFoundError(f"No workflow run has id {run_id!r}") from exc

    def start(
        self,
        definition: WorkflowDefinition,
        input: Any,
        *,
        idempotency_key: str | None,
        inline: bool,
        options: RunOptions | None = None,
        debounced: bool = False,
    ) -> tuple[WorkflowRun, bool]:
        """Create a run (or find the one with this idempotency key), due now or at its
        ``options.start_at``: the run, and whether this call created it. A
        ``debounced`` start reuses the key's run while it waits (see ``_debounce``)."""
        options = options or RunOptions()
        payload = to_json(input, "The workflow input")
        check_idempotency_key(idempotency_key)
        runs = self.store.runs()
        if debounced and idempotency_key is not None:
            key = idempotency_key
            run, created = debounced_start(
                self.store,
                definition.name,
                payload,
                key,
                options,
                # Not found ahead: a debounced run's input may change while it waits.
                lambda: self._create(definition, payload, key, inline, options, first=False),
                self.clock.now,
            )
            if created:
                with log_context(workflow=run.workflow, run_id=str(run.id)):
                    logger.info("Run started (debounced)")
            return run, created
        if idempotency_key is not None:
            existing = runs.filter(workflow=definition.name, idempotency_key=idempotency_key)
            found = existing.first()
            if found is not None:
                return found, False
        try:
            run = self._create(definition, payload, idempotency_key, inline, options)
        except IntegrityError:
            if idempotency_key is None:
                raise
            return self.store.keyed_run(definition.name, idempotency_key), False
        with log_context(workflow=run.workflow, run_id=str(run.id)):
            logger.info("Run started%s", " (inline)" if inline else "")
        return run, True

    def _create(
        self,
        definition: WorkflowDefinition,
        payload: Any,
        idempotency_key: str | None,
        inline: bool,
        options: RunOptions,
        *,
        first: bool = True,
    ) -> WorkflowRun:
        """Insert the run (IntegrityError if its idempotency key is taken), with its
        opening step when its workflow declares one (see ``_opening``), else with its
        first step found ahead when ``first`` (see ``_first_step``)."""
        row = run_row(
            definition,
            payload,
            idempotency_key,
            options,
            self.clock.now(),
            inline=inline,
            config=self.store.config,
            find_first_step=self.find_first_step if first else None,
        )
        run = row.run
        self.store.create_run(run, row.opening, row.due)
        self.states.events.run_started(run)
        return run

    def resume(self, run_id: uuid.UUID | str, data: Any) -> WorkflowRun:
        """Set a suspended run running; its ``ctx.suspend()`` returns ``data``."""
        payload = to_json(data, "The resume data")
        run = self.get(run_id)
        with self.store.atomic():
            if not self.store.resume_run(run.id, None if run.inline else self.clock.now()):
                run.refresh_from_db()
                raise WorkflowRunStateError(
                    f"Run {run.id} is {run.status}, not suspended: only a suspended run resumes"
                )
            now = self.clock.now()
            for step in self.store.steps().filter(run_id=run.id, status=StepStatus.SUSPENDED):
                if step.kind == StepKind.SUSPEND:
                    self.states.finish_marker(step, StepStatus.SUCCEEDED, result=payload)
                else:
                    # A function that was missing: hand the step to a worker again.
                    self.store.reschedule_suspended(step.id, now)
            self.store.notify()
        logger.info("Resumed workflow run %s", run.id)
        return run

    def cancel(self, run_id: uuid.UUID | str) -> tuple[WorkflowRun, bool]:
        """Cancel a run that has not finished, and the child runs it waits for: the run,
        and whether this call cancelled it (False: it was cancelled already)."""
        run = self.get(run_id)
        with self.store.atomic():
            if not self.store.cancel_run(run.id):
                run.refresh_from_db()
                if run.status == RunStatus.CANCELLED:
                    return run, False
                raise WorkflowRunStateError(f"Run {run.id} is {run.status}: it cannot be cancelled")
            self.states.events.run_finished(run, RunStatus.CANCELLED)
            announce_run_end(self.store.using, run.id, notifying=self.store.notifying)
            children = list(
                self.store.steps()
                .filter(run_id=run.id, kind=StepKind.CHILD, child_run__isnull=False)
                .values_list("child_run_id", flat=True)
            )
            self.states.settle_parents(run.id, RunStatus.CANCELLED, None, None)
        for child in children:
            with contextlib.suppress(WorkflowRunStateError):  # ended meanwhile
                self.cancel(child)
        logger.info("Cancelled workflow run %s", run.id)
        return run, True

    def retry(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """Reopen a failed run at the step whose failure failed it."""
        run = self.get(run_id)
        group = failed_group(self.store, run.id)
        if group is not None:
            raise WorkflowRunStateError(
                f"Run {run.id} failed at the fail-fast join of parallel group {group!r}, "
                "which is not reopened: start a new run"
            )
        with self.store.atomic():
            reopened = self._reopen_failed_run(run)
            if not run.inline:
                self.store.notify()
        logger.info("Retrying workflow run %s (steps: %s)", run.id, ", ".join(reopened) or "none")
        return run

    def _reopen_failed_run(self, run: WorkflowRun) -> list[str]:
        """Set a failed run running again and reopen its failed steps: their names."""
        now = self.clock.now()
        # A deadline already past is dropped: the retry would fail at once.
        if not self.store.reopen_run(run.id, now, None if run.inline else now):
            current = self.get(run.id)
            raise WorkflowRunStateError(
                f"Run {run.id} is {current.status}, not failed: only a failed run is retried"
            )
        steps = self._steps_that_failed_run(run.id)
        for step in steps:
            self._reopen_step(step, now)
        return [step.name for step in steps]

    def _steps_that_failed_run(self, run_id: uuid.UUID) -> list[WorkflowStep]:
        """The last step the run reached, if its failure was final, with its failed
        compensation. Replay creates steps in the order the workflow reaches them, so
        the step whose failure ended the run is the last one but for its compensation;
        failures the workflow caught and carried on from are left as they are."""
        steps = list(self.store.steps().filter(run_id=run_id).order_by("id"))
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
        """Give a finally failed step one more attempt (a child step: wait for its child)."""
        if step.kind == StepKind.CHILD:
            self._reopen_child_step(step)
            return
        if not self.store.reopen_step(step.id, step.attempt, now):
            raise _changed_meanwhile(step)

    def _reopen_child_step(self, step: WorkflowStep) -> None:
        child = (
            self.store.runs().filter(id=step.child_run_id).first() if step.child_run_id else None
        )
        if child is None or child.status == RunStatus.CANCELLED:
            what = "no longer exists" if child is None else f"{child.id} was cancelled"
            raise WorkflowRunStateError(
                f"Step {step.name!r} of run {step.run_id} waited for a child run that {what}: "
                "it cannot be retried; start a new run"
            )
        attempt = step.attempt + 1
        if not self.store.reopen_child_step(step.id, step.attempt, step.retries + 1):
            raise _changed_meanwhile(step)
        step.status, step.attempt, step.retries = StepStatus.RUNNING, attempt, step.retries + 1
        if child.status == RunStatus.FAILED:
            self._reopen_failed_run(child)
        elif child.status == RunStatus.COMPLETED:
            # Retried on its own meanwhile: its output settles the step now.
            self.states.finish_marker(step, StepStatus.SUCCEEDED, result=child.output)
        # A child running again (retried on its own) settles the step when it ends.


def _changed_meanwhile(step: WorkflowStep) -> WorkflowRunStateError:
    return WorkflowRunStateError(
        f"Step {step.name!r} of run {step.run_id} changed while it was being retried"
    )
