"""Events sent to runs, and the ``ctx.wait_for_event`` steps that take them.

Sending stores the event (unique per run and event id) and, when a wait for its
name is pending, settles that wait with it and wakes the run, in one transaction.
A wait that starts later takes the oldest event of its name that no wait took.
Both hold the run's row lock, so neither misses the other.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError

from pikku_django.models import (
    TERMINAL_RUN_STATUSES,
    StepKind,
    StepStatus,
    WorkflowEvent,
    WorkflowRun,
    WorkflowStep,
)
from pikku_django.models.fields import readable
from pikku_django.workflows._values import Pause, to_json
from pikku_django.workflows.durations import Duration, parse_duration
from pikku_django.workflows.errors import WorkflowDefinitionError, WorkflowRunNotFoundError
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.passes._inline_steps import fresh
from pikku_django.workflows.store.step_writes import StepRow

if TYPE_CHECKING:
    from pikku_django.workflows.passes._context_api import StepCalls
    from pikku_django.workflows.runs._state import RunStates

logger = workflow_logger(__name__)

#: The prefix of a wait step's name: ``event:<event name>``.
WAIT_PREFIX = "event:"


class EventTimeout(enum.Enum):
    """What ``ctx.wait_for_event`` returns when its timeout passed first."""

    TIMED_OUT = "timed_out"

    def __bool__(self) -> bool:
        return False


TIMED_OUT = EventTimeout.TIMED_OUT
"""``ctx.wait_for_event(...) is TIMED_OUT`` when no event came in time."""


class EventOutcome(enum.StrEnum):
    """What became of a sent event."""

    #: A pending wait took it; the run is woken.
    DELIVERED = "delivered"
    #: Stored for the run's next wait of that name.
    KEPT = "kept"
    #: The run already has an event with this id: nothing changed.
    DUPLICATE = "duplicate"
    #: The run had ended: nothing was stored.
    RUN_ENDED = "run_ended"


@dataclass(frozen=True)
class SentEvent:
    """The outcome of :func:`~pikku_django.workflows.send_event`."""

    run_id: uuid.UUID
    name: str
    event_id: str
    outcome: EventOutcome
    #: Whether this send started the run (send-with-start only).
    started: bool = False


@dataclass(frozen=True)
class RunKey:
    """A run addressed by its workflow and idempotency key."""

    workflow: str
    idempotency_key: str


def check_event_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > 200 or "#" in name or "\x00" in name:
        raise WorkflowDefinitionError(
            f"An event name is a non-empty str of at most 200 characters without '#' or NUL, "
            f"not {name!r}"
        )
    return name


def check_event_id(event_id: object) -> str:
    if event_id is None:
        return uuid.uuid4().hex
    if not isinstance(event_id, str) or not 0 < len(event_id) <= 255 or "\x00" in event_id:
        raise ValueError(
            f"event_id must be a str of 1 to 255 characters without NUL, not {event_id!r}"
        )
    return event_id


def _delivered(event: WorkflowEvent) -> dict[str, Any]:
    """What a wait records of ``event`` (``UnreadableValueError``, failing the run with
    the reason, for data Python cannot read back)."""
    data = readable(event.data, f"The data of event {event.name!r} {event.event_id!r}")
    return {"event_id": event.event_id, "data": data}


class EventWaits:
    """Sends events and settles the waits for them, on one engine's store."""

    def __init__(self, states: RunStates) -> None:
        self.states = states
        self.store = states.store
        self.clock = states.clock

    def events(self) -> Any:
        return WorkflowEvent.objects.using(self.store.using)

    # -- sending --------------------------------------------------------------------

    def send(self, run_id: uuid.UUID | str, name: str, data: Any, event_id: str) -> SentEvent:
        """Store an event for the run and hand it to a pending wait of its name."""
        payload = to_json(data, f"The data of event {name!r}")
        with self.store.atomic():
            try:
                found = self.store.lock_run(run_id)
            except (ValidationError, ValueError, TypeError) as exc:
                found = False
                cause: Exception | None = exc
            else:
                cause = None
            if not found:
                raise WorkflowRunNotFoundError(f"No workflow run has id {run_id!r}") from cause
            run = self.store.runs().only("id", "status", "workflow").get(id=run_id)
            if run.status in TERMINAL_RUN_STATUSES:
                logger.info("Event %r for run %s dropped: the run is %s", name, run.id, run.status)
                return SentEvent(run.id, name, event_id, EventOutcome.RUN_ENDED)
            event = self.store.add_event(run.id, name, event_id, payload)
            if event is None:
                return SentEvent(run.id, name, event_id, EventOutcome.DUPLICATE)
            wait = (
                self.store.steps()
                .filter(run_id=run.id, kind=StepKind.EVENT, function=name)
                .filter(status=StepStatus.SCHEDULED)
                .order_by("id")
                .first()
            )
            if wait is None:
                return SentEvent(run.id, name, event_id, EventOutcome.KEPT)
            self._settle(wait, event)
            self.states.wake(run.id)
        return SentEvent(run.id, name, event_id, EventOutcome.DELIVERED)

    def _settle(self, wait: WorkflowStep, event: WorkflowEvent) -> None:
        self.store.take_event(event.id, wait.id)
        self.states.finish_marker(wait, StepStatus.SUCCEEDED, result=_delivered(event))
        wait.status, wait.result = StepStatus.SUCCEEDED, _delivered(event)

    # -- waiting ----------------------------------------------------------------------

    def start_wait(
        self, run: WorkflowRun, step_name: str, name: str, seconds: float | None
    ) -> WorkflowStep:
        """Store the wait step, settled at once by an event kept for it."""
        due = None if seconds is None else self.clock.now() + timedelta(seconds=seconds)
        with self.store.atomic():
            self.store.lock_run(run.id)
            wait = StepRow(
                run.id,
                step_name,
                StepKind.EVENT,
                StepStatus.SCHEDULED,
                function=name,
                input={"event": name, "timeout": seconds},
                retries=0,
                priority=run.priority,
                available_at=due,
            )
            recorded = self.store.record_step(wait)
            step = recorded.step
            if not recorded.new:  # stored by another pass of the run
                return step
            kept = (
                self.events()
                .filter(run_id=run.id, name=name, step__isnull=True)
                .order_by("id")
                .first()
            )
            if kept is not None:
                self._settle(step, kept)
        return step

    def time_out(self, wait: WorkflowStep) -> WorkflowStep:
        """Settle a wait whose timeout passed, unless an event settled it first."""
        with self.store.atomic():
            self.store.lock_run(wait.run_id)
            current = self.store.steps().get(id=wait.id)
            if current.status == StepStatus.SCHEDULED:
                self.states.finish_marker(current, StepStatus.SUCCEEDED, result={"timed_out": True})
                current.status, current.result = StepStatus.SUCCEEDED, {"timed_out": True}
        return current


