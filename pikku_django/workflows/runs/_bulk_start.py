"""Starting many runs of one workflow at once: every input checked first, then the runs
inserted a batch per statement in one transaction, each batch announced once.

Each run is built as a single start builds it (``_run_options`` resolves its options,
``_new_run`` its row, opening step and first step); only the writing is batched."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypedDict

from pikku_django.models import WorkflowRun
from pikku_django.workflows._values import to_json
from pikku_django.workflows.durations import Duration
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.runs._lifecycle import RunLifecycle
from pikku_django.workflows.runs._new_run import RunRow, check_idempotency_key, run_row
from pikku_django.workflows.runs._options import resolve_run_options
from pikku_django.workflows.runs._starting import workflow_definition

logger = workflow_logger(__name__)

#: The most runs one statement inserts.
BATCH = 1000

#: What a single start takes that a bulk start does not, and why.
_NOT_IN_BULK = {
    "idempotency_key": "give idempotency_keys, one per input (None for a run without)",
    "inline": "runs started together are run by workers; start an inline run on its own",
    "debounce": "a debounced start collapses starts of one key; start it on its own",
}


class BulkStartOptions(TypedDict, total=False):
    """What :func:`~pikku_django.workflows.start_workflows` takes for every run it
    starts, each as :func:`~pikku_django.workflows.start_workflow` describes it."""

    priority: int | None
    queue: str | None
    start_at: datetime | None
    delay: Duration | None
    concurrency_key: str | None
    concurrency_limit: int | None
    deadline: datetime | None
    timeout: Duration | None


def check_bulk_options(options: dict[str, Any]) -> None:
    """TypeError naming an argument that a bulk start does not take."""
    for name in sorted(set(options) - BulkStartOptions.__optional_keys__):
        why = _NOT_IN_BULK.get(name)
        raise TypeError(f"start_workflows takes no argument {name!r}" + (f": {why}" if why else ""))


def check_keys(count: int, keys: Sequence[str | None] | None) -> list[str | None]:
    """One idempotency key (or None) per input; ValueError or TypeError otherwise."""
    if keys is None:
        return [None] * count
    if isinstance(keys, (str, bytes)):
        raise TypeError("idempotency_keys must be a list of keys, one per input, not a str")
    keys = list(keys)
    if len(keys) != count:
        raise ValueError(
            f"idempotency_keys has {len(keys)} keys for {count} inputs: give one per input "
            f"(None for a run without a key)"
        )
    for key in keys:
        check_idempotency_key(key)
    return keys


class BulkStarter:
    """Starts many runs of one workflow in one transaction."""

    def __init__(self, lifecycle: RunLifecycle) -> None:
        self.lifecycle = lifecycle
        self.states = lifecycle.states
        self.store = lifecycle.store

    def start(
        self,
        workflow: str | Callable[..., Any],
        inputs: Iterable[Any],
        idempotency_keys: Sequence[str | None] | None,
        options: BulkStartOptions,
    ) -> list[WorkflowRun]:
        """A run per input, in order: a new one, or the one with its idempotency key
        (repeated keys in ``inputs`` share one run). Everything is checked before
        anything is written; the runs are created together or not at all."""
        check_bulk_options(dict(options))
        definition = workflow_definition(workflow)
        if isinstance(inputs, (str, bytes, dict)):
            raise TypeError(
                f"inputs must be an iterable of inputs, one per run, not a {type(inputs).__name__}"
            )
        inputs = list(inputs)
        keys = check_keys(len(inputs), idempotency_keys)
        now = self.states.clock.now()
        payloads = [to_json(x, f"The workflow input at index {i}") for i, x in enumerate(inputs)]
        resolved = [resolve_run_options(definition, now, input=x, **options) for x in inputs]
        # Each input's run: its own, or the first one of its key in this call.
        first: dict[str, int] = {}
        owner = [i if key is None else first.setdefault(key, i) for i, key in enumerate(keys)]
        runs: dict[int, WorkflowRun] = {}
        with self.store.atomic():
            taken = self._keyed(definition.name, list(first))
            for key, i in first.items():
                if key in taken:
                    runs[i] = taken[key]
            new = [i for i in range(len(inputs)) if owner[i] == i and i not in runs]
            lost: list[str] = []  # keys a concurrent start took meanwhile
            for start in range(0, len(new), BATCH):
                batch = new[start : start + BATCH]
                rows = [
                    run_row(
                        definition,
                        payloads[i],
                        keys[i],
                        resolved[i],
                        now,
                        inline=False,
                        config=self.store.config,
                        find_first_step=self.lifecycle.find_first_step,
                    )
                    for i in batch
                ]
                made = self.store.insert_runs(
                    [row.run for row in rows],
                    [(row.opening, row.due) for row in rows if row.opening is not None],
                )
                for i, row in zip(batch, rows, strict=True):
                    if row.run.id in made:
                        runs[i] = row.run
                    else:
                        lost.append(str(keys[i]))
                self._started(row for row in rows if row.run.id in made)
            taken = self._keyed(definition.name, lost)
            for i in new:
                if i not in runs:
                    runs[i] = taken[str(keys[i])]
        return [runs[i] for i in owner]

    def _keyed(self, workflow: str, keys: list[str]) -> dict[str, WorkflowRun]:
        """The runs of ``workflow`` holding ``keys``, as last committed (a locking read,
        as :meth:`~WorkflowStore.keyed_run` reads one)."""
        found: dict[str, WorkflowRun] = {}
        for start in range(0, len(keys), BATCH):
            chunk = keys[start : start + BATCH]
            rows = self.store.runs().filter(workflow=workflow, idempotency_key__in=chunk)
            for run in rows.select_for_update() if chunk else ():
                found[str(run.idempotency_key)] = run
        return found

    def _started(self, rows: Iterable[RunRow]) -> None:
        """Tell the run_started listeners (and the log) of each new run."""
        logged = logger.isEnabledFor(logging.INFO)
        for row in rows:
            if logged:
                with log_context(workflow=row.run.workflow, run_id=str(row.run.id)):
                    logger.info("Run started")
            self.states.events.run_started(row.run)
