"""The in-process driver of inline runs: passes and queued steps of a run's tree,
in this thread, until the run ends, suspends or waits on something not due here."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from pikku_django.leases import HeldLease, LeaseLostError, LeaseTakenError
from pikku_django.models import RunStatus, WorkflowRun
from pikku_django.workflows._values import (
    CarriedRun,
    StepClaimer,
    StepOutcome,
    Wake,
    default_worker_id,
)
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.steps._claims import Claims
from pikku_django.workflows.steps._execution import Execution

logger = workflow_logger(__name__)


class InlineDriver:
    """Drives an inline run's tree to an end in this process."""

    def __init__(
        self,
        claims: Claims,
        execution: Execution,
        orchestrate: Callable[..., Any],
        get_run: Callable[[uuid.UUID | str], WorkflowRun],
        run_lease: Callable[[uuid.UUID], HeldLease],
    ) -> None:
        self.claims = claims
        self.execution = execution
        self.store = claims.store
        self.clock = claims.clock
        self.orchestrate = orchestrate
        self.get_run = get_run
        self.run_lease = run_lease

    def drive(self, run_id: uuid.UUID | str) -> WorkflowRun:
        """Run an inline run to an end (or suspension) in this process."""
        while True:
            run = self.get_run(run_id)
            if run.status != RunStatus.RUNNING:
                return run
            self._carry(run.id)
            run = self.get_run(run_id)
            if run.status != RunStatus.RUNNING:
                return run
            if self._work_tree(run.id):
                continue
            due = self.store.next_due_of(self._tree(run.id))
            if due is None:
                logger.warning("Inline run %s is waiting on work that is not due here", run.id)
                return run
            self.clock.sleep(max(0.0, (due - self.clock.now()).total_seconds()))

    def _carry(self, run_id: uuid.UUID) -> None:
        """Pass a run under its lease, held from pass to pass, running each queued step
        a pass claims and passing the run again after it, as a worker thread carries
        a run; until a pass claims nothing (the run ended, parked, or waits)."""
        try:
            held = self.run_lease(run_id).__enter__()
        except LeaseTakenError:
            self.orchestrate(run_id)  # passed elsewhere: this pass wakes it again shortly
            return
        claimer = StepClaimer(default_worker_id(), inline=True)
        carried: CarriedRun | None = None
        try:
            while True:
                claimed = self.orchestrate(run_id, claimer=claimer, held=held, carried=carried)
                if claimed is None:
                    return
                outcome = self.execution.execute_step(claimed, wake=Wake.PASS)
                if outcome is StepOutcome.SUCCEEDED:
                    carried = claimed.carried  # no other pass ran: the lease was kept
                elif outcome is StepOutcome.FAILED:
                    carried = None  # the pass after a failure reads the run again
                else:
                    return  # retrying, superseded, suspended or stopped: looked at again
        finally:
            try:
                held.__exit__(None, None, None)
            except LeaseLostError:
                logger.info("Run lease %s had lapsed when it was given back", held.key)

    def _tree(self, run_id: uuid.UUID) -> list[uuid.UUID]:
        ids, frontier = [run_id], [run_id]
        while frontier:
            frontier = list(
                self.store.steps()
                .filter(run_id__in=frontier, child_run__isnull=False)
                .values_list("child_run_id", flat=True)
            )
            ids.extend(frontier)
        return ids

    def _work_tree(self, root: uuid.UUID) -> bool:
        tree = self._tree(root)
        did = False
        children = list(
            self.store.runs()
            .filter(id__in=tree[1:], status=RunStatus.RUNNING)
            .values_list("id", flat=True)
        )
        if children:
            # Progress is a run or step of the tree that changed, not a pass as such:
            # a child that parks on a sleep again has done nothing, and the caller
            # must then wait for the next due time rather than pass it again.
            before = self._tree_state(tree)
            for child_id in children:
                self._carry(child_id)
            did = self._tree_state(tree) != before
        for step in self.store.ready_steps_of(tree, self.clock.now()):
            claimed = self.claims.decide(
                step,
                self.claims.config.lease_ms_for_queue(step.queue),
                default_worker_id(),
                pausable=False,  # this caller drives its inline run: no worker claims it
            )
            if claimed is not None:
                self.execution.execute_step(claimed)
                did = True
        return did

    def _tree_state(self, tree: list[uuid.UUID]) -> tuple[set[Any], set[Any]]:
        runs = set(self.store.runs().filter(id__in=tree).values_list("id", "status"))
        steps = set(
            self.store.steps().filter(run_id__in=tree).values_list("id", "status", "attempt")
        )
        return runs, steps
