"""The worker behind ``manage.py pikku_worker``: orchestration passes and steps, in threads."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import close_old_connections, connections
from django.db.models import Exists, F, Max, Min, OuterRef, Q

from pikku_django.conf import pikku_settings
from pikku_django.dbclock import EpochMs
from pikku_django.leases import HeldLease, LeaseLostError, LeaseTakenError, hold_lease
from pikku_django.models import RunStatus, StepKind, StepStatus
from pikku_django.timers import call_later
from pikku_django.webhooks.dispatch import waiting_receipts
from pikku_django.webhooks.sql import RECEIPTS_WAITING
from pikku_django.workflows.engine import CarriedRun, ClaimedStep, StepClaimer, WorkflowEngine
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.sql import CHANNEL

logger = workflow_logger(__name__)

#: How long a thread carries one run on, step after step, before it hands the run
#: back to the queue (one long run must not keep a thread from the others).
CHAIN_SECONDS = 0.25

#: Leases shorter than this still renew every half lease, with one warning.
SHORT_LEASE_MS = 1_000
_warned_short_lease = False

#: How many stored webhook events one look starts runs for.
RECEIPT_BATCH = 100


def renewal_interval_s(lease_ms: int) -> float:
    """Seconds between renewals of a step lease: at most half the lease."""
    return max(0.001, lease_ms / 2 / 1000)


@contextmanager
def keep_step_lease(engine: WorkflowEngine, claimed: ClaimedStep) -> Iterator[threading.Event]:
    """Renew a claimed step's lease every half lease while the block runs.

    Yields an Event set once a renewal reports that a newer attempt replaced
    this one; renewal then stops (the attempt's writes will be refused).
    """
    global _warned_short_lease
    if claimed.lease_ms < SHORT_LEASE_MS and not _warned_short_lease:
        _warned_short_lease = True
        logger.warning(
            "Step lease of %d ms on queue %r is under a second; renewing every %d ms",
            claimed.lease_ms,
            claimed.queue,
            claimed.lease_ms // 2,
        )
    superseded = threading.Event()
    stop = threading.Event()
    lock = threading.Lock()
    renewing: list[threading.Thread] = []
    interval = renewal_interval_s(claimed.lease_ms)

    def renew() -> None:
        with lock:
            if stop.is_set():
                return
            renewing.append(threading.current_thread())
        try:
            while True:
                try:
                    held = engine.refresh_step_lease(
                        claimed.step_id, claimed.lease_ms, claimed.attempt
                    )
                except Exception:
                    logger.warning(
                        "Renewing the lease of step %s failed; will retry",
                        claimed.name,
                        exc_info=True,
                    )
                else:
                    if not held:
                        logger.warning(
                            "Step %s attempt %d was claimed by a newer attempt; "
                            "its outcome will not be recorded",
                            claimed.name,
                            claimed.attempt,
                        )
                        superseded.set()
                        return
                if stop.wait(interval):
                    return
        except BaseException:
            logger.exception("The lease renewal of step %s died", claimed.name)
        finally:
            connections.close_all()

    # No thread until the first renewal is due (half a lease after the claim, not
    # after this block began): most steps finish before it.
    first = max(0.0, interval - (time.monotonic() - claimed.claimed_at))
    timer = call_later(first, renew, name=f"pikku-step-lease:{claimed.step_id}")
    try:
        yield superseded
    finally:
        stop.set()
        timer.cancel()
        with lock:
            threads = list(renewing)
        for thread in threads:
            thread.join()


def wake_stalled_runs(engine: WorkflowEngine, stalled_after: float, limit: int = 500) -> int:
    """Wake running runs that nothing will wake: no step in flight, idle for a while.

    A step in flight is scheduled, pending, suspended, waiting for a retry, or
    running under a live (or parked, null) lease. Such a run can only be left
    behind when a worker died between settling a step and waking its run.
    """
    cutoff = engine.clock.now() - timedelta(seconds=stalled_after)
    in_flight = (
        engine.steps()
        .filter(run_id=OuterRef("id"))
        .filter(
            Q(status__in=(StepStatus.SCHEDULED, StepStatus.PENDING, StepStatus.SUSPENDED))
            | Q(status=StepStatus.FAILED, attempt__lt=F("retries") + 1)
            | Q(status=StepStatus.RUNNING, lease_expires_at__isnull=True)
            | Q(status=StepStatus.RUNNING, lease_expires_at__gte=EpochMs())
        )
    )
    stalled = list(
        engine.runs()
        .filter(status=RunStatus.RUNNING, inline=False, wake_at__isnull=True, updated_at__lt=cutoff)
        .exclude(Exists(in_flight))
        .values_list("id", flat=True)[:limit]
    )
    for run_id in stalled:
        logger.warning("Run %s had nothing in flight for %gs: waking it", run_id, stalled_after)
        engine.wake_run(run_id)
    return len(stalled)


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
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be greater than 0, not {poll_interval}")
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
        self.stopping = threading.Event()
        self._work = threading.Condition()
        self._idle: set[int] = set()
        self._in_flight: dict[int, ClaimedStep] = {}
        self._lock = threading.Lock()
        self.passes = 0
        self.steps = 0
        self.errors = 0
        #: Progress counters: claimed steps, and how each claimed step ended.
        self.counts = dict.fromkeys(
            ("claimed", "finished", "failed", "retried", "recovered", "superseded"), 0
        )
        self.progress_interval = float(pikku_settings.WORKER_PROGRESS_INTERVAL)
        # Stored webhook events wait for their runs: looked for at start, when notified,
        # and once a poll interval.
        self._receipts_waiting = threading.Event()
        self._receipts_waiting.set()
        self._receipts_lock = threading.Lock()
        self._next_receipt_look = 0.0

    # -- lifecycle -------------------------------------------------------------------

    def run(self) -> None:
        """Work until stopped (or, with until_idle, until nothing is left)."""
        with self._single_sqlite_worker():
            threads = [
                threading.Thread(target=self._loop, args=(i,), name=f"pikku-worker-{i}")
                for i in range(self.concurrency)
            ]
            listener = None
            if self.notify and self.engine.vendor == "postgresql":
                listener = threading.Thread(
                    target=self._listen, name="pikku-worker-listen", daemon=True
                )
                listener.start()
            logger.info(
                "pikku_worker %s: %d thread(s), queues %s, database %r (%s)",
                self.name,
                self.concurrency,
                ", ".join(self.queues) or "all",
                self.engine.using,
                "notified" if listener else f"polling every {self.poll_interval:g}s",
            )
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
            self.stopping.set()
            if listener is not None:
                listener.join(timeout=10)
            self._report()

    def stop(self) -> None:
        """Stop claiming; threads finish what they hold, then return."""
        if not self.stopping.is_set():
            logger.info("pikku_worker %s stopping: finishing work in flight", self.name)
        self.stopping.set()
        self._wake_all()

    def hand_back(self) -> int:
        """Give up the steps in flight (their leases lapse now, fenced by attempt)."""
        with self._lock:
            in_flight = list(self._in_flight.values())
        handed = 0
        for claimed in in_flight:
            try:
                if self.engine.refresh_step_lease(claimed.step_id, -1, claimed.attempt):
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
            self._count("recovered", woken)
            return woken
        except Exception:
            logger.exception(
                "The recovery sweep failed; it runs again in %gs", self.recovery_interval
            )
            return 0
        finally:
            connections.close_all()

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def _report(self) -> None:
        c = self.counts
        logger.info(
            "pikku_worker %s progress: %d passes; steps claimed %d, finished %d, failed %d, "
            "retried %d, recovered %d, superseded %d; %d errors",
            self.name,
            self.passes,
            c["claimed"],
            c["finished"],
            c["failed"],
            c["retried"],
            c["recovered"],
            c["superseded"],
            self.errors,
        )

    @contextmanager
    def _single_sqlite_worker(self) -> Iterator[HeldLease | None]:
        if self.engine.vendor != "sqlite":
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
        with self._work:
            self._work.notify_all()

    def _loop(self, index: int) -> None:
        try:
            while not self.stopping.is_set():
                with self._lock:
                    self._idle.discard(index)  # busy until this iteration finds nothing
                try:
                    done = self._start_waiting_runs() + self._one_unit()
                except Exception:
                    self.errors += 1
                    logger.exception("pikku_worker thread %d hit an error; continuing", index)
                    done = 0
                    self.stopping.wait(min(self.poll_interval, 1.0))
                finally:
                    close_old_connections()
                if done:
                    self._wake_all()  # what this unit scheduled may be for another thread
                    continue
                if self.until_idle and self._all_idle(index):
                    self.stop()
                    return
                wait = self.poll_interval
                try:
                    wait = min(wait, self._seconds_until_next_due())
                except Exception:
                    logger.debug("Could not look up the next due time", exc_info=True)
                with self._work:
                    # Checked under the lock stop() notifies under: no lost wake-up.
                    if not self.stopping.is_set():
                        self._work.wait(max(wait, 0.005))
        finally:
            connections.close_all()

    def _start_waiting_runs(self) -> int:
        """Start the runs of stored webhook events, in one thread at a time: at once
        when told they wait (PostgreSQL), else at most once a poll interval."""
        if not self._receipts_waiting.is_set() and time.monotonic() < self._next_receipt_look:
            return 0
        if not self._receipts_lock.acquire(blocking=False):
            return 0
        try:
            self._receipts_waiting.clear()
            self._next_receipt_look = time.monotonic() + self.poll_interval
            linked = self.engine.start_waiting_runs(RECEIPT_BATCH)
            if linked >= RECEIPT_BATCH:  # there may be more
                self._receipts_waiting.set()
            return linked
        finally:
            self._receipts_lock.release()

    def _one_unit(self) -> int:
        engine = self.engine
        claimer = StepClaimer(f"{self.name}:{threading.get_ident()}", tuple(self.queues))
        done = 0
        for run_id in engine.claim_due_runs(1):
            done += self._carry(run_id, claimer)
        if self.stopping.is_set():
            return done
        for claimed in engine.claim_due_steps(self.queues, 1, claimer.worker):
            done += self._carry(claimed.run_id, claimer, claimed)
        return done

    def _carry(self, run_id: Any, claimer: StepClaimer, claimed: ClaimedStep | None = None) -> int:
        """Carry a run on in this thread: a pass (unless ``claimed`` is given first),
        the step that pass claims, the pass after it, and so on, for up to
        CHAIN_SECONDS; how many passes and steps that was.

        The run's lease is held from the first pass to the last (unless a step's
        claim is shorter than the run lease), so the passes in between cost no lease
        round trips. Past the time limit, or when stopping, the last step settles
        with the run woken for any worker, after the lease is given back.
        """
        done = 0
        until = time.monotonic() + CHAIN_SECONDS
        held: HeldLease | None = None
        carried: CarriedRun | None = None
        owed = False  # a step settled for this thread to pass its run next
        try:
            while True:
                if claimed is not None:
                    chain = not self.stopping.is_set() and time.monotonic() < until
                    # Held across the step only when the step's claim outlives the run
                    # lease: were this worker to die in the step, its run lease lapses
                    # before anyone can take the step over, so nothing waits for it.
                    if held is not None and (not chain or claimed.lease_ms < held.ttl_ms):
                        self._give_back(held)
                        held = None
                    outcome = self._execute(claimed, wake="pass" if chain else True)
                    done += 1
                    if not chain or outcome not in ("succeeded", "failed"):
                        return done
                    owed = True
                    # No other pass can have run meanwhile only if the lease was kept.
                    kept = held is not None and outcome == "succeeded"
                    carried = claimed.carried if kept else None
                if held is None:
                    held = self._take_run_lease(run_id)
                    if held is None:
                        return done
                claimed = self.engine.orchestrate(
                    run_id,
                    claimer=None if self.stopping.is_set() else claimer,
                    held=held,
                    carried=carried,
                )
                owed, carried = False, None
                self.passes += 1
                done += 1
                if claimed is None:
                    return done
        except Exception:
            if owed:
                # The pass this thread owed the run did not happen: nobody else was
                # woken for it, so wake the run for any worker.
                self._wake_owed(run_id)
            raise
        finally:
            if held is not None:
                self._give_back(held)

    def _wake_owed(self, run_id: Any) -> None:
        try:
            self.engine.wake_run(run_id)
        except Exception:
            logger.warning("Could not wake run %s; the recovery sweep will", run_id, exc_info=True)

    def _take_run_lease(self, run_id: Any) -> HeldLease | None:
        """The run's lease, held until :meth:`_give_back`; None (the run woken again
        shortly) while another worker passes the run."""
        held = self.engine.run_lease(run_id)
        try:
            return held.__enter__()
        except LeaseTakenError:
            logger.info("Run %s is orchestrated elsewhere; waking it again shortly", run_id)
            self.engine.retry_pass_soon(run_id)
            return None
        except Exception:
            # The lease store failed: the run, claimed until its pass timeout, must not
            # wait that long for the store to come back.
            logger.warning("Could not take the lease of run %s; waking it again shortly", run_id)
            self.engine.retry_pass_soon(run_id)
            raise

    def _give_back(self, held: HeldLease) -> None:
        """Release a run lease held across passes; each pass vouched for itself."""
        try:
            held.__exit__(None, None, None)
        except LeaseLostError:
            logger.info("Run lease %s had lapsed when it was given back", held.key)

    def _execute(self, claimed: ClaimedStep, *, wake: bool | str) -> str:
        with self._lock:
            self._in_flight[claimed.step_id] = claimed
        outcome = "failed"
        self._count("claimed")
        if claimed.reclaimed:
            self._count("recovered")
        try:
            with (
                log_context(run_id=str(claimed.run_id), step=claimed.name, attempt=claimed.attempt),
                keep_step_lease(self.engine, claimed),
            ):
                outcome = self.engine.execute_step(claimed, wake=wake)
        finally:
            self._count(
                {
                    "succeeded": "finished",
                    "retrying": "retried",
                    "superseded": "superseded",
                }.get(outcome, "failed")
            )
            with self._lock:
                self._in_flight.pop(claimed.step_id, None)
        self.steps += 1
        return outcome

    def _seconds_until_next_due(self) -> float:
        """Seconds until the earliest step lease lapses, retry or sleep falls due, or run
        wakes: an idle thread looks again then rather than a whole poll later.

        Nothing announces a lapsing lease or a timer, so without this a dead worker's
        step would wait for the next poll on top of its lease.
        """
        engine = self.engine
        steps = engine.steps().filter(kind=StepKind.QUEUED)
        if self.queues:
            steps = steps.filter(queue__in=self.queues)
        lapse = steps.filter(status=StepStatus.RUNNING, lease_expires_at__gt=EpochMs()).aggregate(
            at=Min("lease_expires_at"), now=Max(EpochMs())
        )
        due = steps.filter(
            status__in=(StepStatus.SCHEDULED, StepStatus.FAILED),
            available_at__gt=engine.clock.now(),
        ).aggregate(at=Min("available_at"))["at"]
        wake = (
            engine.runs()
            .filter(status=RunStatus.RUNNING, inline=False, wake_at__gt=engine.clock.now())
            .aggregate(at=Min("wake_at"))["at"]
        )
        now = engine.clock.now()
        # Only what falls due later counts: anything already due that this thread
        # could not claim (taken by another worker, or its run was cancelled) must
        # not make it spin.
        waits = [self.poll_interval]
        if lapse["at"] is not None and lapse["now"] is not None:
            waits.append((lapse["at"] - lapse["now"]) / 1000)
        for at in (due, wake):
            if at is not None:
                waits.append((at - now).total_seconds())
        return min(w for w in waits if w > 0) + 0.005

    def _all_idle(self, index: int) -> bool:
        with self._lock:
            self._idle.add(index)
            if len(self._idle) < self.concurrency:
                return False
        return not self._work_pending()

    def _work_pending(self) -> bool:
        """Whether anything is in flight or due within the idle grace (so until_idle goes on)."""
        engine = self.engine
        now = engine.clock.now() + timedelta(seconds=self.idle_grace)
        if engine.runs().filter(status=RunStatus.RUNNING, inline=False, wake_at__lte=now).exists():
            return True
        if waiting_receipts(engine).exists():
            self._receipts_waiting.set()
            return True
        steps = engine.steps().filter(
            kind=StepKind.QUEUED, run__status=RunStatus.RUNNING, run__inline=False
        )
        if self.queues:
            steps = steps.filter(queue__in=self.queues)
        return (
            steps.filter(
                status__in=(StepStatus.SCHEDULED, StepStatus.PENDING, StepStatus.RUNNING),
                available_at__lte=now,
            ).exists()
            or steps.filter(status=StepStatus.RUNNING).exists()
        )

    def pending_summary(self) -> dict[str, Any]:
        """What is left for later: runs waiting on timers and the next due time."""
        engine = self.engine
        waiting = engine.runs().filter(status=RunStatus.RUNNING, wake_at__isnull=False)
        return {
            "running_runs": engine.runs().filter(status=RunStatus.RUNNING).count(),
            "suspended_runs": engine.runs().filter(status=RunStatus.SUSPENDED).count(),
            "next_wake_at": waiting.order_by("wake_at").values_list("wake_at", flat=True).first(),
        }

    # -- PostgreSQL LISTEN/NOTIFY ------------------------------------------------------------

    def _listen(self) -> None:
        template = connections[self.engine.using]
        while not self.stopping.is_set():
            conn = type(template)(template.settings_dict, self.engine.using)
            try:
                conn.ensure_connection()
                raw = conn.connection
                raw.autocommit = True
                raw.execute(f"LISTEN {CHANNEL}")
                while not self.stopping.is_set():
                    for notice in raw.notifies(timeout=1.0, stop_after=1):
                        if notice.payload == RECEIPTS_WAITING:
                            self._receipts_waiting.set()
                        self._wake_all()
            except Exception:
                if self.stopping.is_set():
                    return
                logger.warning(
                    "LISTEN %s failed; reconnecting in %gs",
                    CHANNEL,
                    self.poll_interval,
                    exc_info=True,
                )
                self.stopping.wait(self.poll_interval)
            finally:
                try:
                    conn.close()
                except Exception:
                    logger.debug("closing the LISTEN connection failed", exc_info=True)
