"""The values the engine's parts hand each other: options, claims, outcomes."""

from __future__ import annotations

import enum
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pikku_django.leases.base import Lease
from pikku_django.models import StepKind, WorkflowRun, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows.errors import NotSerializableError


def to_json(value: Any, what: str) -> Any:
    """``value`` as it will read back from the database; NotSerializableError if it is
    not JSON, or holds a NUL character or a lone surrogate (which PostgreSQL, and for
    surrogates MariaDB, cannot store in JSON), on every database alike."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise NotSerializableError(
            f"{what} is not JSON-serialisable ({exc}); return plain dicts, lists, str, "
            f"int, float, bool or None"
        ) from exc
    if "\\u0000" in text and _holds(value, "\x00"):
        raise NotSerializableError(
            f"{what} holds a NUL character (\\x00), which not every database stores; "
            "remove it or encode the value (e.g. base64)"
        )
    # json.dumps writes a surrogate as \udXXX (and a character past U+FFFF as a pair).
    if "\\ud" in text and _holds(value, SURROGATES):
        raise NotSerializableError(
            f"{what} holds a surrogate (\\ud800-\\udfff, e.g. from bytes decoded with "
            "'surrogateescape'), which not every database stores; decode it properly or "
            "encode the value (e.g. base64)"
        )
    return json.loads(text)


#: The UTF-16 surrogates: a str holding one is not text any database stores.
SURROGATES = re.compile("[\ud800-\udfff]")


def _holds(value: Any, bad: str | re.Pattern[str]) -> bool:
    """Whether a str in ``value`` (keys too) holds ``bad``."""
    if isinstance(value, str):
        return bad in value if isinstance(bad, str) else bad.search(value) is not None
    if isinstance(value, dict):
        return any(_holds(k, bad) or _holds(v, bad) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds(v, bad) for v in value)
    return False


def default_worker_id() -> str:
    """This thread's name in attempt rows: host, process and thread."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class StepOutcome(enum.StrEnum):
    """How executing a claimed step ended."""

    SUCCEEDED = "succeeded"
    #: Failed with attempts left: a retry is scheduled.
    RETRYING = "retrying"
    #: Failed with no attempt left.
    FAILED = "failed"
    #: A newer attempt replaced this one: nothing was recorded.
    SUPERSEDED = "superseded"
    #: Its function is not registered here: the run is suspended (RPC_NOT_FOUND).
    SUSPENDED = "suspended"
    #: Its run was cancelled (or otherwise ended) while a transactional step ran: the
    #: step's writes were rolled back.
    RUN_STOPPED = "run_stopped"


class Wake(enum.Enum):
    """What settling a step does to its run."""

    #: Wake it for any worker now, and announce it.
    NOW = "now"
    #: The thread that settled the step passes the run next; should it die first,
    #: the run falls due for any worker once the run lease (and a margin) has passed.
    PASS = "pass"  # noqa: S105 (not a password)
    #: Leave the run as it is (a retry is due later, or the pass is running).
    NONE = "none"
    #: End the run, completed with the step's result (a step whose function ends its
    #: run, see ``registry.end_runs_with``); where a parent step waits on the run, wake
    #: it as :attr:`NOW` instead, for a pass to end it.
    END = "end"

    @classmethod
    def of(cls, wake: bool | str | Wake) -> Wake:
        """``wake`` as given by callers: True (now), "pass" (this thread), False (no)."""
        if isinstance(wake, Wake):
            return wake
        if wake is True:
            return cls.NOW
        return cls.PASS if wake == "pass" else cls.NONE


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
    #: Seconds one attempt may run (None: no limit).
    timeout: float | None = None


@dataclass(frozen=True)
class NewStep:
    """The columns of a step row written with its first attempt."""

    run_id: uuid.UUID
    name: str
    kind: str
    function: str
    input: Any
    retries: int
    retry_delay: float
    backoff: str
    queue: str
    transactional: bool
    #: Its run's priority (claimed highest first).
    priority: int = 0
    #: Seconds one attempt may run (None: no limit).
    timeout: float | None = None

    @classmethod
    def of(
        cls, run: WorkflowRun, name: str, kind: str, options: StepOptions, payload: Any
    ) -> NewStep:
        return cls(
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
            priority=run.priority,
            timeout=options.timeout,
        )

    def columns(self) -> dict[str, Any]:
        """The step's columns as model field values."""
        return {
            "run_id": self.run_id,
            "name": self.name,
            "kind": self.kind,
            "function": self.function,
            "input": self.input,
            "retries": self.retries,
            "retry_delay": self.retry_delay,
            "backoff": self.backoff,
            "queue": self.queue,
            "transactional": self.transactional,
            "priority": self.priority,
            "timeout": self.timeout,
        }


