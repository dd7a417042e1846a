"""Workflows and step functions, registered by name.

Both are declared with decorators in an installed app's ``workflows.py``, which
pikku_django imports at start-up.
"""

from __future__ import annotations

import functools
import inspect
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, overload

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.core.exceptions import ImproperlyConfigured

from pikku_django.models.fields import readable
from pikku_django.workflows.config import check_max_steps, check_retention
from pikku_django.workflows.control._concurrency import (
    KeyDefault,
    check_concurrency_limit,
    check_key_default,
)
from pikku_django.workflows.durations import Duration, parse_duration
from pikku_django.workflows.runs._version_ids import check_version, code_version

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.RLock()
_workflows: dict[str, WorkflowDefinition] = {}
_steps: dict[str, StepDefinition] = {}
#: Workflows named by a prefix and found by a function of the whole name (see
#: :func:`register_workflow_prefix`).
_prefixes: dict[str, Callable[[str], WorkflowDefinition | None]] = {}


PRIORITY_MIN = -100
"""The lowest priority a run may have (``django.tasks``'s range): claimed last."""
PRIORITY_MAX = 100
"""The highest priority a run may have (``django.tasks``'s range): claimed first."""


@dataclass(frozen=True)
class OpeningStep:
    """The queued step a run's first pass reaches whatever it replays: its name, the
    registered function it calls, its input and the ``ctx.do`` options it passes."""

    name: str
    function: str
    data: Any
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkflowDefinition:
    """A registered workflow: ``fn(ctx, input)`` replayed on each orchestration pass,
    with the run options its runs start with unless ``start_workflow`` names them."""

    name: str
    fn: Callable[..., Any]
    priority: int = 0
    #: The queue of its runs' steps that name none (None: the default queue).
    queue: str | None = None
    #: Seconds after a start that a run's first pass may be claimed (None: at once).
    delay: float | None = None
    #: A cron expression that starts a run on each tick (see pikku_django.schedules).
    schedule: str | None = None
    #: The time zone ``schedule`` is read in (None: PIKKU['SCHEDULE_TIMEZONE']).
    timezone: str | None = None
    #: The version its new runs record: declared, or a hash of its code.
    version: str = ""
    #: Older versions whose runs this code also replays (a worker limited to the
    #: versions it carries passes these too).
    replays: tuple[str, ...] = ()
    #: Its runs' concurrency key: text, or a function of the input (None: no key).
    concurrency_key: KeyDefault | None = None
    #: How many runs sharing a key may be in progress at once.
    concurrency_limit: int = 1
    #: Seconds from a start to its run's deadline (None: no deadline).
    timeout: float | None = None
    #: ``opening(run_id, input)``: the queued step every run of it reaches first (its
    #: body's first call, e.g. a task run's one step). Stored with the run, scheduled,
    #: so that a worker claims it without a first pass (None: the first pass stores it).
    opening: Callable[[uuid.UUID, Any], OpeningStep] | None = None
    #: The most steps one of its runs may record (None: ``PIKKU["MAX_STEPS_PER_RUN"]``).
    max_steps: int | None = None
    #: Seconds after which its settled runs are deleted by the retention job
    #: (``math.inf``: kept for ever; None: ``PIKKU["RETENTION"]``).
    retention: float | None = None

    @property
    def carried_versions(self) -> frozenset[str]:
        """The versions of runs this code may pass: its own and those it replays."""
        return frozenset((self.version, *self.replays))


@dataclass(frozen=True)
class StepDefinition:
    """A registered step function and its defaults."""

    name: str
    fn: Callable[..., Any]
    queue: str | None = None
    retries: int | None = None
    retry_delay: float | None = None
    backoff: str | None = None
    transactional: bool = False
    #: Seconds each attempt may run before it is failed with StepTimeoutError.
    timeout: float | None = None
    #: Its success ends its run, completed with its result (see :func:`end_runs_with`).
    ends_run: bool = False

    @property
    def is_async(self) -> bool:
        """Whether the function is an ``async def`` (a worker runs it on its event loop)."""
        return iscoroutinefunction(self.fn)

    def call(self, data: Any) -> Any:
        return call_step_function(self.fn, data)


