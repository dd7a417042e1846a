"""The pass after a carried step's success, written with that success.

A worker thread that carries a run from step to step would record a step's success
and then pass its run, which stores the next step claimed or ends the run: two
writes. Here the pass runs first, on the result as the store will hold it, without
writing; if it ends at the next queued step this thread takes, or ends the run, the
success and that outcome are written together (one statement where the store has
one, else one transaction). A pass that reaches anything else writes nothing and is
not taken: the success is recorded alone, and the run passed as usual.
"""

from __future__ import annotations

import copy
import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from pikku_django.leases import HeldLease, LeaseLostError
from pikku_django.leases.base import Lease
from pikku_django.models import RunStatus, StepStatus, WorkflowRun
from pikku_django.workflows import registry
from pikku_django.workflows._values import (
    Chained,
    ClaimedStep,
    Pause,
    Settled,
    StepClaimer,
    StepDone,
    Wake,
    to_json,
)
from pikku_django.workflows.errors import (
    NotSerializableError,
    StepFunctionNotFoundError,
    UnknownPatchError,
    WorkflowStepSupersededError,
    serialize_error,
)
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.passes._determinism import replay_body
from pikku_django.workflows.passes._memo import RecordedSteps
from pikku_django.workflows.passes._recorder import StepRecorder, StepsUnread, WritesRefused
from pikku_django.workflows.passes._replay import NewClaim, Replay
from pikku_django.workflows.passes.context import WorkflowContext
from pikku_django.workflows.runs._versions import check_no_unknown_patch, version_admitted
from pikku_django.workflows.store.base import WorkflowStore

logger = workflow_logger(__name__)

#: How many (workflow, step) pairs whose pass after them wrote something else are
#: remembered, so that their next successes are recorded alone at once.
REMEMBERED = 4096


class Unwritten(enum.Enum):
    """Why the pass after a step is not written with it."""

    #: It reached something it must write first (a step, a sleep, a park...).
    WRITES_FIRST = "writes first"
    #: It met what the usual pass deals with (a missing function, a lost lease...).
    LEFT_TO_PASS = "left to the pass"  # noqa: S105 - a reason, not a password


@dataclass(frozen=True)
class AfterStep:
    """What the pass after a step's success did, written with it."""

    #: The success as recorded.
    settled: Settled
    #: The next step, stored claimed by this thread: it runs next.
    claimed: ClaimedStep | None = None
    #: The pass was not written (it ran on a result other than the one stored): the
    #: run needs a pass as usual, and is due for one meanwhile.
    replay: bool = False
    #: Whether the run's lease was released with the run's end (None: not asked to).
    released: bool | None = None


class PassAfterStep:
    """Runs the pass after a carried step's success and writes both together."""

    def __init__(self, replay: Replay, wake_at: Callable[[Wake], datetime]) -> None:
        self.replay = replay
        self.states = replay.states
        self.store: WorkflowStore = replay.store
        #: When a run falls due after a settle that owes it a pass (``Wake.PASS``).
        self.wake_at = wake_at
        self._wrote: dict[tuple[str, str], None] = {}

    def run(
        self,
        claimed: ClaimedStep,
        result: Any,
        claimer: StepClaimer,
        held: HeldLease,
        release: Lease | None = None,
    ) -> AfterStep | None:
        """Pass the run after ``claimed`` returned ``result`` (plain JSON), and write
        the success with what the pass did; None when not taken (nothing written).
        ``release``: the run's lease (``held``'s, in the runs' database), released
        with the run's end. WorkflowStepSupersededError when the attempt was replaced."""
        carried = claimed.carried
        if carried is None or carried.run.status != RunStatus.RUNNING:
            return None
        run = carried.run
        if (run.workflow, claimed.name) in self._wrote:
            return None
        definition = registry.get_workflow(run.workflow)
        if definition is None or (not run.version and definition.version):
            return None  # the usual pass reports it, or records the version
        config = self.replay._config()
        if not version_admitted(self.states, definition, run, config.carried_versions_only):
            return None
        stored = self.store.json_as_stored(result)
        steps = _with_success(carried.steps, claimed, stored)
        if steps is None:
            return None
        recorder = StepRecorder(
            run, steps, config=config, inline=self.replay.inline, claimer=claimer
        )
        recorder.write_nothing()
        done = StepDone(
            claimed.step_id, claimed.attempt, stored, timezone.now(), claimed.claim_token
        )
        with log_context(run_id=str(run.id), workflow=run.workflow, step=None, attempt=None):
            write = self._pass(recorder, definition.fn, held, done, release)
            if isinstance(write, Unwritten):
                if write is Unwritten.WRITES_FIRST:
                    self._not_taken(run, claimed)
                return None
            try:
                return write()
            except DatabaseError:
                # One statement (or transaction): nothing of it was written.
                logger.warning(
                    "Could not write step %s's success with the pass after it; "
                    "recording it on its own",
                    claimed.name,
                    exc_info=True,
                )
                return None

    def _pass(
        self,
        recorder: StepRecorder,
        fn: Callable[..., Any],
        held: HeldLease,
        done: StepDone,
        release: Lease | None,
    ) -> Callable[[], AfterStep] | Unwritten:
        """Run the pass without writing: the write of the success with what it did,
        or why there is none."""
        run = recorder.run
        ctx = WorkflowContext(recorder)
        try:
            held.vouch()
            output = replay_body(fn, ctx, ctx.input)
            check_no_unknown_patch(ctx, None)
        except Pause:
            request = recorder.claim_request
            if request is None or recorder.claimer is None:
                return Unwritten.WRITES_FIRST  # it parks
            claim = NewClaim.of(recorder, *request, self.replay._config())
            return lambda: self._claim(recorder, done, claim)
        except (WritesRefused, StepsUnread):
            return Unwritten.WRITES_FIRST
        except (
            StepFunctionNotFoundError,
            UnknownPatchError,
            WorkflowStepSupersededError,
            LeaseLostError,
            DatabaseError,
        ):
            return Unwritten.LEFT_TO_PASS
        except Exception as exc:
            error = serialize_error(exc)
            return lambda: self._finish(run, done, RunStatus.FAILED, error=error, release=release)
        try:
            payload = to_json(output, f"The output of workflow {run.workflow!r}")
        except NotSerializableError as exc:
            error = serialize_error(exc)
            return lambda: self._finish(run, done, RunStatus.FAILED, error=error, release=release)
        return lambda: self._finish(run, done, RunStatus.COMPLETED, output=payload, release=release)

    def _not_taken(self, run: WorkflowRun, claimed: ClaimedStep) -> None:
        """The pass reached something to write: record such successes alone from now."""
        if len(self._wrote) >= REMEMBERED:
            self._wrote.clear()
        self._wrote[(run.workflow, claimed.name)] = None

    def _claim(self, recorder: StepRecorder, done: StepDone, claim: NewClaim) -> AfterStep:
        run = recorder.run
        self.states.events.run_pass_started(run)
        try:
            chained = _written(
                done,
                settle_then_claim(
                    self.store,
                    done,
                    claim,
                    park_wakes=run.wakes,
                    pass_wake_at=self.wake_at(Wake.PASS),
                ),
            )
        finally:
            self.states.events.run_pass_finished(run)
        settled = _settled(run, chained)
        if not chained.same:
            # The pass saw the result otherwise than a read of it will: pass again.
            return AfterStep(settled, replay=True)
        if chained.claimed is None:
            # Stored meanwhile by another pass, or the run stopped running: look again.
            self.states.wake(run.id)
            return AfterStep(settled)
        following = claim.stored(recorder, *chained.claimed)
        self.replay.memo.keep(run.id, recorder.steps)
        return AfterStep(settled, following)

    def _finish(
        self,
        run: WorkflowRun,
        done: StepDone,
        status: str,
        *,
        output: Any = None,
        error: Any = None,
        release: Lease | None = None,
    ) -> AfterStep:
        self.states.events.run_pass_started(run)
        try:
            chained = _written(
                done,
                self.states.finish_after(
                    done,
                    run,
                    status,
                    output=output,
                    error=error,
                    pass_wake_at=self.wake_at(Wake.PASS),
                    release=release,
                ),
            )
        finally:
            self.states.events.run_pass_finished(run)
        self.replay.memo.forget(run.id)
        settled = _settled(run, chained, ended=bool(chained.finished), status=status)
        return AfterStep(settled, released=chained.released)


