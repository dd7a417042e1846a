"""Parallel steps and child runs: ``ctx.parallel(name)`` starts branches without
waiting for each, and ``group.join()`` waits for them all.

A group is a step of kind ``parallel``; each branch is an ordinary queued step or
child step of the run, named like any other and linked to its group. Replay stays
deterministic: a branch is created once, by its name, and the join's outcome is
written on the group's row the first time it is decided, then read back.
"""

from __future__ import annotations

import contextlib
import enum
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, overload

from pikku_django.models import StepKind, StepStatus, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows._values import Pause, to_json
from pikku_django.workflows.compose._child_batch import BATCH, NewChild, store_children
from pikku_django.workflows.durations import Duration
from pikku_django.workflows.errors import (
    NonDeterministicWorkflowError,
    StepFailedError,
    WorkflowDefinitionError,
    WorkflowRunStateError,
)
from pikku_django.workflows.passes._inline_steps import fresh
from pikku_django.workflows.passes._recorder import StepRecorder
from pikku_django.workflows.runs._lifecycle import RunLifecycle


class Steps(Protocol):
    """What a group needs of the workflow context: its step naming and memo."""

    _recorder: StepRecorder
    _seen: defaultdict[str, int]

    def _step_name(self, name: object, *, internal: bool = False, branch: bool = False) -> str: ...

    def _existing(
        self, name: str, kind: str, function: str, *, new: bool = True
    ) -> WorkflowStep | None: ...


__all__ = ["Branch", "JoinPolicy", "Outcome", "ParallelGroup"]


class JoinPolicy(enum.StrEnum):
    """What a join does when a branch fails."""

    #: Raise the first failure at once and cancel the branches still running.
    FAIL_FAST = "fail_fast"
    #: Wait for every branch and return each one's :class:`Outcome`.
    COLLECT = "collect"


@dataclass(frozen=True)
class Outcome:
    """How one branch ended: its result, or its error (a dict from serialize_error)."""

    step: str
    ok: bool
    result: Any = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class Branch:
    """A step or child run started in a parallel group: the step's name."""

    name: str
    group: str


#: The error a cancelled queued branch ends with.
CANCELLED = {
    "type": "BranchCancelled",
    "message": "Cancelled: another branch of its parallel group failed",
    "code": "BRANCH_CANCELLED",
}


def settled(step: WorkflowStep) -> bool:
    """Whether a branch has its final outcome."""
    return step.status == StepStatus.SUCCEEDED or (
        step.status == StepStatus.FAILED and step.attempt >= step.attempts_allowed
    )


