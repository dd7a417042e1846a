"""Intakes: sources of new runs that a worker polls, or is woken for.

A feature that hands the engine inputs for new runs (stored webhook events, cron
schedules, tasks) registers an :class:`Intake`; the worker asks each one to start
its waiting runs through :meth:`WorkflowEngine.create_runs
<pikku_django.workflows.WorkflowEngine.create_runs>`, so only the workflow package
writes run rows.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pikku_django.workflows.store import NewRun, WorkflowStore


class RunStarter(Protocol):
    """What an intake is handed to start runs with (a WorkflowEngine)."""

    using: str
    store: WorkflowStore

    def create_runs(self, runs: Sequence[NewRun]) -> list[uuid.UUID]: ...


@runtime_checkable
class Intake(Protocol):
    """A source of new runs."""

    #: A unique name (logs, and registering again replaces).
    name: str
    #: The payload of a notification on the workers' channel that says this intake
    #: has work (PostgreSQL), or None when it is only polled.
    notify_payload: str | None

    def start_waiting(self, engine: RunStarter, limit: int) -> int:
        """Start the runs of up to ``limit`` waiting items: how many now have their run.
        A full batch (``limit``) makes the worker look again at once."""
        ...

    def has_waiting(self, engine: RunStarter) -> bool:
        """Whether any item waits for its run (a cheap look)."""
        ...


def seconds_until_due(intake: Intake, engine: RunStarter) -> float | None:
    """When ``intake`` says its next item falls due, in seconds from now (an optional
    ``seconds_until_due(engine)`` method: a worker then looks again by that time
    rather than a poll interval later), or None."""
    hint = getattr(intake, "seconds_until_due", None)
    return hint(engine) if callable(hint) else None


_lock = threading.Lock()
_intakes: dict[str, Intake] = {}


def register_intake(intake: Intake) -> None:
    """Make workers start ``intake``'s runs (again under its name: replaced)."""
    if not isinstance(intake, Intake):
        raise TypeError(f"{intake!r} is not an Intake (name, notify_payload, start_waiting...)")
    with _lock:
        _intakes[intake.name] = intake


def unregister_intake(name: str) -> None:
    """Stop starting the runs of the intake registered as ``name`` (if any)."""
    with _lock:
        _intakes.pop(name, None)


def intakes() -> tuple[Intake, ...]:
    """The registered intakes, in the order they were registered."""
    with _lock:
        return tuple(_intakes.values())


def start_waiting_runs(engine: RunStarter, limit: int = 100) -> int:
    """Start the runs that the registered intakes (stored webhook events...) hold for
    ``engine``: how many items now have their run (as a worker does on each look)."""
    return sum(intake.start_waiting(engine, limit) for intake in intakes())