def call_step_function(fn: Callable[..., Any], data: Any) -> Any:
    """Call ``fn(data)``, or ``fn()`` when it takes no argument; an ``async def``
    function is run to its end on this thread (see :func:`acall_step_function`).
    :class:`~pikku_django.models.fields.UnreadableValueError` for stored ``data``
    Python cannot read back: the attempt fails with the reason."""
    readable(data, "The step's input")
    if iscoroutinefunction(fn):
        return async_to_sync(acall_step_function)(fn, data)
    if _takes_no_arguments(fn):
        return fn()
    return fn(data)


async def acall_step_function(fn: Callable[..., Any], data: Any) -> Any:
    """Await ``fn(data)`` (or ``fn()``) of an ``async def`` step function."""
    readable(data, "The step's input")
    return await (fn() if _takes_no_arguments(fn) else fn(data))


def check_not_async_transactional(fn: Callable[..., Any], what: str) -> None:
    """TypeError for ``transactional=True`` on an ``async def`` step function.

    A transaction belongs to one thread's connection, and an async function's
    database calls run on other threads between its awaits: its writes could not
    commit together with its result.
    """
    if iscoroutinefunction(fn):
        raise TypeError(
            f"{what} is an async def function and cannot be transactional=True: its "
            "database calls run on other threads than the step's transaction. Make it a "
            "plain def function to run it in one transaction, or drop transactional."
        )


