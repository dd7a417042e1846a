"""The step recorder: what a pass's :class:`WorkflowContext` asks of the engine.

It holds the run's recorded steps (read once per pass, or carried from the last
one) and writes the steps the workflow reaches; the context only talks to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pikku_django.models import StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows._values import Pause, StepClaimer, StepOptions, to_json
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.durations import Duration
from pikku_django.workflows.errors import (
    StepFunctionNotFoundError,
    WorkflowError,
    serialize_error,
)
from pikku_django.workflows.passes._inline_steps import InlineSteps
from pikku_django.workflows.passes._memo import recorded_steps
from pikku_django.workflows.passes._step_options import resolve_step_options

#: Read on every replayed step: a module constant, not an enum class's attribute.
_SUCCEEDED = StepStatus.SUCCEEDED.value


class StepRecorder:
    """One pass's memo of a run's steps, and the writes of the steps it reaches."""

    def __init__(
        self,
        run: WorkflowRun,
        steps: dict[str, WorkflowStep],
        *,
        config: EngineConfig,
        inline: InlineSteps,
        claimer: StepClaimer | None = None,
    ) -> None:
        self.run = run
        self.steps = recorded_steps(steps)
        self.config = config
        self.inline = inline
        self.states = inline.states
        self.store = inline.store
        self.clock = inline.clock
        #: Set by a worker's pass: the queued step this pass reaches is claimed for
        #: that worker as it is stored, instead of waiting on the queue.
        self.claimer = claimer if claimer is None or claimer.inline == run.inline else None
        #: The queued step the pass stopped at, when the claimer takes it.
        self.claim_request: tuple[str, StepOptions, Any] | None = None
        #: Options of calls that name only a function, by function: a loop over one
        #: function resolves them once a pass.
        self._options: dict[Any, StepOptions] = {}
        #: The run had no steps when it was claimed, and none has been read since:
        #: see :meth:`recorded`.
        self.unread = False
        self._resolved: StepOptions | None = None
        #: What a call naming only ``fn`` makes, by ``fn`` (a step's kind and function),
        #: once this pass resolved it: replayed steps are checked against it.
        self._plain: dict[Any, tuple[str, str]] = {}
        #: Why this pass may record no new step (see ``_determinism.check_new_step``):
        #: the pass fails the run with it, even when the workflow body caught it.
        self.refusal: WorkflowError | None = None
        #: Child branches of parallel groups reached but not stored yet (stored together).
        self.deferred = 0

    def write_nothing(self) -> None:
        """Let this pass replay and stop at a queued step its claimer takes, but not
        write: whatever would write (a step, a sleep, a park...) raises
        :class:`WritesRefused` instead."""
        refused = _Refused()
        self.inline = self.states = self.store = refused  # type: ignore[assignment]

    def replayed(self, name: str, fn: object) -> WorkflowStep | None:
        """The step recorded under ``name`` when it succeeded as the call naming only
        ``fn`` makes it, already resolved this pass; else None (the caller takes the
        full path, which also reports a step the workflow now makes differently)."""
        try:
            kind, function = self._plain[fn]
        except (KeyError, TypeError):  # not resolved yet this pass, or not a key
            return None
        step = self.steps.get(name)
        if (
            step is None
            or step.status != _SUCCEEDED
            or step.kind != kind
            or (function and step.function and step.function != function)
        ):
            return None
        return step

    def plain_call(self, fn: object, options: StepOptions) -> None:
        """Note what a call naming only ``fn`` resolved to (see :meth:`replayed`)."""
        with contextlib.suppress(TypeError):  # not a key
            self._plain[fn] = (options.kind, options.function)

    def recorded(self, name: str) -> WorkflowStep | None:
        """The step recorded under ``name``, or None. While the steps are unread, only
        a queued step this pass's claimer takes (the options just resolved) may be
        taken as new; anything else raises :class:`StepsUnread`."""
        resolved, self._resolved = self._resolved, None
        if self.unread and not (resolved is not None and self._claims(resolved)):
            raise StepsUnread()
        return self.steps.get(name)

    def _claims(self, options: StepOptions) -> bool:
        """Whether this pass's claimer takes a new queued step with ``options``."""
        return (
            self.claimer is not None
            and self.claimer.takes(options)
            # A limited queue's steps are claimed where its limits are counted.
            and not self.config.is_limited(options.queue)
            # A paused queue's wait (the claim checks the pause; this spares its refusal).
            and (isinstance(self.store, _Refused) or not self.store.queue_paused(options.queue))
        )

    def _cached_options(self, fn: str | Callable[..., Any]) -> StepOptions | None:
        """``fn``'s options resolved earlier without overrides, or None (not yet, or
        ``fn`` cannot be a key)."""
        try:
            return self._options.get(fn)
        except TypeError:
            return None

    def remember(self, step: WorkflowStep) -> None:
        self.steps.add(step)

    def now(self) -> datetime:
        return self.clock.now()

    def options(
        self,
        fn: str | Callable[..., Any],
        *,
        retries: int | None = None,
        retry_delay: Duration | None = None,
        backoff: str | None = None,
        queued: bool | None = None,
        queue: str | None = None,
        transactional: bool | None = None,
        timeout: Duration | None = None,
    ) -> StepOptions:
        # Spelt out: a replay of a long run asks this once per step it passes.
        plain = (
            retries is None
            and retry_delay is None
            and backoff is None
            and queued is None
            and queue is None
            and transactional is None
            and timeout is None
        )
        cached = self._cached_options(fn) if plain else None
        if cached is not None:
            self._resolved = cached
            return cached
        options = resolve_step_options(
            self.config,
            fn,
            retries=retries,
            retry_delay=retry_delay,
            backoff=backoff,
            queued=queued,
            queue=queue,
            transactional=transactional,
            timeout=timeout,
            run_queue=self.run.queue,
        )
        if plain:
            with contextlib.suppress(TypeError):
                self._options[fn] = options
        self._resolved = options
        return options

    # -- queued steps ----------------------------------------------------------------

    def queue(
        self, name: str, options: StepOptions, data: Any, *, group: WorkflowStep | None = None
    ) -> WorkflowStep:
        """Store a new queued step: claimed by this pass's claimer (Pause), or scheduled
        (always, for a branch of a parallel ``group``: the pass goes on)."""
        payload = to_json(data, f"The input of step {name!r}")
        if group is None and self._claims(options):
            self.claim_request = (name, options, payload)
            raise Pause(None)
        if self.unread:
            raise StepsUnread()
        missing = registry.get_step(options.function) is None
        step = self.inline.create(
            self.run,
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
            timeout=options.timeout,
            available_at=self.clock.now(),
            group=group,
        )
        if not missing:
            self.store.notify()
        self.remember(step)
        return step

    def run_inline(
        self, name: str, step: WorkflowStep | None, options: StepOptions, data: Any
    ) -> Any:
        """Run an inline step in this pass: its result."""
        return self.inline.run(self.run, name, step, options, data, self.remember)

    # -- children, sleeps, suspensions ------------------------------------------------

    def start_child(self, name: str, workflow: str, data: Any) -> WorkflowStep:
        payload = to_json(data, f"The input of child workflow step {name!r}")
        with self.store.atomic():
            step = self.inline.create(
                self.run,
                name=name,
                kind=StepKind.CHILD,
                function=workflow,
                input=payload,
                status=StepStatus.RUNNING,
                attempt=1,
                retries=0,
            )
            if step.child_run_id is None:
                definition = registry.get_workflow(workflow)
                timeout = definition.timeout if definition is not None else None
                child = WorkflowRun(
                    workflow=workflow,
                    input=payload,
                    inline=self.run.inline,
                    priority=self.run.priority,  # a child step inherits it, as any step
                    wake_at=None if self.run.inline else self.clock.now(),
                    # Its workflow's @workflow(timeout=...), from now.
                    deadline_at=None
                    if timeout is None
                    else self.clock.now() + timedelta(seconds=timeout),
                    trace_context=self.run.trace_context,
                    version=_version_of(workflow),
                )
                self.store.attach_child(step.id, child)
                self.states.events.run_started(child, parent_run_id=self.run.id)
                step.child_run_id = child.id
                self.store.notify()
        self.remember(step)
        return step

    def start_sleep(self, name: str, seconds: float) -> WorkflowStep:
        step = self.inline.create(
            self.run,
            name=name,
            kind=StepKind.SLEEP,
            input={"seconds": seconds},
            status=StepStatus.SCHEDULED,
            retries=0,
            available_at=self.clock.now() + timedelta(seconds=seconds),
        )
        self.remember(step)
        return step

    def finish_sleep(self, step: WorkflowStep) -> None:
        self.states.finish_marker(step, StepStatus.SUCCEEDED, result=None)
        step.status = StepStatus.SUCCEEDED

    def start_suspension(
        self, name: str, reason: str, timeout: float | None = None
    ) -> WorkflowStep:
        """Store a suspension; with ``timeout`` it times out (available_at) that late.
        NotSerializableError, as for a step's input, if ``reason`` holds a NUL."""
        given: dict[str, Any] = {"reason": reason}
        if timeout is not None:
            given["timeout"] = timeout
        step = self.inline.create(
            self.run,
            name=name,
            kind=StepKind.SUSPEND,
            input=to_json(given, f"The reason of suspension {name!r}"),
            status=StepStatus.SUSPENDED,
            retries=0,
            timeout=timeout,
            available_at=None if timeout is None else self.clock.now() + timedelta(seconds=timeout),
        )
        self.remember(step)
        return step

    def suspend_at(self, step: WorkflowStep) -> None:
        """Suspend the run at ``step``."""
        self.states.suspend_for_step(self.run, step)


def _version_of(workflow: str) -> str:
    definition = registry.get_workflow(workflow)
    return definition.version if definition is not None else ""


class StepsUnread(BaseException):
    """A pass that replayed against no steps reached one it cannot take as new
    without reading the run's steps: the pass reads them and replays again."""


class WritesRefused(BaseException):
    """A pass that may not write (:meth:`StepRecorder.write_nothing`) reached
    something it cannot take without writing."""


class _Refused:
    """What a pass that may not write has in place of what writes."""

    def __getattr__(self, name: str) -> Any:
        raise WritesRefused(name)
