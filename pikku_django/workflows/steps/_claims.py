"""Claiming steps and runs: what to claim, in which order and how many; whether a
step is claimable is its store's decision (``WorkflowStore.decide_claim``)."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import cast

from django.db.models import Q
from django.utils import timezone

from pikku_django.dbclock import EpochMs
from pikku_django.models import StepKind, StepStatus, WorkflowStep
from pikku_django.workflows._values import ClaimedStep, DueRun, RunLeaseAsk, default_worker_id
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.control._rates import grow_slots, maybe_prune, stamp_slots, take_slots
from pikku_django.workflows.errors import (
    NonDeterministicWorkflowError,
    WorkflowStepLeaseExpiredError,
)
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.runs._state import RunStates
from pikku_django.workflows.steps._timeouts import capped_lease_ms, time_out
from pikku_django.workflows.store.decisions import Verdict

logger = workflow_logger(__name__)

#: One busy look in this many claims in the claim order (lapsed claims, due retries
#: and fresh steps by priority) before it claims fresh steps.
IN_ORDER_EVERY = 16

#: Seconds past the run lease after which a run claimed for a pass falls due again,
#: should the pass never end (its worker died mid-pass).
PASS_RECOVERY_MARGIN = 5


class Claims:
    """Decides whether a step is claimed, and makes the claim."""

    def __init__(self, states: RunStates, config: Callable[[], EngineConfig]) -> None:
        self.states = states
        self.store = states.store
        self.clock = states.clock
        self._config = config
        self._looks = itertools.count(1)

    @property
    def config(self) -> EngineConfig:
        return self._config()

    def claim_step(
        self, step_id: int, *, lease_ms: int | None = None, worker: str = ""
    ) -> ClaimedStep | None:
        """Claim one queued step for execution, by the claim decision; None if not claimable."""
        step = (
            self.store.steps()
            .annotate(store_now=EpochMs())
            .filter(id=step_id)
            .select_related("run")
            .first()
        )
        if step is None or step.kind != StepKind.QUEUED:
            return None
        if lease_ms is None:
            lease_ms = self.config.lease_ms_for_queue(step.queue)
        return self.decide(step, lease_ms, worker or default_worker_id())

    def claim_named(
        self, run_id: uuid.UUID | str, step_name: str, function: str, lease_ms: int
    ) -> ClaimedStep | None:
        """Claim the step ``step_name`` of a run that should call ``function``."""
        step = (
            self.store.steps()
            .annotate(store_now=EpochMs())
            .filter(run_id=cast(uuid.UUID, run_id), name=step_name)
            .select_related("run")
            .first()
        )
        if step is None:
            return None
        if step.function != function:
            raise NonDeterministicWorkflowError(
                f"Step {step_name!r} of run {run_id} calls {step.function!r}, not {function!r}"
            )
        return self.decide(step, lease_ms, default_worker_id())

    def decide(
        self, step: WorkflowStep, lease_ms: int, worker: str, *, pausable: bool = True
    ) -> ClaimedStep | None:
        """The claim of ``step`` (read with ``store_now``), as its store decides it; None
        if not claimed. A queued step of a paused queue is not claimed, unless not
        ``pausable`` (an inline run's, which its caller drives)."""
        lease_ms = capped_lease_ms(lease_ms, step.timeout)
        claimed_at = time.monotonic()  # before the claim: the worker's deadline is never late
        now = self.clock.now()
        got = self.store.decide_claim(
            step, lease_ms=lease_ms, worker=worker, pausable=pausable, now=now
        )
        if got.verdict is Verdict.TIMED_OUT:
            time_out(self.store, step, now)  # its retry policy takes it from here
        elif got.verdict is Verdict.EXPIRED and got.won:
            logger.warning("%s", WorkflowStepLeaseExpiredError(step.name, step.attempts_allowed))
            self.states.wake(step.run_id)
        if got.verdict is not Verdict.CLAIM or not got.won:
            return None
        return _claimed(
            step,
            got.attempt + 1,
            lease_ms,
            claimed_at,
            reclaimed=got.reclaimed,
            worker=worker,
            started_at=got.started_at,
            claim_token=got.claim_token,
        )

    def claim_inline(self, step: WorkflowStep) -> ClaimedStep | None:
        """A new attempt of an inline step, whatever its lease (the run lease keeps
        other passes out)."""
        lease_ms = capped_lease_ms(self.config.run_lease_ms, step.timeout)
        claimed_at = time.monotonic()
        worker = default_worker_id()
        started = self.store.claim_attempt(
            step, Q(status=step.status, attempt=step.attempt), lease_ms=lease_ms, worker=worker
        )
        if started is None:
            return None
        reclaimed = step.status == StepStatus.RUNNING
        return _claimed(
            step,
            step.attempt + 1,
            lease_ms,
            claimed_at,
            reclaimed=reclaimed,
            worker=worker,
            started_at=started.at,
            claim_token=started.claim_token,
        )

    def due_runs(self, limit: int = 1) -> list[uuid.UUID]:
        """Runs that need a pass now; each is pushed back by the pass timeout meanwhile."""
        return [due.run.id for due in self.due_run_rows(limit)]

    def due_run_rows(self, limit: int = 1, lease: RunLeaseAsk | None = None) -> list[DueRun]:
        """:meth:`due_runs`, each run as its claim read it; with ``lease``, each run's
        lease taken by the same statement (the store must hold run leases)."""
        now = self.clock.now()
        config = self.config
        # A pass holds the run lease: once it lapsed (the worker died mid-pass) the
        # run may be passed again, whatever the pass timeout.
        timeout = min(config.run_pass_timeout, config.run_lease_ms / 1000 + PASS_RECOVERY_MARGIN)
        until = now + timedelta(seconds=timeout)
        if lease is not None:
            return self.store.claim_due_runs_leased(now, until, limit, lease)
        return self.store.claim_due_run_rows(now, until, limit)

    def due_steps(
        self,
        queues: Iterable[str] | None = None,
        limit: int = 1,
        worker: str = "",
        *,
        busy: bool = False,
    ) -> list[ClaimedStep]:
        """Claim queued steps that are ready: scheduled, due for retry, or whose claim
        lapsed. ``busy`` (the caller's last look found steps): try the one-statement
        claims of steps not attempted yet before the look for ready work."""
        now = self.clock.now()
        served = list(queues or ())
        worker = worker or default_worker_id()
        config = self.config
        limited = [
            q.name
            for q in config.queues.values()
            if config.is_limited(q.name) and (not served or q.name in served)
        ]
        # Now and then a busy look takes the claim order first, so that a backlog of
        # fresh steps does not hold back lapsed claims and due retries.
        fresh_first = busy and next(self._looks) % IN_ORDER_EVERY != 0
        if fresh_first:
            fresh = self._claim_fresh(now, served, limited, limit, worker)
            if fresh:
                return fresh
        elif busy and not self.store.retries_or_lapsed_exist(now, served):
            # No retry is due and no claim lapsed: the claim order is the fresh steps'.
            return self._claim_fresh(now, served, limited, limit, worker)
        if not self.store.ready_steps_exist(now, served):
            return []
        if not busy:
            fresh = self._claim_fresh(now, served, limited, limit, worker)
            if fresh:
                return fresh
        return self._claim_ready(now, served, limited, limit, worker)

    def _claim_ready(
        self, now: datetime, served: list[str], limited: list[str], limit: int, worker: str
    ) -> list[ClaimedStep]:
        """Ready steps claimed in the claim order, each by the claim decision, the
        limited queues' counted as they are claimed."""
        config = self.config
        locked = [q for q in limited if config.concurrency_of(q) is not None]
        claimed: list[ClaimedStep] = []
        with self.store.claims_serialised(), self.store.limited_claim(locked):
            # A limited queue's free slots: its concurrency limit less its claims whose
            # lease has not lapsed, counted while no other worker claims from it; and
            # the rate slots this claim locked (other workers' claims lock others).
            free = {q: self._concurrency_room(q) for q in limited}
            slots: dict[str, list[int]] = {}
            for q in limited:
                rate = config.rate_of(q)
                if rate is not None and free[q] > 0:
                    maybe_prune(self.store, q, rate)
                    slots[q] = take_slots(self.store, q, rate, min(free[q], limit))
                    free[q] = len(slots[q])
            full = [q for q, n in free.items() if n <= 0]
            used: list[int] = []
            for step in self.store.lock_ready_steps(now, served, limit, full):
                if free.get(step.queue, 1) <= 0:
                    continue
                got = self.decide(step, config.lease_ms_for_queue(step.queue), worker)
                if got is not None:
                    claimed.append(got)
                    if step.queue in free:
                        free[step.queue] -= 1
                    if step.queue in slots:
                        used.append(slots[step.queue].pop())
            stamp_slots(self.store, used)
        return claimed

    def _claim_fresh(
        self, now: datetime, served: list[str], limited: list[str], limit: int, worker: str
    ) -> list[ClaimedStep]:
        """Steps not attempted yet, claimed in one statement per group where the store
        has one: the queues without limits together, each limited queue alone (its
        limits counted in its statement). With several groups, the group of the
        first step in the claim order goes first."""
        if not limited:
            return self._claim_unlimited(now, served, (), limit, worker)
        groups: list[str | None] = list(limited)
        if not served or any(q not in limited for q in served):
            groups.insert(0, None)  # the queues without limits
        if len(groups) > 1:
            head = self.store.first_fresh_queue(now, served)
            if head is None:
                return []  # nothing fresh (or the store cannot tell: nor claim)
            first = head if head in limited else None
            groups.remove(first)
            groups.insert(0, first)
        claimed: list[ClaimedStep] = []
        for group in groups:
            wanted = limit - len(claimed)
            if wanted <= 0:
                break
            if group is None:
                claimed += self._claim_unlimited(now, served, limited, wanted, worker)
            else:
                claimed += self._claim_limited(now, group, wanted, worker)
        return claimed

    def _claim_unlimited(
        self, now: datetime, served: list[str], limited: Sequence[str], limit: int, worker: str
    ) -> list[ClaimedStep]:
        """Steps not attempted yet of the queues served but the ``limited`` ones, in
        one statement where the store has one (their claim decision is that they are
        due)."""
        config = self.config
        names = set(config.queues) | set(config.queue_lease_ms)
        claimed_at = time.monotonic()  # before the claim: the worker's deadline is never late
        started = timezone.now()
        rows = self.store.claim_fresh_steps(
            now,
            served,
            limit,
            worker=worker,
            leases={name: config.lease_ms_for_queue(name) for name in names},
            default_lease_ms=config.step_lease_ms,
            exclude=limited,
            started_at=started,
        )
        return [
            _claimed(
                step,
                step.attempt,
                lease,
                claimed_at,
                reclaimed=False,
                worker=worker,
                started_at=started,
            )
            for step, lease in rows
        ]

    def _claim_limited(
        self, now: datetime, queue: str, limit: int, worker: str
    ) -> list[ClaimedStep]:
        """The limited ``queue``'s fresh steps; where its rate's slots ran short, the
        slots it has not made yet are made and the claim tried once more."""
        config = self.config
        rate = config.rate_of(queue)
        if rate is not None:
            maybe_prune(self.store, queue, rate)
        claimed: list[ClaimedStep] = []
        for _ in range(2):
            claimed_at = time.monotonic()
            got = self.store.claim_fresh_limited(
                now,
                queue,
                limit - len(claimed),
                worker=worker,
                lease_ms=config.lease_ms_for_queue(queue),
                concurrency=config.concurrency_of(queue),
                rate=rate,
            )
            if got is None:
                break
            # Their attempts start on the store's clock: when is not known here.
            claimed += [
                _claimed(step, step.attempt, lease, claimed_at, reclaimed=False, worker=worker)
                for step, lease in got.steps
            ]
            if not (rate is not None and got.slots_short and grow_slots(self.store, queue, rate)):
                break
        return claimed

    def _concurrency_room(self, queue: str) -> int:
        """How many more of ``queue``'s steps its concurrency limit lets be claimed now
        (a large number without one: the rate's slots decide)."""
        concurrency = self.config.concurrency_of(queue)
        if concurrency is None:
            return 1 << 30
        return concurrency - self.store.live_claims(queue)


def _claimed(
    step: WorkflowStep,
    attempt: int,
    lease_ms: int,
    claimed_at: float,
    *,
    reclaimed: bool,
    worker: str,
    started_at: datetime | None = None,
    claim_token: int | None = None,
) -> ClaimedStep:
    """The claim of ``attempt`` of ``step`` by ``worker``, with ``claim_token`` (the
    step's own, as its claim's statement returned it, when None)."""
    return ClaimedStep(
        step_id=step.id,
        run_id=step.run_id,
        name=step.name,
        function=step.function,
        input=step.input,
        attempt=attempt,
        transactional=step.transactional,
        lease_ms=lease_ms,
        queue=step.queue,
        reclaimed=reclaimed,
        claimed_at=claimed_at,
        timeout=step.timeout,
        worker=worker,
        started_at=started_at,
        claim_token=step.claim_token if claim_token is None else claim_token,
    )