def _takes_no_arguments(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is called without its data (looked up once per function)."""
    try:
        return _takes_none(fn)
    except TypeError:  # a callable that cannot be a key
        return _takes_none.__wrapped__(fn)


@functools.lru_cache(maxsize=1024)
def _takes_none(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return not any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )


def _identity(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ImproperlyConfigured(f"A {what} name must be a non-empty str, got {name!r}")
    if len(name) > 200:
        raise ImproperlyConfigured(f"A {what} name is at most 200 characters: {name!r}")
    return name


def _register(table: dict[str, Any], name: str, definition: Any, what: str) -> None:
    with _lock:
        existing = table.get(name)
        if existing is not None and _identity(existing.fn) != _identity(definition.fn):
            raise ImproperlyConfigured(
                f"Two {what}s are registered as {name!r}: {_identity(existing.fn)} and "
                f"{_identity(definition.fn)}. Give one of them another name="
            )
        table[name] = definition


@overload
def workflow(fn: F, /) -> F: ...
@overload
def workflow(
    *,
    name: str | None = None,
    priority: int = 0,
    queue: str | None = None,
    delay: Duration | None = None,
    schedule: str | None = None,
    timezone: str | None = None,
    version: str | None = None,
    replays: tuple[str, ...] | list[str] = (),
    concurrency_key: KeyDefault | None = None,
    concurrency_limit: int = 1,
    timeout: Duration | None = None,
    max_steps: int | None = None,
    retention: Duration | None = None,
) -> Callable[[F], F]: ...


def workflow(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    priority: int = 0,
    queue: str | None = None,
    delay: Duration | None = None,
    schedule: str | None = None,
    timezone: str | None = None,
    version: str | None = None,
    replays: tuple[str, ...] | list[str] = (),
    concurrency_key: KeyDefault | None = None,
    concurrency_limit: int = 1,
    timeout: Duration | None = None,
    max_steps: int | None = None,
    retention: Duration | None = None,
) -> Any:
    """Register ``fn(ctx, input)`` as a workflow, under ``name`` or its function name.

    The function is replayed from the top on every orchestration pass: anything
    with side effects belongs in a step (``ctx.do``). ``priority`` (-100 to 100,
    higher first), ``queue`` (of steps that name none) and ``delay`` (before the
    first pass may be claimed) are its runs' defaults; ``start_workflow`` may
    override each. ``schedule`` (a cron expression, read in ``timezone``) starts a
    run on each tick, under the workflow's name as the schedule's name.
    ``version`` is recorded on each new run (default: a hash of the function's
    code); ``replays`` names older versions this code also replays (with
    ``ctx.patched``), for workers limited to the versions they carry.
    ``concurrency_key`` (text, or a function of the input returning it) makes runs
    sharing a key run ``concurrency_limit`` (default 1) at a time, in start order.
    ``timeout`` gives each run a deadline that long after its start (see
    ``start_workflow(timeout=...)``). ``max_steps`` is the most steps one of its
    runs may record, in place of ``PIKKU["MAX_STEPS_PER_RUN"]``. ``retention``
    (e.g. "30d", or "forever") is how long its settled runs are kept before the
    workers delete them, in place of ``PIKKU["RETENTION"]``.
    """
    check_priority(priority)
    if queue is not None:
        check_queue(queue)
    wait = None if delay is None else check_delay(delay)
    try:
        key = None if concurrency_key is None else check_key_default(concurrency_key)
        check_concurrency_limit(concurrency_limit)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"workflow {exc}") from None
    run_timeout = None if timeout is None else check_timeout(timeout)
    step_limit = None if max_steps is None else check_max_steps(max_steps, "workflow max_steps=")
    kept = None if retention is None else check_retention(retention, "workflow retention=")
    for option, value in (("schedule", schedule), ("timezone", timezone)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ImproperlyConfigured(f"workflow {option}= must be a non-empty str, not {value!r}")
    if timezone is not None and schedule is None:
        raise ImproperlyConfigured("workflow timezone= is only meaningful with schedule=")
    declared = None if version is None else check_version(version, "version")
    older = tuple(check_version(v, "replays") for v in replays)

    def register(func: F) -> F:
        if iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"Workflow {_identity(func)} is an async def function: a workflow body is "
                "replayed synchronously on every pass. Keep the body a plain def function "
                "and make its steps async def (@step async functions run on the worker's "
                "event loop)."
            )
        wf_name = _check_name(name or func.__name__, "workflow")
        definition = WorkflowDefinition(
            wf_name,
            func,
            priority,
            queue,
            wait,
            schedule,
            timezone,
            declared or code_version(func),
            older,
            key,
            concurrency_limit,
            run_timeout,
            max_steps=step_limit,
            retention=kept,
        )
        _register(_workflows, wf_name, definition, "workflow")
        func.__pikku_workflow__ = wf_name  # type: ignore[attr-defined]
        return func

    return register(fn) if fn is not None else register


@overload
def step(fn: F, /) -> F: ...
@overload
def step(
    *,
    name: str | None = None,
    queue: str | None = None,
    retries: int | None = None,
    retry_delay: Duration | None = None,
    backoff: str | None = None,
    transactional: bool = False,
    timeout: Duration | None = None,
) -> Callable[[F], F]: ...


def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str | None = None,
    retries: int | None = None,
    retry_delay: Duration | None = None,
    backoff: str | None = None,
    transactional: bool = False,
    timeout: Duration | None = None,
) -> Any:
    """Register ``fn(data)`` as a step function that workers run, by name.

    ``queue``, ``retries``, ``retry_delay``, ``backoff``, ``transactional`` and
    ``timeout`` (how long one attempt may run) are its defaults; ``ctx.do(...)``
    may override each.
    """
    if retries is not None:
        check_retries(retries)
    delay = None if retry_delay is None else parse_duration(retry_delay, what="retry_delay")
    if backoff is not None:
        check_backoff(backoff)
    attempt_timeout = None if timeout is None else check_timeout(timeout)

    def register(func: F) -> F:
        step_name = _check_name(name or func.__name__, "step")
        if transactional:
            check_not_async_transactional(func, f"Step {step_name!r}")
        definition = StepDefinition(
            step_name, func, queue, retries, delay, backoff, bool(transactional), attempt_timeout
        )
        _register(_steps, step_name, definition, "step function")
        func.__pikku_step__ = step_name  # type: ignore[attr-defined]
        return func

    return register(fn) if fn is not None else register


def end_runs_with(name: str) -> None:
    """Make the registered step function ``name`` end its run when it succeeds, the
    run completed with its result, in the transaction that records it (no pass after
    it). Only for a function that is always the last call of its workflow's body,
    whose result that body returns (the step of a ``django.tasks`` task run)."""
    with _lock:
        found = _steps.get(name)
        if found is None:
            raise ImproperlyConfigured(f"No step function is registered as {name!r}")
        _steps[name] = replace(found, ends_run=True)


def check_retries(retries: object) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int of 0 or more, not {retries!r}")
    return retries


def check_priority(priority: object) -> int:
    """``priority`` if it is an int from -100 to 100; TypeError or ValueError if not."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(
            f"priority must be an int from {PRIORITY_MIN} to {PRIORITY_MAX}, not {priority!r}"
        )
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(
            f"priority must be from {PRIORITY_MIN} to {PRIORITY_MAX} (higher is claimed "
            f"first), not {priority}"
        )
    return priority


