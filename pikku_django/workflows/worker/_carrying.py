"""A worker thread carrying one run on: a pass, the step it claims, the pass after that
step (written with its success where it can be), and so on, under the run's lease."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pikku_django.leases import HeldLease
from pikku_django.workflows._values import (
    CarriedRun,
    ClaimedStep,
    DueRun,
    StepClaimer,
    StepOutcome,
    Wake,
)
from pikku_django.workflows.engine import WorkflowEngine
from pikku_django.workflows.logcontext import log_context
from pikku_django.workflows.passes._after_step import AfterStep
from pikku_django.workflows.steps._execution import ends_run
from pikku_django.workflows.steps.step_lease import keep_step_lease
from pikku_django.workflows.worker._event_loop import AsyncSteps, is_async_step
from pikku_django.workflows.worker._run_lease_hold import give_back, take_run_lease, wake_owed
from pikku_django.workflows.worker._tally import WorkerTally

#: How long a thread carries one run on, step after step, before it hands the run
#: back to the queue (one long run must not keep a thread from the others).
CHAIN_SECONDS = 0.25


class RunCarrier:
    """Carries runs on in a worker's threads, counting into its tally."""

    def __init__(
        self,
        engine: WorkflowEngine,
        tally: WorkerTally,
        async_steps: AsyncSteps,
        stopping: threading.Event,
    ) -> None:
        self.engine = engine
        self.tally = tally
        self.async_steps = async_steps
        self.stopping = stopping

    def carry(
        self,
        run_id: Any,
        claimer: StepClaimer,
        claimed: ClaimedStep | None = None,
        due: DueRun | None = None,
    ) -> int:
        """Carry a run on in this thread: a pass (unless ``claimed`` is given first),
        the step that pass claims, the pass after it, and so on, for up to
        CHAIN_SECONDS; how many passes and steps that was.

        The run's lease is held from the first pass to the last (unless a step's
        claim is shorter than the run lease), so the passes in between cost no lease
        round trips. Past the time limit, or when stopping, the last step settles
        with the run woken for any worker, after the lease is given back.
        ``due`` is the run as its claim read it, for the first pass; with ``claimed``,
        the claim that stored that step (and took the run's lease with it).
        """
        done = 0
        # Carrying off: every step settles with its run woken for any worker.
        until = time.monotonic() + (CHAIN_SECONDS if self.engine.config.carry_runs else -1.0)
        held: HeldLease | None = None
        if claimed is not None and due is not None:
            held, due = take_run_lease(self.engine, run_id, due), None
        carried: CarriedRun | None = None
        owed = False  # a step settled for this thread to pass its run next
        try:
            while True:
                if claimed is not None and is_async_step(claimed):
                    # Run on the event loop; its settle wakes the run for any worker.
                    if held is not None:
                        give_back(held)
                        held = None
                    self.async_steps.submit(claimed)
                    return done + 1
                if claimed is not None:
                    chain = not self.stopping.is_set() and time.monotonic() < until
                    # Held across the step only when the step's claim outlives the run
                    # lease: were this worker to die in the step, its run lease lapses
                    # before anyone can take the step over, so nothing waits for it.
                    if held is not None and (not chain or claimed.lease_ms < held.ttl_ms):
                        give_back(held)
                        held = None
                    if chain and held is not None and _passes_after(claimed):
                        outcome, after = self._execute_and_pass(claimed, claimer, held)
                    else:
                        outcome, after = self._execute(claimed, _wake(chain)), None
                    done += 1
                    if after is not None and not after.replay:
                        # Its success was written with the pass after it.
                        self.tally.passed()
                        done += 1
                        if after.claimed is None:
                            if held is not None and after.released is not None:
                                held.released_with(after.released)
                            return done  # the run ended, or is woken for any worker
                        claimed = after.claimed
                        continue
                    if not chain or outcome not in (StepOutcome.SUCCEEDED, StepOutcome.FAILED):
                        return done
                    if outcome is StepOutcome.SUCCEEDED and ends_run(claimed):
                        return done  # its settle ended the run (or woke it for a pass)
                    owed = True
                    # No other pass can have run meanwhile only if the lease was kept.
                    kept = held is not None and outcome is StepOutcome.SUCCEEDED
                    carried = claimed.carried if kept else None
                if held is None:
                    held = take_run_lease(self.engine, run_id, due)
                    if held is None:
                        return done
                claimed = self.engine.orchestrate(
                    run_id,
                    claimer=None if self.stopping.is_set() else claimer,
                    held=held,
                    carried=carried,
                    due=due,
                )
                owed, carried, due = False, None, None
                self.tally.passed()
                done += 1
                if claimed is None:
                    return done
        except Exception:
            if owed:
                # The pass this thread owed the run did not happen: nobody else was
                # woken for it, so wake the run for any worker.
                wake_owed(self.engine, run_id)
            raise
        finally:
            if held is not None:
                give_back(held)

    def _execute(self, claimed: ClaimedStep, wake: Wake) -> StepOutcome:
        outcome, _ = self._counted(
            claimed, lambda: (self.engine.execute_step(claimed, wake=wake), None)
        )
        return outcome

    def _execute_and_pass(
        self, claimed: ClaimedStep, claimer: StepClaimer, held: HeldLease
    ) -> tuple[StepOutcome, AfterStep | None]:
        """Run a step of a run this thread carries, with the pass after it (see
        :meth:`WorkflowEngine.execute_and_pass`)."""
        return self._counted(claimed, lambda: self.engine.execute_and_pass(claimed, claimer, held))

    def _counted(
        self,
        claimed: ClaimedStep,
        execute: Callable[[], tuple[StepOutcome, AfterStep | None]],
    ) -> tuple[StepOutcome, AfterStep | None]:
        """``execute`` the claimed step, counted and with its lease kept meanwhile."""
        self.tally.began(claimed)
        outcome, after = StepOutcome.FAILED, None
        try:
            with (
                log_context(run_id=str(claimed.run_id), step=claimed.name, attempt=claimed.attempt),
                keep_step_lease(self.engine, claimed),
            ):
                outcome, after = execute()
        finally:
            self.tally.ended(claimed, outcome)
        return outcome, after


def _wake(chain: bool) -> Wake:
    """What a step's success does to its run: left for this thread's next pass while
    it carries the run on, else woken for any worker."""
    return Wake.PASS if chain else Wake.NOW


def _passes_after(claimed: ClaimedStep) -> bool:
    """Whether the pass after ``claimed`` may be written with its success: it runs in
    this thread, is carried, and neither commits writes of its own nor ends its run."""
    return (
        claimed.carried is not None
        and not claimed.transactional
        and not is_async_step(claimed)
        and not ends_run(claimed)
    )
