"""Runs started together: a batch of new runs and their opening steps inserted in one
statement (``INSERT ... SELECT FROM unnest(...)`` on PostgreSQL, multi-row inserts
elsewhere), the runs whose idempotency key is taken left out, the work announced once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, models

from pikku_django.models import StepStatus, WorkflowRun, WorkflowStep
from pikku_django.prepared import fetch
from pikku_django.workflows._values import NewStep

#: The PostgreSQL channel that new work is announced on (``base.CHANNEL``).
_CHANNEL = "pikku_work"


class BulkStarts:
    """Inserts batches of new runs (a mixin of :class:`WorkflowStore`)."""

    #: The database alias (the store's).
    using: str

    if TYPE_CHECKING:

        @property
        def notifying(self) -> bool: ...

        def notify(self) -> None: ...

    def insert_runs(
        self, runs: Sequence[WorkflowRun], openings: Sequence[tuple[NewStep, datetime]]
    ) -> set[uuid.UUID]:
        """Insert the new ``runs`` (but those whose idempotency key is taken) and the
        opening steps of those made, each scheduled at its time, in the caller's
        transaction, and announce the work once if any run was made: the ids made."""
        if not runs:
            return set()
        if connections[self.using].vendor == "postgresql":
            return self._insert_runs_unnest(runs, openings)
        return self._insert_runs_multirow(runs, openings)

    def _insert_runs_multirow(
        self, runs: Sequence[WorkflowRun], openings: Sequence[tuple[NewStep, datetime]]
    ) -> set[uuid.UUID]:
        keyed = any(run.idempotency_key is not None for run in runs)
        # Django splits the rows only where the database caps a statement's parameters.
        WorkflowRun.objects.using(self.using).bulk_create(runs, ignore_conflicts=keyed)
        ids = [run.id for run in runs]
        made = (
            set(
                WorkflowRun.objects.using(self.using)
                .filter(id__in=ids)
                .values_list("id", flat=True)
            )
            if keyed
            else set(ids)
        )
        steps = [
            WorkflowStep(**step.columns(), status=StepStatus.SCHEDULED, available_at=due)
            for step, due in openings
            if step.run_id in made
        ]
        if steps:
            WorkflowStep.objects.using(self.using).bulk_create(steps)
        for run in runs:
            run._state.adding = run.id not in made
            run._state.db = self.using
        if made:
            self.notify()
        return made

    def _insert_runs_unnest(
        self, runs: Sequence[WorkflowRun], openings: Sequence[tuple[NewStep, datetime]]
    ) -> set[uuid.UUID]:
        connection = connections[self.using]
        run_names = [f.attname for f in WorkflowRun._meta.concrete_fields]
        run_cols, run_select, params = _unnest(WorkflowRun, run_names, runs, connection)
        quote = connection.ops.quote_name
        sql = (
            f"WITH made AS (INSERT INTO {quote(WorkflowRun._meta.db_table)} ({run_cols}) "
            f"{run_select} ON CONFLICT ({quote('workflow')}, {quote('idempotency_key')}) "
            f"DO NOTHING RETURNING {quote('id')})"
        )
        if openings:
            rows = [
                WorkflowStep(**step.columns(), status=StepStatus.SCHEDULED, available_at=due)
                for step, due in openings
            ]
            names = [f.attname for f in WorkflowStep._meta.concrete_fields if f.attname != "id"]
            step_cols, step_select, step_params = _unnest(WorkflowStep, names, rows, connection)
            run_id = f"c{names.index('run_id')}"
            sql += (
                f", opened AS (INSERT INTO {quote(WorkflowStep._meta.db_table)} ({step_cols}) "
                f"{step_select} WHERE n.{run_id} IN (SELECT {quote('id')} FROM made) RETURNING 1)"
            )
            params += step_params
        if self.notifying:
            # One announcement for the batch, sent as the transaction commits.
            sql += (
                ", told AS (SELECT count(pg_notify(%s, '')) AS n "
                "FROM (SELECT 1 FROM made LIMIT 1) AS one) "
                f"SELECT {quote('id')}, (SELECT n FROM told) FROM made"
            )
            params.append(_CHANNEL)
        else:
            sql += f" SELECT {quote('id')}, 0 FROM made"
        made = {row[0] for row in fetch(self.using, sql, params)}
        for run in runs:
            run._state.adding = run.id not in made
            run._state.db = self.using
        return made


def _unnest(
    model: type[models.Model], names: Sequence[str], objs: Sequence[models.Model], connection: Any
) -> tuple[str, str, list[Any]]:
    """The quoted columns of ``model``'s fields ``names``, a ``SELECT`` of ``objs``'
    values of them from ``unnest`` of one array each (aliased ``n.c0``, ``n.c1``...),
    and those arrays."""
    quote = connection.ops.quote_name
    by_name = {f.attname: f for f in model._meta.concrete_fields}
    fields = [by_name[name] for name in names]
    arrays: list[list[Any]] = []
    for field in fields:
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            arrays.append([field.pre_save(obj, add=True) for obj in objs])  # takes the time
        elif isinstance(field, models.JSONField):
            values = [getattr(obj, field.attname) for obj in objs]
            arrays.append([None if v is None else json.dumps(v, cls=field.encoder) for v in values])
        else:  # psycopg adapts the rest (str, int, bool, UUID, datetime) as they are
            arrays.append([getattr(obj, field.attname) for obj in objs])
    types = [
        "text" if isinstance(f, models.JSONField) else str(f.db_type(connection)) for f in fields
    ]
    picks = [
        f"n.c{i}::jsonb" if isinstance(f, models.JSONField) else f"n.c{i}"
        for i, f in enumerate(fields)
    ]
    select = (
        f"SELECT {', '.join(picks)} FROM unnest({', '.join(f'%s::{t}[]' for t in types)}) "
        f"AS n({', '.join(f'c{i}' for i in range(len(fields)))})"
    )
    return ", ".join(quote(f.column) for f in fields), select, arrays