@dataclass(frozen=True)
class Settled:
    """A settled attempt: its run as the settle found it, and the result as stored."""

    run_id: uuid.UUID
    run_status: str
    run_wakes: int
    result: Any
    #: Whether this settle ended the run (:attr:`Wake.END`).
    ended: bool = False
    #: The run's workflow and when it was created (for the signal of its end).
    workflow: str = field(default="", compare=False)
    run_created_at: datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class StepDone:
    """A step attempt's success, written together with what the pass after it does
    (see :class:`~pikku_django.workflows.store.base.ChainedWrites`)."""

    step_id: int
    attempt: int
    #: The result as the store will hold it (:meth:`ChainedWrites.json_as_stored`).
    result: Any
    #: When the attempt ended: its function returned, before the pass after it.
    finished_at: datetime | None = None
    #: The claim's token (see :attr:`ClaimedStep.claim_token`; None: the attempt's
    #: fence alone).
    claim_token: int | None = None


@dataclass(frozen=True)
class Chained:
    """What a write of a step's success with the pass after it did, once the success
    was recorded (a superseded attempt records nothing, and is not described)."""

    #: The result as stored.
    result: Any
    #: The run as the write's snapshot saw it.
    run_status: str
    run_wakes: int
    #: Whether the pass ran on the result as stored (else its own writes were skipped,
    #: and the run is due for another pass).
    same: bool = True
    #: The next step, stored claimed: its id, input as stored and claim token (None:
    #: not stored).
    claimed: tuple[int, Any, int] | None = None
    #: Whether the run ended (None: a plain parent step waits on it, so its end is
    #: left to the caller, in a transaction).
    finished: bool | None = False
    #: Whether the run's lease was released with the write (None: not asked to).
    released: bool | None = None


@dataclass(frozen=True)
class NextDue:
    """When the earliest queued work falls due: a step lease lapses (``lapse_in_ms``
    from the store's clock), a retry or sleep is due, or a run wakes."""

    lapse_in_ms: int | None
    step_due: datetime | None
    run_due: datetime | None


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
class DueRun:
    """A run claimed for a pass, as the claim read it (before the run lease, as any
    pass reads its run)."""

    run: WorkflowRun
    #: Whether the run had no steps when it was claimed. Its pass then replays against
    #: none, as long as what it reaches is a queued step it claims (whose insert
    #: stores nothing if the step exists after all); anything else reads the steps.
    stepless: bool = False
    #: The run's lease, where the claim took it too (see :class:`RunLeaseAsk`), and
    #: when it was asked for (this process's monotonic clock).
    lease: Lease | None = None
    asked_at: float = 0.0
    #: The claim asked for the run's lease and another holder had it.
    lease_refused: bool = False
    #: The run's first step, stored claimed by the claim (see :class:`FirstStepAsk`).
    first_step: FirstStepClaimed | None = None


@dataclass(frozen=True)
class FirstStepClaimed:
    """A run's first step as a due-run claim stored it, claimed: its id, its columns
    as ``WorkflowRun.first_step`` held them, its lease in ms and its claim token."""

    step_id: int
    columns: dict[str, Any]
    lease_ms: int
    claim_token: int = 0


@dataclass(frozen=True)
class FirstStepAsk:
    """What a due-run claim needs to store each claimed run's first step (found when
    the run started) claimed by ``worker``: the queues it serves (all when empty),
    those whose claims are counted elsewhere (never claimed here), the workflows this
    code passes, and each queue's step lease with the default."""

    worker: str
    queues: tuple[str, ...]
    left_out: tuple[str, ...]
    workflows: tuple[str, ...]
    lease_queues: tuple[str, ...]
    lease_ms: tuple[int, ...]
    default_lease_ms: int


@dataclass(frozen=True)
class RunLeaseAsk:
    """The run leases a due-run claim takes with its runs, where the store holds
    them too: each run's key is ``prefix`` and its id; held by ``holder``."""

    prefix: str
    holder: str
    ttl_ms: int
    #: Where the claim may also store each run's first step claimed (PostgreSQL).
    first: FirstStepAsk | None = None


@dataclass(frozen=True)
class ClaimedStep:
    """A step this worker has claimed: its writes must carry ``attempt`` and
    ``claim_token``."""

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
    #: Seconds the attempt may run, from ``claimed_at`` (None: no limit).
    timeout: float | None = None
    #: The worker the attempt is recorded under, and when it started as recorded
    #: (None where the claim was stamped by the database's clock, not this process).
    worker: str = field(default="", compare=False)
    started_at: datetime | None = field(default=None, compare=False)
    #: The claim's fencing number: every claim of the step sets a higher one (on
    #: PostgreSQL, every one after a failover higher than any before it), and a write
    #: of the attempt is refused once the step was claimed again.
    claim_token: int = 0


@dataclass(frozen=True)
class StepClaimer:
    """A worker thread that runs the queued step a pass reaches, when it may."""

    worker: str
    #: The queues the worker serves (all when empty).
    queues: tuple[str, ...] = ()
    #: Whether it drives inline runs in their caller's process (no worker passes those).
    inline: bool = False

    def takes(self, options: StepOptions) -> bool:
        return (
            options.kind == StepKind.QUEUED
            and (not self.queues or options.queue in self.queues)
            and registry.get_step(options.function) is not None
        )


class Pause(BaseException):
    """Ends an orchestration pass at a step that is not settled.

    A BaseException, so a workflow's own ``except Exception`` cannot swallow it.
    ``wake_at`` is when the run needs its next pass (None: when something wakes it).
    """

    def __init__(self, wake_at: datetime | None = None) -> None:
        super().__init__(wake_at)
        self.wake_at = wake_at
