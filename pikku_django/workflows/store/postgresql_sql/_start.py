"""The PostgreSQL store's statements that start runs."""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.models import JSONField

from pikku_django.models import WorkflowRun, WorkflowStep
from pikku_django.workflows.store.postgresql_sql._names import RUNS, _t, q, r

# -- start ---------------------------------------------------------------------------


def _runs_with_keys() -> str:
    """Parameters: the workflows, the keys."""
    return (
        f"SELECT {r('id')}, {r('workflow')}, {r('idempotency_key')} FROM {RUNS} "
        f"WHERE ({r('workflow')}, {r('idempotency_key')}) IN "
        f"(SELECT * FROM unnest(%s::text[], %s::text[]))"
    )


_INSERT_FIELDS: dict[tuple[type[Any], bool], list[Any]] = {}


def insert_fields(model: type[Any], auto_pk: bool) -> list[Any]:
    """The fields whose values an INSERT of ``model`` takes, in order (without its auto
    primary key when ``auto_pk``)."""
    found = _INSERT_FIELDS.get((model, auto_pk))
    if found is None:
        meta = model._meta
        found = [
            f
            for f in meta.local_concrete_fields
            if not (auto_pk and f is meta.auto_field) and not f.generated
        ]
        _INSERT_FIELDS[(model, auto_pk)] = found
    return found


def _insert(model: type[Any], auto_pk: bool) -> str:
    """The INSERT of a ``model`` row (JSON sent as text)."""
    fields = insert_fields(model, auto_pk)
    marks = ", ".join("%s::jsonb" if isinstance(f, JSONField) else "%s" for f in fields)
    cols = ", ".join(q(str(f.column)) for f in fields)
    return f"INSERT INTO {_t(model)} ({cols}) VALUES ({marks})"


def _start_run(opening: bool, announce: bool) -> str:
    """A new run and (``opening``) its first step, in one statement, and (``announce``)
    its announcement. Parameters: the run's fields (:func:`insert_fields`), the step's
    (its id made by the database), then the work channel (``announce``)."""
    parts = [f"r AS ({_insert(WorkflowRun, False)} RETURNING {r('id')})"]
    if opening:
        parts.append(f"s AS ({_insert(WorkflowStep, True)})")
    return f"WITH {', '.join(parts)} SELECT " + (
        "count(pg_notify(%s, '')) FROM r" if announce else "count(*) FROM r"
    )


def _postgresql() -> Any:
    """A PostgreSQL connection's wrapper (not connected), for its column types."""
    return next(c for c in connections.all() if c.vendor == "postgresql")


def _insert_unnest(model: type[Any], auto_pk: bool, where: str = "") -> str:
    """The INSERT of ``model`` rows from one array per field (:func:`insert_fields`,
    JSON as text), as ``unnest`` reads them (aliased ``n.c0``, ``n.c1``...)."""
    fields = insert_fields(model, auto_pk)
    connection = _postgresql()
    arrays = ", ".join(
        "%s::text[]" if isinstance(f, JSONField) else f"%s::{f.db_type(connection)}[]"
        for f in fields
    )
    picks = ", ".join(
        f"n.c{i}::jsonb" if isinstance(f, JSONField) else f"n.c{i}" for i, f in enumerate(fields)
    )
    cols = ", ".join(q(str(f.column)) for f in fields)
    names = ", ".join(f"c{i}" for i in range(len(fields)))
    return (
        f"INSERT INTO {_t(model)} ({cols}) SELECT {picks} FROM unnest({arrays}) AS n({names})"
        f"{where}"
    )


def _start_runs(openings: bool, announce: bool) -> str:
    """New runs (those whose idempotency key is taken left out) and (``openings``)
    the opening steps of those made, in one statement, and (``announce``) one
    announcement if any was made. Parameters: an array per run field
    (:func:`insert_fields`), then (``openings``) per step field, then the work channel
    (``announce``). Returns the ids of the runs made."""
    made = (
        f"made AS ({_insert_unnest(WorkflowRun, False)} "
        f"ON CONFLICT ({r('workflow')}, {r('idempotency_key')}) DO NOTHING "
        f"RETURNING {r('id')} AS id)"
    )
    parts = [made]
    if openings:
        run_id = [f.attname for f in insert_fields(WorkflowStep, True)].index("run_id")
        where = f" WHERE n.c{run_id} IN (SELECT id FROM made)"
        parts.append(f"opened AS ({_insert_unnest(WorkflowStep, True, where)})")
    if not announce:
        return f"WITH {', '.join(parts)} SELECT id FROM made"
    parts.append(
        "told AS (SELECT count(pg_notify(%s, '')) AS n FROM (SELECT 1 FROM made LIMIT 1) AS one)"
    )
    return f"WITH {', '.join(parts)} SELECT id, (SELECT n FROM told) FROM made"