def outcome(step: WorkflowStep) -> Any:
    """What a settled wait returns: the event's data, or TIMED_OUT."""
    stored = readable(step.result, f"The result of step {step.name!r}")
    result = stored if isinstance(stored, dict) else {}
    if result.get("timed_out"):
        return TIMED_OUT
    return fresh(result.get("data"))


def wait_for_event(ctx: StepCalls, name: str, timeout: Duration | None) -> Any:
    """``ctx.wait_for_event``: the event's data once one is sent, or TIMED_OUT."""
    check_event_name(name)
    seconds = None if timeout is None else parse_duration(timeout, what="event timeout")
    step_name = ctx._step_name(WAIT_PREFIX + name, internal=True)
    recorder = ctx._recorder
    step = ctx._existing(step_name, StepKind.EVENT, name)
    waits = EventWaits(recorder.states)
    if step is None:
        step = waits.start_wait(recorder.run, step_name, name, seconds)
        recorder.remember(step)
    if step.status == StepStatus.SUCCEEDED:
        return outcome(step)
    due = step.available_at
    if due is not None and recorder.now() >= due:
        step = waits.time_out(step)
        recorder.remember(step)
        return outcome(step)
    raise Pause(due)


def run_for_key(store: Any, key: RunKey) -> uuid.UUID:
    """The id of the run of ``key``; WorkflowRunNotFoundError when none holds it."""
    found = (
        store.runs()
        .filter(workflow=key.workflow, idempotency_key=key.idempotency_key)
        .values_list("id", flat=True)
        .first()
    )
    if found is None:
        raise WorkflowRunNotFoundError(
            f"No run of workflow {key.workflow!r} has idempotency key {key.idempotency_key!r}"
        )
    return uuid.UUID(str(found))
