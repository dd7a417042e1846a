"""A run's first step, found as the run starts and stored with it, so that a worker
can claim the run and that step in one statement and skip the run's first pass.

Starting a run replays its workflow against no steps, writing nothing and refusing
every database query, until it reaches its first queued step: that step (its name,
function, input and options) is stored in ``WorkflowRun.first_step``. The run stays
due as any run: a store without the one-statement claim, or a worker that cannot
take the step (another queue, a limited queue, a workflow it does not know), clears
the hint and passes the run as usual; that first pass reaches the same step."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connections

from pikku_django.models import StepKind, StepStatus, WorkflowRun, WorkflowStep
from pikku_django.workflows import registry
from pikku_django.workflows._values import (
    CarriedRun,
    ClaimedStep,
    DueRun,
    FirstStepAsk,
    NewStep,
    Pause,
    StepClaimer,
)
from pikku_django.workflows.config import EngineConfig
from pikku_django.workflows.logcontext import workflow_logger
from pikku_django.workflows.passes._inline_steps import InlineSteps
from pikku_django.workflows.passes._memo import recorded_steps
from pikku_django.workflows.passes._recorder import StepRecorder, StepsUnread, WritesRefused
from pikku_django.workflows.passes.context import WorkflowContext

logger = workflow_logger(__name__)

#: The columns of a step that ``WorkflowRun.first_step`` holds (its run gives the rest).
HINT_FIELDS = (
    "name",
    "function",
    "input",
    "retries",
    "retry_delay",
    "backoff",
    "queue",
    "transactional",
    "timeout",
)

#: Takes any queued step of a registered function (a limited queue's never).
_ANY_WORKER = StepClaimer("")


class QueryRefused(BaseException):
    """A workflow body queried the database while its first step was being found.

    A BaseException, so that the body's own ``except Exception`` cannot swallow it."""


class FirstSteps:
    """Finds new runs' first steps, and turns the ones a claim stored into claimed steps."""

    def __init__(
        self,
        inline: InlineSteps,
        settings: Callable[[], EngineConfig],
        claims_in_store: Callable[[], bool],
    ) -> None:
        self.inline = inline
        self.store = inline.store
        self._settings = settings
        #: Whether due-run claims can store first steps (run leases in the store).
        self._claims_in_store = claims_in_store

    def find(
        self, definition: registry.WorkflowDefinition, run: WorkflowRun
    ) -> dict[str, Any] | None:
        """The queued step the new ``run``'s first pass will reach (its columns, for
        ``WorkflowRun.first_step``), or None: the setting is off, the store cannot
        use it, or the body reached anything else first (an inline step, a sleep, a
        child run, its end, a database query, an error)."""
        config = self._settings()
        if not (config.first_step_at_start and self._claims_in_store()):
            return None
        probe = copy.copy(run)
        probe.input = self.store.json_as_stored(run.input)  # as a pass reads it
        recorder = StepRecorder(probe, {}, config=config, inline=self.inline, claimer=_ANY_WORKER)
        recorder.write_nothing()
        recorder.unread = True  # anything but a step to claim stops the replay
        refused: list[str] = []
        try:
            with _queries_refused(refused):
                definition.fn(WorkflowContext(recorder), probe.input)
        except Pause:
            pass
        except Exception:  # the first pass meets it, and records it
            return None
        except BaseException as exc:
            if not _stopped_replay(exc):
                raise
            return None
        if recorder.claim_request is None or refused:
            return None
        name, options, payload = recorder.claim_request
        columns = NewStep.of(run, name, StepKind.QUEUED, options, payload).columns()
        return {field: columns[field] for field in HINT_FIELDS}

    def ask(self, claimer: StepClaimer | None) -> FirstStepAsk | None:
        """What a due-run claim for ``claimer`` needs to store first steps claimed;
        None where it must not (no claimer, or runs of some versions are left to
        other workers, which only a pass can tell)."""
        config = self._settings()
        if claimer is None or claimer.inline or config.carried_versions_only:
            return None
        leases = {name: config.lease_ms_for_queue(name) for name in config.queues}
        leases.update(config.queue_lease_ms)
        return FirstStepAsk(
            worker=claimer.worker,
            queues=tuple(claimer.queues),
            left_out=tuple(name for name in config.queues if config.is_limited(name)),
            workflows=tuple(registry.workflow_names()),
            lease_queues=tuple(leases),
            lease_ms=tuple(leases.values()),
            default_lease_ms=config.step_lease_ms,
        )

    @staticmethod
    def claimed(due: DueRun, worker: str) -> ClaimedStep | None:
        """The step the claim of ``due`` stored claimed by ``worker``, carrying its
        run as a pass that stopped there would (None: it stored none)."""
        first = due.first_step
        if first is None:
            return None
        run, hint = due.run, first.columns
        row = WorkflowStep(
            id=first.step_id,
            run_id=run.id,
            kind=StepKind.QUEUED,
            priority=run.priority,
            status=StepStatus.RUNNING,
            attempt=1,
            claim_token=first.claim_token,
            **{field: hint.get(field) for field in HINT_FIELDS},
        )
        return ClaimedStep(
            step_id=first.step_id,
            run_id=run.id,
            name=row.name,
            function=row.function,
            input=row.input,
            attempt=1,
            transactional=bool(row.transactional),
            lease_ms=first.lease_ms,
            queue=row.queue,
            carried=CarriedRun(run, recorded_steps({row.name: row})),
            claimed_at=due.asked_at,
            timeout=row.timeout,
            worker=worker,
            claim_token=first.claim_token,
        )


def _stopped_replay(exc: BaseException) -> bool:
    """Whether ``exc`` is how a replay that may not read or write stops."""
    return isinstance(exc, (StepsUnread, WritesRefused, QueryRefused))


@contextlib.contextmanager
def _queries_refused(refused: list[str]) -> Iterator[None]:
    """Every database query in the block raises :class:`QueryRefused` (noted in
    ``refused``, in case the body swallows even that)."""

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        refused.append(sql)
        raise QueryRefused(sql)

    with contextlib.ExitStack() as stack:
        for alias in connections:
            stack.enter_context(connections[alias].execute_wrapper(refuse))
        yield
