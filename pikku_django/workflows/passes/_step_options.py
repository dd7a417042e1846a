"""Step options: one ``ctx.do`` call's function, retries, queue... resolved once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pikku_django.models import StepKind, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows._values import StepOptions
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.durations import Duration, parse_duration
from pikku_django.workflows.errors import WorkflowDefinitionError


def resolve_step_options(
    config: EngineConfig,
    fn: str | Callable[..., Any],
    *,
    retries: int | None = None,
    retry_delay: Duration | None = None,
    backoff: str | None = None,
    queued: bool | None = None,
    queue: str | None = None,
    transactional: bool | None = None,
    timeout: Duration | None = None,
    run_queue: str = "",
) -> StepOptions:
    """How a step calling ``fn`` runs: the call's options, else the registered step's
    defaults, else (for its queue) its run's, else the engine's."""
    definition = registry.get_step(fn)
    callable_: Callable[..., Any] | None
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
            else config.step_retries
        )
    registry.check_retries(retries)
    if retry_delay is None:
        delay = (
            definition.retry_delay
            if definition and definition.retry_delay is not None
            else config.step_retry_delay
        )
    else:
        delay = parse_duration(retry_delay, what="retry_delay")
    if backoff is None:
        backoff = (definition.backoff if definition else None) or config.step_backoff
    registry.check_backoff(backoff)
    queue = queue or (definition.queue if definition else None) or run_queue or "default"
    if transactional is None:
        transactional = bool(definition and definition.transactional)
    if transactional and callable_ is not None:
        try:
            registry.check_not_async_transactional(callable_, f"Step function {function!r}")
        except TypeError as exc:
            raise WorkflowDefinitionError(str(exc)) from None
    attempt_timeout = (
        registry.check_timeout(timeout)
        if timeout is not None
        else definition and definition.timeout
    )
    return StepOptions(
        kind=kind,
        function=function,
        fn=callable_,
        retries=retries,
        retry_delay=delay,
        backoff=str(backoff),
        queue=str(queue)[:100],
        transactional=bool(transactional),
        timeout=attempt_timeout or None,
    )


def retry_delay_for(step: WorkflowStep | StepOptions, failed_attempt: int) -> timedelta:
    """The wait after ``failed_attempt`` of a step fails."""
    delay = step.retry_delay
    if step.backoff == "exponential":
        delay = delay * (2 ** max(0, failed_attempt - 1))
    return timedelta(seconds=min(delay, 86400 * 365))