def check_queue(queue: object) -> str:
    """``queue`` if it is a queue name (1 to 100 characters); ValueError if not."""
    if not isinstance(queue, str) or not 0 < len(queue) <= 100 or queue != queue.strip():
        raise ValueError(
            f"A queue name is a str of 1 to 100 characters without surrounding spaces, "
            f"not {queue!r}"
        )
    return queue


def check_delay(delay: object) -> float:
    """``delay`` (seconds, a timedelta or text like "5m") in seconds, 0 or more."""
    return parse_duration(delay, what="delay")


def check_timeout(timeout: object, what: str = "timeout") -> float:
    """``timeout`` (seconds, a timedelta or text like "30s") in seconds, more than 0."""
    seconds = parse_duration(timeout, what=what)
    if seconds <= 0:
        raise ValueError(f"{what} must be more than 0 seconds, not {timeout!r}")
    return seconds


def check_backoff(backoff: object) -> str:
    if backoff not in ("fixed", "exponential"):
        raise ValueError(f"backoff must be 'fixed' or 'exponential', not {backoff!r}")
    return str(backoff)


def register_workflow_prefix(prefix: str, find: Callable[[str], WorkflowDefinition | None]) -> None:
    """Names starting with ``prefix`` are workflows that ``find(name)`` gives (or None).

    For a family of runs that one body runs under many names, e.g. ``task:<path>``
    for each ``django.tasks`` task (pikku_django.tasks).
    """
    with _lock:
        _prefixes[_check_name(prefix, "workflow prefix")] = find


def get_workflow(name_or_fn: str | Callable[..., Any]) -> WorkflowDefinition | None:
    """The workflow registered under a name, or for a decorated function."""
    name = getattr(name_or_fn, "__pikku_workflow__", name_or_fn)
    if not isinstance(name, str):
        return None
    found = _workflows.get(name)
    if found is None:
        for prefix, find in list(_prefixes.items()):
            if name.startswith(prefix):
                return find(name)
    return found


def get_step(name_or_fn: str | Callable[..., Any]) -> StepDefinition | None:
    """The step function registered under a name, or for a decorated function."""
    name = getattr(name_or_fn, "__pikku_step__", name_or_fn)
    return _steps.get(name) if isinstance(name, str) else None


def workflow_names() -> list[str]:
    return sorted(_workflows)


def scheduled_workflows() -> list[WorkflowDefinition]:
    """The registered workflows declared with ``schedule=``, by name."""
    with _lock:
        return sorted((d for d in _workflows.values() if d.schedule), key=lambda d: d.name)


def retained_workflows() -> dict[str, float]:
    """The retention of each registered workflow declared with ``retention=``, by name."""
    with _lock:
        return {d.name: d.retention for d in _workflows.values() if d.retention is not None}


def step_names() -> list[str]:
    return sorted(_steps)


def unregister(name: str) -> None:
    """Forget a workflow or step function registered as ``name`` (for tests)."""
    with _lock:
        _workflows.pop(name, None)
        _steps.pop(name, None)


def autodiscover() -> None:
    """Import ``workflows`` from every installed app."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("workflows")
