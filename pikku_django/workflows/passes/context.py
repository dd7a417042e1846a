"""What a workflow function is given: ``ctx.do``, ``ctx.sleep``, ``ctx.suspend``.

The function is replayed from the top on every orchestration pass. Each call
names a step; a settled step answers from the database without running again,
and the first step that is not settled ends the pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pikku_django.models import StepKind, StepStatus, WorkflowStep
from pikku_django.models.fields import UnreadableJSON, readable
from pikku_django.workflows import registry
from pikku_django.workflows._values import Pause, StepOptions
from pikku_django.workflows.compose import _events as _signals_in
from pikku_django.workflows.compose import _published
from pikku_django.workflows.compose._parallel import ParallelGroup, open_group
from pikku_django.workflows.durations import Duration, parse_duration
from pikku_django.workflows.errors import (
    NonDeterministicWorkflowError,
    StepFailedError,
    SuspendTimeoutError,
    WorkflowDefinitionError,
)
from pikku_django.workflows.passes._determinism import check_new_step
from pikku_django.workflows.passes._inline_steps import fresh, fresh_result
from pikku_django.workflows.passes._step_options import retry_delay_for
from pikku_django.workflows.registry import check_timeout
from pikku_django.workflows.runs import _versions
from pikku_django.workflows.runs._options import check_aware

if TYPE_CHECKING:
    from pikku_django.workflows.passes._recorder import StepRecorder

__all__ = ["Pause", "WorkflowContext", "fresh", "retry_delay_for"]


class WorkflowContext:
    """The handle a workflow function receives as its first argument."""

    def __init__(self, recorder: StepRecorder) -> None:
        self._recorder = recorder
        self.run = recorder.run
        self.run_id = recorder.run.id
        value = recorder.run.input
        # Raised when read, in the pass, which then fails the run with the reason.
        self._input = value if isinstance(value, UnreadableJSON) else fresh(value)
        self._seen: defaultdict[str, int] = defaultdict(int)
        #: How many steps were recorded when the pass began, and how many of them it
        #: has reached: a new step while some are not reached is not deterministic.
        self._recorded = recorder.steps
        self._recorded_at_start = len(recorder.steps)
        self._reached = 0
        #: This pass's parallel groups: their new branches are stored at the next step.
        self._groups: list[ParallelGroup] = []

    @property
    def input(self) -> Any:
        """The run's input (a copy the workflow may change freely)."""
        return readable(self._input, "The run's input")

    # -- naming -----------------------------------------------------------------

    def _step_name(self, name: object, *, internal: bool = False, branch: bool = False) -> str:
        if self._groups and not branch:
            for group in self._groups:
                group.flush()
        if not isinstance(name, str) or not name or "\x00" in name:
            raise WorkflowDefinitionError(
                f"A step name must be a non-empty str without NUL characters, got {name!r}"
            )
        if "#" in name and not internal:
            raise WorkflowDefinitionError(
                f"Step name {name!r} may not contain '#': repeats are numbered name#1, name#2"
            )
        seen = self._seen
        n = seen[name]
        seen[name] = n + 1
        if n == 0 and len(name) <= 255:
            full = name
        else:
            full = name if n == 0 else f"{name}#{n}"
            if len(full) > 255:
                raise WorkflowDefinitionError(f"Step name {full[:40]!r}... is over 255 characters")
        if full in self._recorded:
            self._reached += 1
        return full

    def _existing(
        self, name: str, kind: str, function: str, *, new: bool = True
    ) -> WorkflowStep | None:
        """The step recorded as ``name``, or None: then, unless ``new`` is False (the
        caller decides itself whether to record it), the pass may record it."""
        step = self._recorder.recorded(name)
        if step is None:
            _versions.check_no_unknown_patch(self, name)
            if new:
                check_new_step(self, name)
            return None
        if step.kind != kind or (function and step.function and step.function != function):
            _versions.check_no_unknown_patch(self, name)
            raise NonDeterministicWorkflowError(
                f"Step {name!r} was recorded as {step.kind} {step.function!r} but the workflow "
                f"now makes it {kind} {function!r}: a workflow must call the same steps, in "
                f"the same order, on every replay. To change a workflow that has runs in "
                f"flight, branch on ctx.patched('change-id')"
            )
        return step

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
        timeout: Duration | None = None,
    ) -> Any:
        """Run a step once and return its result on every replay.

        ``fn`` is a registered step function (by function or name: handed to a
        worker unless ``queued=False``), a registered workflow (started as a
        child run; the result is its output), or any other callable (run
        inline, in this pass). On the last failed attempt, ``on_error(error)``
        runs as a step of its own and then :class:`StepFailedError` is raised.
        ``timeout`` fails an attempt that runs longer (StepTimeoutError, retried by
        its policy); the function itself is not interrupted.
        """
        step_name = self._step_name(name)
        plain = (
            retries is None
            and retry_delay is None
            and backoff is None
            and queued is None
            and queue is None
            and transactional is None
            and timeout is None
        )
        if plain:
            # Replay's common case: a step that succeeded on an earlier pass, in O(1).
            replayed = self._recorder.replayed(step_name, fn)
            if replayed is not None:
                return fresh_result(replayed)
        child = registry.get_workflow(fn) if _may_be_workflow(fn) else None
        if child is not None:
            return self._child(step_name, child.name, data, on_error)
        options = self._recorder.options(
            fn,
            retries=retries,
            retry_delay=retry_delay,
            backoff=backoff,
            queued=queued,
            queue=queue,
            transactional=transactional,
            timeout=timeout,
        )
        if plain:
            self._recorder.plain_call(fn, options)
        step = self._existing(step_name, options.kind, options.function)
        try:
            if options.kind == StepKind.INLINE:
                return self._recorder.run_inline(step_name, step, options, data)
            return self._queued(step_name, step, options, data)
        except StepFailedError as failed:
            if on_error is not None:
                self._compensate(step_name, on_error, failed)
            raise

    def _queued(self, name: str, step: WorkflowStep | None, options: StepOptions, data: Any) -> Any:
        if step is None:
            step = self._recorder.queue(name, options, data)
        return self._settled_or_pause(step)

    def _settled_or_pause(self, step: WorkflowStep) -> Any:
        if step.status == StepStatus.SUCCEEDED:
            return fresh_result(step)
        if step.status == StepStatus.FAILED and step.attempt >= step.attempts_allowed:
            raise StepFailedError(step.name, step.error)
        if step.status == StepStatus.SUSPENDED:
            self._recorder.suspend_at(step)
        raise Pause(None)

    def _child(self, name: str, workflow: str, data: Any, on_error: Any) -> Any:
        step = self._existing(name, StepKind.CHILD, workflow)
        if step is None:
            step = self._recorder.start_child(name, workflow, data)
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
        options = self._recorder.options(on_error)
        step = self._existing(step_name, options.kind, options.function)
        if options.kind == StepKind.INLINE:
            self._recorder.run_inline(step_name, step, options, data)
        else:
            self._queued(step_name, step, options, data)

    def sleep(
        self, name: str, duration: Duration | None = None, *, until: datetime | None = None
    ) -> None:
        """Wait ``duration`` (seconds, a timedelta or text like "5min"), or ``until`` a
        timezone-aware time, durably (a time already past returns at once)."""
        step_name = self._step_name(name)
        seconds = self._sleep_seconds(duration, until)
        step = self._existing(step_name, StepKind.SLEEP, "")
        if step is None:
            step = self._recorder.start_sleep(step_name, seconds)
        if step.status == StepStatus.SUCCEEDED:
            return
        due = step.available_at
        if due is None or self._recorder.now() >= due:
            self._recorder.finish_sleep(step)
            return
        raise Pause(due)

    def sleep_until(self, name: str, when: datetime) -> None:
        """Wait durably until ``when`` (timezone-aware): ``sleep(name, until=when)``."""
        self.sleep(name, until=when)

    def _sleep_seconds(self, duration: Duration | None, until: datetime | None) -> float:
        if (duration is None) == (until is None):
            raise WorkflowDefinitionError(
                "ctx.sleep takes a duration or until= (a time), exactly one of them"
            )
        if until is not None:
            check_aware(until, "until")
            return max(0.0, (until - self._recorder.now()).total_seconds())
        return parse_duration(duration, what="sleep duration")

    def suspend(
        self, reason: str = "", *, name: str = "suspend", timeout: Duration | None = None
    ) -> Any:
        """Suspend the run until ``resume_workflow(run_id, data)``; returns that data.

        With ``timeout``, a suspension not resumed that long after it began ends
        with :class:`SuspendTimeoutError` raised here instead (catch it to go on).
        """
        step_name = self._step_name(name)
        seconds = None if timeout is None else check_timeout(timeout)
        step = self._existing(step_name, StepKind.SUSPEND, "")
        if step is None:
            step = self._recorder.start_suspension(step_name, str(reason), seconds)
        if step.status == StepStatus.SUCCEEDED:
            return fresh(step.result)
        if step.status == StepStatus.FAILED:
            raise SuspendTimeoutError(step.name, step.timeout or 0.0)
        self._recorder.suspend_at(step)
        raise Pause(None)

    def wait_for_event(self, name: str, *, timeout: Duration | None = None) -> Any:
        """Wait durably for the event ``name`` sent to this run (``send_event``): its
        data, or :data:`~pikku_django.workflows.TIMED_OUT` once ``timeout`` passed.
        An event sent before the wait is kept for it."""
        return _signals_in.wait_for_event(self, name, timeout)

    def set_event(self, name: str, value: Any) -> None:
        """Publish ``value`` under ``name``: callers read it (``published_values``)
        and the status stream carries it."""
        _published.set_event(self, name, value)

    def set_progress(self, value: Any) -> None:
        """Publish ``value`` as the run's ``progress``."""
        _published.set_event(self, _published.PROGRESS, value)

    def patched(self, change_id: str) -> bool:
        """True for a run that reaches this point under code with the change
        ``change_id``, False for a run that was already past it under older code;
        the same on every replay, so both paths replay."""
        return _versions.patched(self, change_id)

    def parallel(self, name: str = "parallel") -> ParallelGroup:
        """A group of steps and child runs started without waiting for each:
        ``group.do(...)`` starts a branch, ``group.join()`` waits for them all."""
        group = open_group(self, name)
        self._groups.append(group)
        return group

    def now(self) -> datetime:
        """The engine clock's time (use a step for anything you need replayed identically)."""
        return self._recorder.now()


def _may_be_workflow(fn: object) -> bool:
    return isinstance(fn, str) or hasattr(fn, "__pikku_workflow__")
