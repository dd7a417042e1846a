"""The PostgreSQL store's hot statements as PL/pgSQL functions, for a database reached
through a pooler in transaction mode.

Behind such a pooler no statement may be prepared (the next transaction may run on a
server session that never prepared it), so the server would parse and plan each step's
settle and each run's claim every time. A PL/pgSQL function plans the statement it
runs once per server session and keeps the plan for as long as that session lives,
whichever client calls it: nothing is kept that a client relies on, and any session
can run it. So after each ``migrate``, on PostgreSQL, every statement named in
:data:`HOT` is created as a function ``pikku_q_<digest of its text>`` taking the same
parameters (typed as the server infers them) and returning the same rows
(:func:`install`). On an alias that ``PIKKU["DATABASE_POOLING"]`` puts behind a
transaction pooler, :func:`pikku_django.prepared.fetch_on` then calls the function in
place of the statement when the database has it (:func:`call_for`); the statement
itself, its fences and its effects are the same. A database migrated by an older
version has no function for a changed statement: the statement runs as it is.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from typing import Any

from django.db import DatabaseError, connections, router, transaction

from pikku_django.pooling import keeps_sessions

logger = logging.getLogger(__name__)

#: The statements made functions: those a worker runs for every step or run.
HOT = (
    "settle",
    "settle_then_claim",
    "settle_then_finish",
    "settle_then_finish_released",
    "claim_step",
    "insert_claimed",
    "claim_due_runs",
    "claim_due_runs_first",
    "claim_due_runs_first_served",
    "finish_run",
    "ready_steps_exist",
    "ready_steps_exist_on",
    "retries_or_lapsed_exist",
    "retries_or_lapsed_exist_on",
)
PREFIX = "pikku_q_"
_PLACEHOLDER = re.compile(r"%s|%%")
#: The type of a parameter or column the server leaves unknown.
_UNKNOWN = "unknown"


def function_name(sql: str) -> str:
    """The function's name for statement ``sql``: a new text is a new function."""
    return PREFIX + hashlib.sha256(sql.encode()).hexdigest()[:20]


def numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders as ``$1``, ``$2``, ... (and ``%%`` as ``%``)."""
    count = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%"
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(replace, sql)


def _hot_statements() -> dict[str, str]:
    from pikku_django.workflows.store.postgresql_sql import statement

    return {name: statement(name) for name in HOT}


def _described(raw: Any, sql: str) -> tuple[list[str], list[str]] | None:
    """The parameter and column types the server infers for ``sql`` (None if it
    returns no rows)."""
    pgconn = raw.pgconn
    name = b"pikku_routine_probe"
    from psycopg import pq

    result = pgconn.prepare(name, numbered(sql).encode())
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise DatabaseError((result.error_message or b"").decode(errors="replace"))
    try:
        described = pgconn.describe_prepared(name)
        params = [described.param_type(i) for i in range(described.nparams)]
        fields = [described.ftype(i) for i in range(described.nfields)]
    finally:
        pgconn.exec_(b"DEALLOCATE pikku_routine_probe")
    if not fields:
        return None
    oids = sorted(set(params + fields))
    with raw.cursor() as cursor:
        cursor.execute(
            "SELECT oid, format_type(oid, NULL) FROM pg_type WHERE oid = ANY(%s)", [oids]
        )
        names = {int(oid): str(name) for oid, name in cursor.fetchall()}
    return [names[o] for o in params], [names[o] for o in fields]


def _ddl(sql: str, params: list[str], columns: list[str]) -> str:
    args = ", ".join("text" if t == _UNKNOWN else t for t in params)
    out = ", ".join(f"c{i} {'text' if t == _UNKNOWN else t}" for i, t in enumerate(columns, 1))
    return (
        f"CREATE OR REPLACE FUNCTION {function_name(sql)}({args}) RETURNS TABLE ({out}) "
        f"LANGUAGE plpgsql VOLATILE AS $pikku$\n#variable_conflict use_column\n"
        f"BEGIN\nRETURN QUERY {numbered(sql)};\nEND\n$pikku$"
    )


def install(using: str) -> int:
    """Create (or replace) the functions of :data:`HOT` on ``using`` (PostgreSQL): how
    many there are. Those of statements an older version ran are left in place: its
    workers, still running during a deploy, call them until they stop."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return 0
    connection.ensure_connection()
    raw = connection.connection
    wanted = set()
    for name, sql in _hot_statements().items():
        try:
            with transaction.atomic(using=using):  # a failure leaves the caller's transaction be
                described = _described(raw, sql)
                if described is None:
                    continue
                with connection.cursor() as cursor:
                    cursor.execute(_ddl(sql, *described))
        except DatabaseError as exc:
            logger.warning("No function for statement %s (it runs as it is): %s", name, exc)
            continue
        wanted.add(function_name(sql))
    _calls.pop(using, None)
    return len(wanted)


def install_after_migrate(using: str = "default", **kwargs: Any) -> None:
    """``post_migrate``: the functions, on a PostgreSQL database that has the workflow
    tables. One that cannot be created (no CREATE on the schema, say) is left out with
    a warning: its statement runs as it is."""
    from pikku_django.models import WorkflowRun

    if connections[using].vendor != "postgresql" or not router.allow_migrate_model(
        using, WorkflowRun
    ):
        return
    try:
        install(using)
    except DatabaseError as exc:
        logger.warning("The store's functions were not created on %r: %s", using, exc)


#: Per alias: statement text to the call of its function, for those the database has.
_calls: dict[str, dict[str, str]] = {}
_lock = threading.Lock()


def _load(connection: Any) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, oidvectortypes(p.proargtypes) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE p.proname LIKE %s AND n.nspname = current_schema()",
            [PREFIX.replace("_", r"\_") + "%"],
        )
        installed = {str(name): str(types) for name, types in cursor.fetchall()}
    calls = {}
    for sql in _hot_statements().values():
        name = function_name(sql)
        if name not in installed:
            continue
        types = [t.strip() for t in installed[name].split(",")] if installed[name] else []
        casts = ", ".join(f"%s::{t}" for t in types)
        calls[sql] = f"SELECT * FROM {name}({casts})"
    return calls


def call_for(connection: Any, sql: str) -> str | None:
    """The call of ``sql``'s function on ``connection``, where its alias is behind a
    transaction pooler and its database has the function; else None."""
    alias = connection.alias
    if keeps_sessions(alias):
        return None
    calls = _calls.get(alias)
    if calls is None:
        with _lock:
            calls = _calls.get(alias)
            if calls is None:
                calls = _calls[alias] = _load(connection)
    return calls.get(sql)


def forget() -> None:
    """Look the functions up again on next use (tests, after a migration)."""
    _calls.clear()
