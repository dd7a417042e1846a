"""The chaos test's workflow: steps alternately transactional and plain.

Every execution of a step function records itself at its start in
``ChaosExecution`` through a connection of its own in autocommit (neither a
rollback nor a SIGKILL loses it), under a fresh nonce that the step also returns;
a transactional step writes one ``ChaosEffect`` row inside its transaction.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

from django.db import connections
from django.utils import timezone

from pikku_django.workflows import WorkflowContext, step, workflow

#: A step whose worker is killed again and again must not run out of attempts.
RETRIES = 50

_local = threading.local()


def log_execution(alias: str, row: list[Any]) -> None:
    """Insert ``row`` into ChaosExecution on this thread's own autocommit connection."""
    from tests.chaosapp.models import ChaosExecution

    sql = (
        f"INSERT INTO {ChaosExecution._meta.db_table} "
        "(run_id, step, nonce, pid, thread, started_at) VALUES (%s, %s, %s, %s, %s, %s)"
    )
    conns = getattr(_local, "connections", None)
    if conns is None:
        conns = _local.connections = {}
    for attempt in range(2):
        conn = conns.get(alias)
        if conn is None:
            template = connections[alias]
            conn = conns[alias] = type(template)(template.settings_dict, alias)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, row)
            return
        except Exception:
            conn.close()
            conns.pop(alias, None)
            if attempt:
                raise


def _chaos(data: dict[str, Any], *, transactional: bool) -> dict[str, Any]:
    from tests.chaosapp.models import ChaosEffect

    nonce = uuid.uuid4().hex
    pid, thread = os.getpid(), threading.get_ident()
    log_execution(data["db"], [data["run"], data["step"], nonce, pid, thread, timezone.now()])
    if transactional:
        # Inside the step's transaction: commits with the fenced result, or not at all.
        ChaosEffect.objects.using(data["db"]).create(
            run_id=data["run"], step=data["step"], nonce=nonce, pid=pid
        )
    time.sleep(data["ms"] / 1000)
    return {"pid": pid, "thread": thread, "nonce": nonce}


@step(name="chaosapp.tx", retries=RETRIES, retry_delay=0.1, transactional=True)
def chaos_tx(data: dict[str, Any]) -> dict[str, Any]:
    return _chaos(data, transactional=True)


@step(name="chaosapp.plain", retries=RETRIES, retry_delay=0.1)
def chaos_plain(data: dict[str, Any]) -> dict[str, Any]:
    return _chaos(data, transactional=False)


def chaos_function(index: int) -> str:
    """Even steps are transactional, odd ones plain."""
    return "chaosapp.tx" if index % 2 == 0 else "chaosapp.plain"


@workflow(name="chaosapp.chaos")
def chaos(ctx: WorkflowContext, input: dict[str, Any]) -> list[Any]:
    out = []
    for i, ms in enumerate(input["ms"]):
        name = f"s{i}"
        data = {"db": input["db"], "run": str(ctx.run_id), "step": name, "ms": ms}
        out.append(ctx.do(name, chaos_function(i), data))
    return out
