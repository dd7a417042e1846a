"""Starting the runs of due ticks: what a worker calls on each poll.

A tick is claimed by one guarded UPDATE that moves the schedule's next tick on
(``WHERE id = ? AND next_tick_at = <the tick seen>``), and its run is inserted in
the same transaction under the tick's idempotency key. Whichever process wins
the UPDATE starts the run; the others change no row and move on. A process
killed between the two rolls both back, so the tick stays due for the next one.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from pikku_django.conf import pikku_settings
from pikku_django.models import MissedTicks
from pikku_django.models.fields import readable
from pikku_django.schedules.cron import Cron
from pikku_django.schedules.errors import ScheduleError
from pikku_django.schedules.store import (
    cron_of,
    database,
    engine_for,
    schedules,
    sync_schedules,
    tick_key,
)

logger = logging.getLogger(__name__)

#: How many due schedules one call handles; more make the report say "due now".
BATCH = 50
#: Seconds this process leaves a schedule alone after its tick failed to start.
RETRY_AFTER = 30.0
#: Seconds before trying a tick again after a database error (a lock, a deadlock).
RETRY_CONTENDED = 1.0

_ONE_MICROSECOND = timedelta(microseconds=1)
_state_lock = threading.Lock()
_synced: set[str] = set()
_failing: dict[int, float] = {}  # schedule pk -> time.monotonic() of the next try


@dataclass(frozen=True)
class TickStart:
    """A run started for one tick of a schedule."""

    schedule: str
    tick: datetime
    run_id: uuid.UUID


@dataclass(frozen=True)
class SkippedTicks:
    """Ticks of a schedule passed over by its missed-tick policy: ``first`` to ``last``."""

    schedule: str
    first: datetime
    last: datetime
    policy: MissedTicks


@dataclass(frozen=True)
class TickFailure:
    """A due tick whose run could not be started; it stays due and is tried again."""

    schedule: str
    tick: datetime
    error: str


@dataclass(frozen=True)
class TickReport:
    """What one :func:`start_due_ticks` call did, and when the next tick is due."""

    started: tuple[TickStart, ...] = ()
    skipped: tuple[SkippedTicks, ...] = ()
    failed: tuple[TickFailure, ...] = ()
    #: The earliest tick still to start (now or in the past: call again at once);
    #: None when no schedule is enabled.
    next_due: datetime | None = None

    def seconds_until_next(self, now: datetime | None = None) -> float | None:
        """Seconds from ``now`` until :attr:`next_due` (0 if it is due), None if nothing is."""
        if self.next_due is None:
            return None
        return max(0.0, (self.next_due - (now or timezone.now())).total_seconds())


@dataclass(frozen=True)
class TickPlan:
    """Which due ticks a schedule starts, which it passes over, and its next tick after."""

    start: tuple[datetime, ...]
    skipped: tuple[datetime, datetime] | None
    next_tick: datetime


def plan_ticks(
    cron: Cron,
    policy: MissedTicks,
    due_at: datetime,
    now: datetime,
    *,
    grace: float,
    limit: int,
) -> TickPlan:
    """The plan for a schedule whose next tick ``due_at`` is at or before ``now``.

    A tick more than ``grace`` seconds before ``now`` is missed. ``latest``
    starts one run for all due ticks, the latest's (missed or not); ``all`` each
    due tick, up to the latest ``limit``; ``none`` each tick that is on time.
    """
    next_tick = cron.next_after(now)
    limit = max(1, limit)
    if policy == MissedTicks.ALL:
        start = cron.ticks_between(due_at, now, limit)
    elif policy == MissedTicks.NONE:
        start = cron.ticks_between(max(due_at, now - timedelta(seconds=grace)), now, limit)
    else:
        latest = cron.latest_at_or_before(now)
        start = [latest] if latest >= due_at else []
    first_due = cron.next_after(due_at - _ONE_MICROSECOND)
    end = start[0] if start else next_tick
    skipped = None
    if first_due < end:
        skipped = (first_due, cron.latest_at_or_before(end - _ONE_MICROSECOND))
    return TickPlan(tuple(start), skipped, next_tick)


def soonest_ticks(alias: str) -> Any:
    """(pk, name, next tick) of the enabled schedules, soonest first: read off an index."""
    return (
        schedules(alias)
        .filter(next_tick_at__isnull=False)
        .order_by("next_tick_at")
        .values_list("pk", "name", "next_tick_at")[: BATCH + 1]
    )


def start_due_ticks(
    now: datetime | None = None, *, using: str | None = None, sync: bool = True
) -> TickReport:
    """Start one run for each due tick of every enabled schedule, as its policy says.

    Safe to call from any number of processes and threads at once: each tick's
    run is started by exactly one of them. When nothing is due it costs one
    indexed query. ``now`` (default: this process's clock) decides what is due;
    ``sync`` records the declared schedules on this process's first call.
    """
    alias = database(using)
    if sync:
        _sync_once(alias)
    now = now or timezone.now()
    head = list(soonest_ticks(alias))
    started: list[TickStart] = []
    skipped: list[SkippedTicks] = []
    failed: list[TickFailure] = []
    upcoming: list[datetime] = []
    for index, (pk, name, due_at) in enumerate(head):
        if due_at > now:
            upcoming.append(due_at)
            break
        if index == BATCH:
            upcoming.append(now)  # more are due than one call handles
            break
        retry_in = _retry_in(pk)
        if retry_in > 0:
            upcoming.append(now + timedelta(seconds=retry_in))
            continue
        try:
            next_tick = _start_tick(alias, pk, due_at, now, started, skipped)
        except DatabaseError as exc:  # a lock or a deadlock: try again soon
            logger.info("Schedule %s: tick %s not started yet: %s", name, due_at, exc)
            failed.append(TickFailure(name, due_at, f"{type(exc).__name__}: {exc}"))
            upcoming.append(now + timedelta(seconds=RETRY_CONTENDED))
            connections[alias].close_if_unusable_or_obsolete()
            continue
        except Exception as exc:
            logger.exception("Schedule %s: the run of tick %s did not start", name, due_at)
            failed.append(TickFailure(name, due_at, f"{type(exc).__name__}: {exc}"))
            with _state_lock:
                _failing[pk] = time.monotonic() + RETRY_AFTER
            upcoming.append(now + timedelta(seconds=RETRY_AFTER))
            continue
        if next_tick is not None:
            upcoming.append(next_tick)
    return TickReport(tuple(started), tuple(skipped), tuple(failed), min(upcoming, default=None))


def _start_tick(
    alias: str,
    pk: int,
    due_at: datetime,
    now: datetime,
    started: list[TickStart],
    skipped: list[SkippedTicks],
) -> datetime | None:
    """Claim the schedule's due tick and start its runs; its next tick, or None if taken."""
    with transaction.atomic(using=alias):
        row = schedules(alias).filter(pk=pk, next_tick_at=due_at).first()
        if row is None:
            return None  # another process has moved it on, or it was switched off
        # A tick failure that says why (the others start all the same).
        readable(row.input, f"The input of schedule {row.name!r}")
        policy = MissedTicks(row.missed)
        plan = plan_ticks(
            cron_of(row),
            policy,
            due_at,
            now,
            grace=float(pikku_settings.SCHEDULE_GRACE),
            limit=int(pikku_settings.SCHEDULE_CATCHUP_LIMIT),
        )
        won = (
            schedules(alias)
            .filter(pk=pk, next_tick_at=due_at)
            .update(next_tick_at=plan.next_tick, updated_at=timezone.now())
        )
        if not won:
            return None
        engine = engine_for(alias)
        mine = [
            TickStart(
                row.name,
                tick,
                engine.start(row.workflow, row.input, idempotency_key=tick_key(row.name, tick)).id,
            )
            for tick in plan.start
        ]
        if mine:
            schedules(alias).filter(pk=pk).update(
                last_tick_at=mine[-1].tick, last_run_id=mine[-1].run_id, last_run_at=now
            )
    started.extend(mine)
    if plan.skipped is not None:
        first, last = plan.skipped
        skipped.append(SkippedTicks(row.name, first, last, policy))
        logger.warning(
            "Schedule %s: ticks from %s to %s were missed and not started (missed=%s)",
            row.name,
            first.isoformat(),
            last.isoformat(),
            policy.value,
        )
    for start in mine:
        logger.info("Schedule %s: tick %s started run %s", row.name, start.tick, start.run_id)
    return plan.next_tick


def _retry_in(pk: int) -> float:
    with _state_lock:
        retry_at = _failing.get(pk)
        if retry_at is None:
            return 0.0
        left = retry_at - time.monotonic()
        if left <= 0:
            del _failing[pk]
        return max(0.0, left)


def _sync_once(alias: str) -> None:
    with _state_lock:
        if alias in _synced:
            return
    try:
        sync_schedules(using=alias)
    except ScheduleError as exc:  # the system check reports it too
        logger.error("Schedules were not synced: %s", exc)
    with _state_lock:
        _synced.add(alias)


def forget_process_state() -> None:
    """Sync again on the next call and retry failing schedules at once (for tests)."""
    with _state_lock:
        _synced.clear()
        _failing.clear()
