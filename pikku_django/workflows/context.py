"""What a workflow function is given: ``ctx.do``, ``ctx.sleep``, ``ctx.suspend``.

The function is replayed from the top on every orchestration pass. Each call
names a step; a settled step answers from the database without running again,
and the first step that is not settled ends the pass.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pikku_django.models import StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows.durations import Duration, parse_duration
from pikku_django.workflows.errors import (
    NonDeterministicWorkflowError,
    StepFailedError,
    WorkflowDefinitionError,
)

if TYPE_CHECKING:
    from pikku_django.workflows.engine import StepClaimer, StepOptions, WorkflowEngine


class Pause(BaseException):
    """Ends an orchestration pass at a step that is not settled.

    A BaseException, so a workflow's own ``except Exception`` cannot swallow it.
    ``wake_at`` is when the run needs its next pass (None: when something wakes it).
    """

    def __init__(self, wake_at: datetime | None = None) -> None:
        super().__init__(wake_at)
        self.wake_at = wake_at


class WorkflowContext:
    """The handle a workflow function receives as its first argument."""

    def __init__(
        self, engine: WorkflowEngine, run: WorkflowRun, steps: dict[str, WorkflowStep]
    ) -> None:
        self.engine = engine
        self.run = run
        self.run_id = run.id
        self.input = fresh(run.input)
        self._steps = steps
        self._seen: defaultdict[str, int] = defaultdict(int)
        #: Set by a worker's pass: the queued step this pass reaches is claimed for
        #: that worker as it is stored, instead of waiting on the queue.
        self.claimer: StepClaimer | None = None
        #: The queued step the pass stopped at, when the claimer takes it.
        self.claim_request: tuple[str, StepOptions, Any] | None = None

    # -- naming -----------------------------------------------------------------

    def _step_name(self, name: object, *, internal: bool = False) -> str:
        if not isinstance(name, str) or not name:
            raise WorkflowDefinitionError(f"A step name must be a non-empty str, got {name!r}")
        if "#" in name and not internal:
            raise WorkflowDefinitionError(
                f"Step name {name!r} may not contain '#': repeats are numbered name#1, name#2"
            )
        n = self._seen[name]
        self._seen[name] += 1
        full = name if n == 0 else f"{name}#{n}"
        if len(full) > 255:
            raise WorkflowDefinitionError(f"Step name {full[:40]!r}... is over 255 characters")
        return full

    def _existing(self, name: str, kind: str, function: str) -> WorkflowStep | None:
        step = self._steps.get(name)
        if step is None:
            return None
        if step.kind != kind or (function and step.function and step.function != function):
            raise NonDeterministicWorkflowError(
                f"Step {name!r} was recorded as {step.kind} {step.function!r} but the workflow "
                f"now makes it {kind} {function!r}: a workflow must call the same steps, in "
                f"the same order, on every replay"
            )
        return step

    def _remember(self, step: WorkflowStep) -> None:
        self._steps[step.name] = step

    # -- steps ------------------------------------------------------------------

    def do(
        self,
        name: str,
        fn: str | Callable[..., Any],
        data: Any = None,
        *,
        retries: int | None = None,
        retry_delay: Duration | None = None,
        backoff: str | None = None,
        on_error: str | Callable[..., Any] | None = None,
        queued: bool | None = None,
        queue: str | None = None,
        transactional: bool | None = None,
    ) -> Any:
        """Run a step once and return its result on every replay.

        ``fn`` is a registered step function (by function or name: handed to a
        worker unless ``queued=False``), a registered workflow (started as a
        child run; the result is its output), or any other callable (run
        inline, in this pass). On the last failed attempt, ``on_error(error)``
        runs as a step of its own and then :class:`StepFailedError` is raised.
        """
        step_name = self._step_name(name)
        child = registry.get_workflow(fn) if _may_be_workflow(fn) else None
        if child is not None:
            return self._child(step_name, child.name, data, on_error)
        options = self.engine.step_options(
            fn,
            retries=retries,
            retry_delay=retry_delay,
            backoff=backoff,
            queued=queued,
            queue=queue,
            transactional=transactional,
        )
        step = self._existing(step_name, options.kind, options.function)
        try:
            if options.kind == StepKind.INLINE:
                return self.engine.run_inline_step(self, step_name, step, options, data)
            return self._queued(step_name, step, options, data)
        except StepFailedError as failed:
            if on_error is not None:
                self._compensate(step_name, on_error, failed)
            raise

    def _queued(self, name: str, step: WorkflowStep | None, options: StepOptions, data: Any) -> Any:
        if step is None:
            if self.claimer is not None and self.claimer.takes(options):
                payload = self.engine.step_input(name, data)
                self.claim_request = (name, options, payload)
                raise Pause(None)
            step = self.engine.schedule_step(self.run, name, options, data)
            self._remember(step)
        return self._settled_or_pause(step)

    def _settled_or_pause(self, step: WorkflowStep) -> Any:
        if step.status == StepStatus.SUCCEEDED:
            return fresh(step.result)
        if step.status == StepStatus.FAILED and step.attempt >= step.attempts_allowed:
            raise StepFailedError(step.name, step.error)
        if step.status == StepStatus.SUSPENDED:
            self.engine.suspend_for_step(self.run, step)
        raise Pause(None)

    def _child(self, name: str, workflow: str, data: Any, on_error: Any) -> Any:
        step = self._existing(name, StepKind.CHILD, workflow)
        if step is None:
            step = self.engine.start_child(self.run, name, workflow, data)
            self._remember(step)
        try:
            return self._settled_or_pause(step)
        except StepFailedError as failed:
            if on_error is not None:
                self._compensate(name, on_error, failed)
            raise

    def _compensate(self, name: str, on_error: Any, failed: StepFailedError) -> None:
        step_name = self._step_name(f"{name}:on_error", internal=True)
        data = {"step": failed.step, "error": failed.error}
        child = registry.get_workflow(on_error) if _may_be_workflow(on_error) else None
        if child is not None:
            self._child(step_name, child.name, data, None)
            return
        options = self.engine.step_options(
            on_error,
            retries=None,
            retry_delay=None,
            backoff=None,
            queued=None,
            queue=None,
            transactional=None,
        )
        step = self._existing(step_name, options.kind, options.function)
        if options.kind == StepKind.INLINE:
            self.engine.run_inline_step(self, step_name, step, options, data)
        else:
            self._queued(step_name, step, options, data)

    def sleep(self, name: str, duration: Duration) -> None:
        """Wait ``duration`` (seconds, a timedelta or text like "5min") durably."""
        step_name = self._step_name(name)
        seconds = parse_duration(duration, what="sleep duration")
        step = self._existing(step_name, StepKind.SLEEP, "")
        if step is None:
            step = self.engine.start_sleep(self.run, step_name, seconds)
            self._remember(step)
        if step.status == StepStatus.SUCCEEDED:
            return
        due = step.available_at
        if due is None or self.engine.clock.now() >= due:
            self.engine.finish_sleep(step)
            return
        raise Pause(due)

    def suspend(self, reason: str = "", *, name: str = "suspend") -> Any:
        """Suspend the run until ``resume_workflow(run_id, data)``; returns that data."""
        step_name = self._step_name(name)
        step = self._existing(step_name, StepKind.SUSPEND, "")
        if step is None:
            step = self.engine.start_suspension(self.run, step_name, str(reason))
            self._remember(step)
        if step.status == StepStatus.SUCCEEDED:
            return fresh(step.result)
        self.engine.suspend_for_step(self.run, step)
        raise Pause(None)

    def now(self) -> datetime:
        """The engine clock's time (use a step for anything you need replayed identically)."""
        return self.engine.clock.now()


def fresh(value: Any) -> Any:
    """A stored JSON value as workflow code gets it: a copy it may change freely, so
    no change reaches what a later pass replays."""
    if isinstance(value, dict | list):
        return copy.deepcopy(value)
    return value


def _may_be_workflow(fn: object) -> bool:
    return isinstance(fn, str) or hasattr(fn, "__pikku_workflow__")


def retry_delay_for(step: WorkflowStep, failed_attempt: int) -> timedelta:
    """The wait after ``failed_attempt`` of ``step`` fails."""
    delay = step.retry_delay
    if step.backoff == "exponential":
        delay = delay * (2 ** max(0, failed_attempt - 1))
    return timedelta(seconds=min(delay, 86400 * 365))