class ParallelGroup:
    """Branches started together in one run; ``join()`` waits for them."""

    def __init__(self, ctx: Steps, name: str, row: WorkflowStep) -> None:
        self._ctx = ctx
        self._recorder = ctx._recorder
        self.name = name
        self._row = row
        self._branches: list[Branch] = []
        self._new: list[NewChild] = []

    @property
    def branches(self) -> tuple[Branch, ...]:
        """The branches started so far, in the order they were started."""
        return tuple(self._branches)

    def do(
        self,
        name: str,
        fn: str | Callable[..., Any],
        data: Any = None,
        *,
        retries: int | None = None,
        retry_delay: Duration | None = None,
        backoff: str | None = None,
        queue: str | None = None,
        transactional: bool | None = None,
    ) -> Branch:
        """Start a branch without waiting for it: a registered step function (handed
        to a worker) or a registered workflow (a child run). Options as ``ctx.do``."""
        if self._row.status != StepStatus.RUNNING and not self._known(name):
            raise WorkflowDefinitionError(
                f"Parallel group {self.name!r} was joined: start its branches before join()"
            )
        ctx = self._ctx
        step_name = ctx._step_name(name, branch=True)
        child = registry.get_workflow(fn) if isinstance(fn, str) or _is_workflow(fn) else None
        if child is not None:
            step = ctx._existing(step_name, StepKind.CHILD, child.name)
            if step is None:
                self._start_child(step_name, child.name, data)
        else:
            options = self._recorder.options(
                fn,
                retries=retries,
                retry_delay=retry_delay,
                backoff=backoff,
                queue=queue,
                transactional=transactional,
            )
            if options.kind != StepKind.QUEUED:
                raise WorkflowDefinitionError(
                    f"Branch {step_name!r} of parallel group {self.name!r} must be a "
                    "registered step function run by a worker, or a registered workflow; "
                    f"{options.function or fn!r} runs inline"
                )
            if ctx._existing(step_name, StepKind.QUEUED, options.function) is None:
                self.flush()  # stored in the order the workflow reached them
                self._recorder.queue(step_name, options, data, group=self._row)
        branch = Branch(step_name, self.name)
        self._branches.append(branch)
        return branch

    def _known(self, name: str) -> bool:
        n = self._ctx._seen[name]
        return self._recorder.recorded(name if n == 0 else f"{name}#{n}") is not None

    def _start_child(self, name: str, workflow: str, data: Any) -> None:
        payload = to_json(data, f"The input of child workflow step {name!r}")
        self._new.append(NewChild(name, workflow, payload))
        self._recorder.deferred += 1
        if len(self._new) >= BATCH:
            self.flush()

    def flush(self) -> None:
        """Store the child branches reached since the last flush (the workflow's next
        step or the join does this)."""
        new, self._new = self._new, []
        self._recorder.deferred -= len(new)
        store_children(self._recorder, self._row, new)

    # -- joining ----------------------------------------------------------------------

    @overload
    def join(self, policy: Literal[JoinPolicy.FAIL_FAST] = ...) -> list[Any]: ...

    @overload
    def join(self, policy: Literal[JoinPolicy.COLLECT]) -> list[Outcome]: ...

    def join(self, policy: JoinPolicy = JoinPolicy.FAIL_FAST) -> list[Any] | list[Outcome]:
        """Wait for every branch: their results in start order (``FAIL_FAST``: the first
        failure is raised as :class:`StepFailedError` and the rest are cancelled), or
        every branch's :class:`Outcome` (``COLLECT``)."""
        policy = JoinPolicy(policy)
        self.flush()
        row = self._row
        if row.status == StepStatus.RUNNING:
            self._decide(policy)
        recorded = row.result if isinstance(row.result, dict) else {}
        if recorded.get("policy") not in (None, policy.value):
            raise NonDeterministicWorkflowError(
                f"Parallel group {self.name!r} was joined with {recorded['policy']!r} but "
                f"the workflow now joins it with {policy.value!r}"
            )
        if row.status == StepStatus.FAILED:
            raise StepFailedError(str(recorded.get("step", self.name)), row.error)
        steps = [self._step(branch) for branch in self._branches]
        if policy == JoinPolicy.COLLECT:
            return [_outcome(step) for step in steps]
        return [fresh(step.result) for step in steps]

    def _step(self, branch: Branch) -> WorkflowStep:
        step = self._recorder.recorded(branch.name)
        if step is None:  # the group was joined in a pass that had started it
            raise NonDeterministicWorkflowError(
                f"Branch {branch.name!r} of parallel group {self.name!r} was not started "
                "before the group was joined"
            )
        return step

    def _decide(self, policy: JoinPolicy) -> None:
        """Settle the group's row when its outcome is known; Pause while it is not."""
        steps = [self._step(branch) for branch in self._branches]
        if policy == JoinPolicy.FAIL_FAST:
            failed = [s for s in steps if s.status == StepStatus.FAILED and settled(s)]
            if failed:
                first = min(failed, key=lambda s: (s.updated_at, s.id))
                self._cancel([s for s in steps if not settled(s)])
                self._settle(
                    StepStatus.FAILED, {"policy": policy.value, "step": first.name}, first.error
                )
                return
        waiting = [s for s in steps if not settled(s)]
        if not waiting:
            self._settle(StepStatus.SUCCEEDED, {"policy": policy.value}, None)
            return
        missing = next((s for s in waiting if s.status == StepStatus.SUSPENDED), None)
        if missing is not None:
            self._recorder.suspend_at(missing)
        raise Pause(None)

    def _settle(self, status: str, result: dict[str, Any], error: Any) -> None:
        row = self._row
        self._recorder.states.finish_marker(row, status, result=result, error=error, final=True)
        row.status, row.result, row.error = status, result, error
        row.attempt, row.retries = max(row.attempt, 1), 0

    def _cancel(self, steps: Sequence[WorkflowStep]) -> None:
        """Cancel branches still running: child runs as ``cancel_workflow`` does, queued
        steps failed for good (a worker still running one is superseded)."""
        states = self._recorder.states
        lifecycle = RunLifecycle(states)
        for step in steps:
            if step.kind == StepKind.CHILD and step.child_run_id is not None:
                with contextlib.suppress(WorkflowRunStateError):  # ended meanwhile
                    lifecycle.cancel(step.child_run_id)
            elif step.kind == StepKind.QUEUED:
                states.finish_marker(step, StepStatus.FAILED, error=CANCELLED, final=True)


def _outcome(step: WorkflowStep) -> Outcome:
    if step.status == StepStatus.SUCCEEDED:
        return Outcome(step.name, True, result=fresh(step.result))
    return Outcome(step.name, False, error=fresh(step.error))


def _is_workflow(fn: object) -> bool:
    return hasattr(fn, "__pikku_workflow__")


def open_group(ctx: Steps, name: str) -> ParallelGroup:
    """The group named ``name`` of this run: stored the first time it is reached."""
    recorder = ctx._recorder
    step_name = ctx._step_name(name)
    row = ctx._existing(step_name, StepKind.PARALLEL, "")
    if row is None:
        row = recorder.inline.create(
            recorder.run,
            name=step_name,
            kind=StepKind.PARALLEL,
            status=StepStatus.RUNNING,
            attempt=1,
            retries=0,
        )
        recorder.remember(row)
    return ParallelGroup(ctx, step_name, row)