def settle_then_claim(
    store: WorkflowStore,
    done: StepDone,
    claim: NewClaim,
    *,
    park_wakes: int,
    pass_wake_at: datetime,
) -> Chained | None:
    """Record ``done`` and store ``claim``'s step claimed, together: in one statement
    where the store has one, else in one transaction (the claim only if the result
    reads back as the pass saw it)."""
    if store.chains_in_one_statement:
        return store.settle_then_claim(
            done,
            claim.step,
            lease_ms=claim.lease_ms,
            worker=claim.worker,
            park_wakes=park_wakes,
            pass_wake_at=pass_wake_at,
        )
    with store.atomic():
        settled = store.settle(
            done.step_id,
            done.attempt,
            StepStatus.SUCCEEDED,
            result=done.result,
            token=done.claim_token,
        )
        if settled is None:
            return None
        same = _same_json(settled.result, done.result)
        stored = (
            store.insert_claimed(
                claim.step, lease_ms=claim.lease_ms, worker=claim.worker, park_wakes=park_wakes
            )
            if same
            else None
        )
        if stored is None:  # the pass after the success is still owed
            store.due_for_pass(claim.step.run_id, pass_wake_at)
    return Chained(settled.result, settled.run_status, settled.run_wakes, same, stored)


def _written(done: StepDone, chained: Chained | None) -> Chained:
    """A chained write's outcome: WorkflowStepSupersededError when the success was
    refused (the attempt was replaced)."""
    if chained is None:
        raise WorkflowStepSupersededError(done.step_id, done.attempt)
    return chained


def _settled(
    run: WorkflowRun, chained: Chained, *, ended: bool = False, status: str | None = None
) -> Settled:
    """The success as recorded; the run's status is its end's when the write ended it."""
    return Settled(
        run.id,
        status if ended and status is not None else chained.run_status,
        chained.run_wakes,
        chained.result,
        workflow=run.workflow,
        run_created_at=run.created_at,
    )


def _with_success(steps: dict[str, Any], claimed: ClaimedStep, result: Any) -> RecordedSteps | None:
    """A copy of the carried ``steps`` with ``claimed``'s step succeeded with ``result``
    (the carried ones are left as they are until the success is recorded)."""
    step = steps.get(claimed.name)
    if step is None or step.id != claimed.step_id:
        return None
    copied = (
        steps.copy_steps() if isinstance(steps, RecordedSteps) else RecordedSteps(steps.values())
    )
    succeeded = copy.copy(step)
    succeeded.result, succeeded.error = result, None
    succeeded.lease_expires_at = succeeded.available_at = None
    succeeded.attempt, succeeded.status = claimed.attempt, StepStatus.SUCCEEDED
    copied.add(succeeded)
    return copied


def _same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values read the same, their objects' keys in the same order."""
    return json.dumps(a) == json.dumps(b)
