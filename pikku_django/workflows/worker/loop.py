"""The worker behind ``manage.py pikku_worker``: orchestration passes and steps, in threads."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from pikku_django._version import __version__
from pikku_django.conf import pikku_settings
from pikku_django.leases import HeldLease, LeaseTakenError, hold_lease
from pikku_django.wakeups import ChannelListener, work_listener, worker_poll_interval
from pikku_django.workflows._values import StepOutcome
from pikku_django.workflows.engine import ClaimedStep, StepClaimer, WorkflowEngine
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.worker._batches import Batches, Unit
from pikku_django.workflows.worker._carrying import CHAIN_SECONDS, RunCarrier
from pikku_django.workflows.worker._connections import release_connections
from pikku_django.workflows.worker._due_work_order import LookOrder
from pikku_django.workflows.worker._event_loop import AsyncSteps
from pikku_django.workflows.worker._heartbeat import WorkerHeartbeats
from pikku_django.workflows.worker._idle import IdleThreads, PollCadence
from pikku_django.workflows.worker._intake_looks import IntakeLooks
from pikku_django.workflows.worker._sweeps import pending_summary, wake_stalled_runs
from pikku_django.workflows.worker._tally import WorkerTally
from pikku_django.workflows.worker.intake import intakes

logger = workflow_logger(__name__)

__all__ = ["Worker", "wake_stalled_runs"]


class Worker:
    """Runs orchestration passes and queued steps on ``concurrency`` threads.

    ``queues`` limits which step queues it serves (all when empty). With
    ``until_idle`` it returns once no work is in flight and none is due within
    ``idle_grace`` seconds.
    """

    def __init__(
        self,
        engine: WorkflowEngine,
        *,
        concurrency: int = 4,
        queues: Sequence[str] = (),
        poll_interval: float = 1.0,
        until_idle: bool = False,
        idle_grace: float = 10.0,
        shutdown_timeout: float = 30.0,
        notify: bool = True,
        notified_poll_interval: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be greater than 0, not {poll_interval}")
        if notify:  # announced work that cannot be heard is looked for often
            poll_interval = worker_poll_interval(engine.using, poll_interval)
        self.engine = engine
        self.concurrency = concurrency
        self.queues = list(queues)
        self.poll_interval = poll_interval
        self.until_idle = until_idle
        self.idle_grace = idle_grace
        self.recovery_interval = float(pikku_settings.RECOVERY_INTERVAL)
        self.stalled_after = float(pikku_settings.STALLED_RUN_AFTER)
        self.shutdown_timeout = shutdown_timeout
        self.notify = notify
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.heartbeats = WorkerHeartbeats(
            self.name, queues=self.queues, concurrency=concurrency, using=engine.using
        )
        self.stopping = threading.Event()
        self._waits = IdleThreads()
        #: Per thread: whether it looks for due runs or ready steps first.
        self._look = LookOrder(CHAIN_SECONDS)
        self._idle: set[int] = set()
        #: Its threads' slots, and the units claimed for free threads not started yet.
        self._batches = Batches(concurrency, int(pikku_settings.WORKER_CLAIM_BATCH))
        self._lock = threading.Lock()
        #: The steps it holds, and what it has done.
        self.tally = WorkerTally()
        self.progress_interval = float(pikku_settings.WORKER_PROGRESS_INTERVAL)
        self._listener: ChannelListener | None = None
        config = engine.config
        if notified_poll_interval is None:
            notified_poll_interval = float(pikku_settings.WORKER_NOTIFIED_POLL_INTERVAL)
        self.cadence = PollCadence(
            poll_interval,
            notified_poll_interval,
            listening=lambda: self._listener is not None and self._listener.listening.is_set(),
            limited=any(config.is_limited(name) for name in config.queues),
        )
        # Intakes' items wait for their runs: looked for at start, when notified, and
        # once an intake interval.
        self.intakes = IntakeLooks(engine, self.cadence)
        if notify:
            self._listener = work_listener(
                engine.using,
                (i.notify_payload or "" for i in intakes()),
                self.intakes.waiting.set,
                self._notified,
                poll_interval,
            )
        #: The event loop of ``async def`` steps, started when the first one is claimed.
        self.async_steps = AsyncSteps(
            engine,
            limit=int(pikku_settings.ASYNC_CONCURRENCY),
            on_start=self.tally.began,
            on_done=self._async_done,
        )
        self._carrier = RunCarrier(engine, self.tally, self.async_steps, self.stopping)

    @property
    def passes(self) -> int:
        """Orchestration passes made so far."""
        return self.tally.passes

    @property
    def steps(self) -> int:
        """Claimed steps ended so far."""
        return self.tally.steps

    @property
    def errors(self) -> int:
        """Errors that ended a thread's unit of work so far."""
        return self.tally.errors

    @property
    def counts(self) -> dict[str, int]:
        """Claimed steps, and how each claimed step ended."""
        return self.tally.counts

    # -- lifecycle -------------------------------------------------------------------

    def run(self) -> None:
        """Work until stopped (or, with until_idle, until nothing is left)."""
        with self._single_sqlite_worker():
            threads = [
                threading.Thread(target=self._loop, args=(i,), name=f"pikku-worker-{i}")
                for i in range(self.concurrency)
            ]
            listener = None
            if self._listener is not None:
                listener = threading.Thread(
                    target=self._listener.run,
                    args=(self.stopping,),
                    name="pikku-worker-listen",
                    daemon=True,
                )
                listener.start()
            logger.info("%s", self.describe(notified=listener is not None))
            self.heartbeats.beat(0)
            for t in threads:
                t.start()
            last_report = last_sweep = time.monotonic()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.2)
                if time.monotonic() - last_report >= self.progress_interval:
                    last_report = time.monotonic()
                    self._report()
                if time.monotonic() - last_sweep >= self.recovery_interval:
                    last_sweep = time.monotonic()
                    self.recover()
                if self.heartbeats.due():
                    self.heartbeats.beat(self.in_flight())
            self.stopping.set()
            self.async_steps.close(self.shutdown_timeout)
            if listener is not None:
                listener.join(timeout=10)
            self._report()
            self.heartbeats.beat(0, stopping=True)
            logger.info("pikku_worker %s stopped", self.name)

    def describe(self, *, notified: bool) -> str:
        """The start-up line: version, database, queues, concurrency and leases."""
        config, store = self.engine.config, self.engine.store
        return (
            f"pikku_worker {__version__} {self.name} started: database {self.engine.using!r} "
            f"({store.vendor}, {self._listening_through() if notified else ''}polling every "
            f"{self.poll_interval:g}s{self._notified_polling(notified)}), "
            f"queues {', '.join(self.queues) or 'all'}, "
            f"concurrency {self.concurrency}, leases {type(self.engine.leases).__name__} "
            f"(run {config.run_lease_ms} ms, step {config.step_lease_ms} ms)"
        )

    def _listening_through(self) -> str:
        through = self._listener.using if self._listener is not None else self.engine.using
        return "notified, " if through == self.engine.using else f"notified over {through!r}, "

    def _notified_polling(self, notified: bool) -> str:
        cadence = self.cadence
        if not notified or cadence.limited or cadence.notified_interval == self.poll_interval:
            return ""
        return f", every {cadence.notified_interval:g}s while listening"

    def stop(self) -> None:
        """Stop claiming; threads finish what they hold, then return."""
        if not self.stopping.is_set():
            logger.info("pikku_worker %s stopping: finishing work in flight", self.name)
        self.stopping.set()
        self._wake_all()

    def in_flight(self) -> int:
        """How many steps this worker holds right now."""
        return len(self.tally.in_flight())

    def hand_back(self) -> int:
        """Give up the steps in flight (their leases lapse now, fenced by their claim)."""
        handed = 0
        for claimed in self.tally.in_flight():
            try:
                if self.engine.refresh_step_lease(
                    claimed.step_id, -1, claimed.attempt, claimed.claim_token
                ):
                    handed += 1
                    logger.warning(
                        "Handed back step %s attempt %d: another worker will retry it",
                        claimed.name,
                        claimed.attempt,
                    )
            except Exception:
                logger.exception("Could not hand back step %s", claimed.name)
        return handed

    def recover(self) -> int:
        """One recovery sweep, by whichever worker of the fleet holds the sweep lease.

        Lapsed step claims need no sweep: workers claim them like ready steps.
        """
        try:
            lease = self.engine.leases.acquire(
                f"pikku-recovery:{self.engine.using}",
                self.name,
                max(1, int(self.recovery_interval * 1000)),
            )
            if lease is None:
                return 0
            woken = wake_stalled_runs(self.engine, self.stalled_after)
            self.tally.count("recovered", woken)
            return woken
        except Exception:
            logger.exception(
                "The recovery sweep failed; it runs again in %gs", self.recovery_interval
            )
            return 0
        finally:
            connections.close_all()

    def _report(self) -> None:
        logger.info("pikku_worker %s progress: %s", self.name, self.tally.progress())

    @contextmanager
    def _single_sqlite_worker(self) -> Iterator[HeldLease | None]:
        if not self.engine.store.one_worker_process:
            yield None
            return
        key = f"pikku-worker:sqlite:{connections[self.engine.using].settings_dict['NAME']}"[:255]
        try:
            with hold_lease(key, ttl_ms=30_000, service=self.engine.leases) as held:
                yield held
        except LeaseTakenError:
            from django.core.management.base import CommandError

            raise CommandError(
                "Another pikku_worker is already running on this SQLite database. SQLite "
                "allows one worker process: stop the other one, or use --concurrency for "
                "more threads in one process (or move to PostgreSQL or MariaDB)."
            ) from None

    # -- the work loop -------------------------------------------------------------------

    def _wake_all(self) -> None:
        self._waits.wake_all()

    def _loop(self, index: int) -> None:
        try:
            # Once stopping, a unit claimed for a free thread is still run (briefly:
            # a step without the pass after it, a pass that claims no step).
            while not self.stopping.is_set() or self._batches.waiting():
                with self._lock:
                    self._idle.discard(index)  # busy until this iteration finds nothing
                looked_at = self.engine.clock.now()
                try:
                    # Due work first: an intake's look once a poll interval must not
                    # delay the run a notification woke this thread for.
                    done = self._one_unit()
                    if not self.stopping.is_set():
                        done += self._start_waiting_runs()
                except Exception:
                    self.tally.failed_unit()
                    logger.exception("pikku_worker thread %d hit an error; continuing", index)
                    done = 0
                    self.stopping.wait(min(self.poll_interval, 1.0))
                finally:
                    release_connections()
                if self.stopping.is_set():
                    continue
                if done:
                    # There may be more: another thread looks too (and draws in the next).
                    self.cadence.busy()
                    self._waits.wake_one()
                    continue
                if self.until_idle and self._all_idle(index):
                    self.stop()
                    return
                wait = self.cadence.interval()
                if self._waits.polls(index):
                    try:
                        wait = min(wait, self._seconds_until_next_due(looked_at))
                    except Exception:
                        logger.debug("Could not look up the next due time", exc_info=True)
                self._waits.wait(index, max(wait, 0.005), self.stopping, self._batches.waiting)
        finally:
            connections.close_all()

    def _start_waiting_runs(self) -> int:
        """Start the intakes' waiting runs, if a look at them is due."""
        return self.intakes.start_waiting()

    def _one_unit(self) -> int:
        """Run a unit handed to this thread, or claim a batch of due work (as many
        units as there are free threads), hand the others to free threads and run
        one: how many passes and steps this thread did."""
        claimer = StepClaimer(f"{self.name}:{threading.get_ident()}", tuple(self.queues))
        batches = self._batches
        unit = batches.take()
        if unit is None:
            if self.stopping.is_set():
                return 0
            wanted = batches.reserve()
            if not wanted:
                return 0  # units handed to threads hold the free slots
            try:
                units = self._claim(claimer, wanted)
            except BaseException:
                batches.claimed(wanted, [])
                raise
            unit = batches.claimed(wanted, units)
            if unit is None:
                return 0
            if len(units) > 1:
                self._waits.wake(len(units) - 1)
        try:
            # A due run whose first step its claim stored claimed starts at that step.
            return self._carrier.carry(unit.run_id, claimer, unit.claimed, unit.due)
        finally:
            batches.done()

    def _claim(self, claimer: StepClaimer, wanted: int) -> list[Unit]:
        """Claim up to ``wanted`` units of due work, due runs and ready steps in this
        thread's look order, each kind in one claim."""
        return self._look.claim(
            lambda n: self._due_runs(claimer, n),
            lambda n, busy: self._ready_steps(claimer, n, busy),
            wanted,
            self.stopping,
        )

    def _due_runs(self, claimer: StepClaimer, limit: int = 1) -> list[Unit]:
        """Claim up to ``limit`` due runs (each with its run lease where the store
        takes it, and its first step stored claimed by ``claimer`` where it can be)."""
        engine = self.engine
        due_runs = engine.claim_due_run_rows(limit, lease_holder=str(uuid.uuid4()), claimer=claimer)
        return [Unit(due.run.id, engine.first_step_claimed(due, claimer), due) for due in due_runs]

    def _ready_steps(self, claimer: StepClaimer, limit: int = 1, busy: bool = False) -> list[Unit]:
        """Claim up to ``limit`` ready steps, each with its own attempt, token and lease."""
        found = self.engine.claim_due_steps(self.queues, limit, claimer.worker, busy=busy)
        return [Unit(claimed.run_id, claimed) for claimed in found]

    def _async_done(self, claimed: ClaimedStep, outcome: StepOutcome) -> None:
        """An async step settled: count it, and wake the threads for its run's pass."""
        self.tally.ended(claimed, outcome)
        self._wake_all()

    def _seconds_until_next_due(self, looked_at: datetime | None = None) -> float:
        """Seconds until the earliest step lease lapses, retry or sleep falls due, or run
        wakes: an idle thread looks again then rather than a whole poll later.

        Nothing announces a lapsing lease or a timer, so without this a dead worker's
        step would wait for the next poll on top of its lease. ``looked_at``: when this
        thread's last look for work began (default: now).
        """
        now = self.engine.clock.now()
        since = now if looked_at is None else min(looked_at, now)
        # Only what falls due after the look counts: anything already due then that
        # this thread could not claim (taken by another worker, or its run was
        # cancelled) must not make it spin. What fell due during the look, after it
        # began, is looked for again at once, not a whole poll later.
        due = self.engine.store.next_due(since, self.queues)
        waits = [self.cadence.interval()]
        next_look = self.intakes.next_look()
        if next_look != float("-inf"):  # before the first look, ``waiting`` asks for one
            # A look already overdue (this thread's look took a while) is due at once:
            # 0, not left out, or the thread would sleep a whole poll past it.
            waits.append(max(next_look - time.monotonic(), 0.0))
        if due.lapse_in_ms is not None and due.lapse_in_ms >= 0:
            waits.append(due.lapse_in_ms / 1000)
        for at in (due.step_due, due.run_due):
            if at is not None:
                waits.append(max((at - now).total_seconds(), 0.0))
        return min(waits) + 0.005

    def _all_idle(self, index: int) -> bool:
        with self._lock:
            self._idle.add(index)
            # An async step in flight settles later, on the loop: not idle before it has.
            # So is a unit handed to a thread that has not taken it yet.
            if (
                len(self._idle) < self.concurrency
                or self.async_steps.in_flight()
                or self._batches.waiting()
            ):
                return False
        return not self._work_pending()

    def _work_pending(self) -> bool:
        """Whether anything is in flight or due within the idle grace (so until_idle goes on)."""
        engine = self.engine
        until = engine.clock.now() + timedelta(seconds=self.idle_grace)
        if any(intake.has_waiting(engine) for intake in intakes()):
            self.intakes.waiting.set()
            return True
        return engine.store.work_pending(until, self.queues)

    def pending_summary(self) -> dict[str, Any]:
        """What is left for later: runs waiting on timers and the next due time."""
        return pending_summary(self.engine)

    def _notified(self) -> None:
        """Work was announced (or the listener reconnected): one idle thread looks."""
        self.cadence.busy()
        self._waits.wake_one()
