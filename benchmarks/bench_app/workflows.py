"""The workflows of ``benchmarks/throughput.py`` and ``benchmarks/chaos.py``.

Throughput: ``bench.queued`` makes ``steps`` no-op steps that workers claim one
by one; ``bench.inline`` makes the same steps run inline, in the orchestration
pass.

Memory: ``bench.payload`` makes ``steps`` steps, all queued but every tenth
(inline), each given ``payload`` (a string, 1 KB in the benchmark) and returning
it, so every step's input and result is stored and read back.

Chaos: ``bench.chaos`` makes one step per entry of ``ms`` (alternately
transactional and plain), each working for that many milliseconds. Every
execution of a chaos step function is recorded at its start in
``ChaosExecution`` through a connection of its own in autocommit (so neither a
rollback nor a SIGKILL loses it), under a fresh nonce that the step also
returns; a transactional step writes one ``ChaosEffect`` row inside its
transaction. ``benchmarks/chaos.py`` checks the rows afterwards.
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

#: Chaos steps keep being retried: a step whose worker is killed again and again
#: must not run out of attempts (each lapsed lease spends one).
CHAOS_RETRIES = 50


@step(name="bench.noop")
def noop() -> None:
    return None


def _inline_noop() -> None:
    return None


@workflow(name="bench.queued")
def queued(ctx: WorkflowContext, input: dict[str, Any]) -> int:
    for i in range(input["steps"]):
        ctx.do(f"s{i}", noop)
    return input["steps"]


@workflow(name="bench.inline")
def inline(ctx: WorkflowContext, input: dict[str, Any]) -> int:
    for i in range(input["steps"]):
        ctx.do(f"s{i}", _inline_noop)
    return input["steps"]


@step(name="bench.echo")
def echo(payload: str) -> str:
    return payload


def _inline_echo(payload: str) -> str:
    return payload


@workflow(name="bench.payload")
def payload(ctx: WorkflowContext, input: dict[str, Any]) -> int:
    for i in range(input["steps"]):
        if i % 10 == 9:
            ctx.do(f"s{i}", _inline_echo, input["payload"])
        else:
            ctx.do(f"s{i}", echo, input["payload"])
    return input["steps"]


# -- chaos ---------------------------------------------------------------------------------

_local = threading.local()


def _log_cursor_execute(alias: str, sql: str, params: list[Any]) -> None:
    """Run ``sql`` on this thread's own autocommit connection to ``alias``."""
    conn = getattr(_local, "log_connection", None)
    for attempt in range(2):
        if conn is None:
            template = connections[alias]
            conn = type(template)(template.settings_dict, alias)
            _local.log_connection = conn
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
            return
        except Exception:
            conn.close()
            conn = _local.log_connection = None
            if attempt:
                raise


def _chaos(data: dict[str, Any], *, transactional: bool) -> dict[str, Any]:
    from bench_app.models import ChaosEffect, ChaosExecution

    nonce = uuid.uuid4().hex
    pid, thread = os.getpid(), threading.get_ident()
    _log_cursor_execute(
        data["db"],
        f"INSERT INTO {ChaosExecution._meta.db_table} "
        "(run_id, step, nonce, pid, thread, started_at) VALUES (%s, %s, %s, %s, %s, %s)",
        [data["run"], data["step"], nonce, pid, thread, timezone.now()],
    )
    if transactional:
        # Inside the step's transaction: commits with the fenced result, or not at all.
        ChaosEffect.objects.using(data["db"]).create(
            run_id=data["run"], step=data["step"], nonce=nonce, pid=pid
        )
    time.sleep(data["ms"] / 1000)
    return {"pid": pid, "thread": thread, "nonce": nonce}


@step(name="bench.chaos_tx", retries=CHAOS_RETRIES, retry_delay=0.1, transactional=True)
def chaos_tx(data: dict[str, Any]) -> dict[str, Any]:
    return _chaos(data, transactional=True)


@step(name="bench.chaos_plain", retries=CHAOS_RETRIES, retry_delay=0.1)
def chaos_plain(data: dict[str, Any]) -> dict[str, Any]:
    return _chaos(data, transactional=False)


def chaos_function(index: int) -> str:
    """Even steps are transactional, odd ones plain."""
    return "bench.chaos_tx" if index % 2 == 0 else "bench.chaos_plain"


@workflow(name="bench.chaos")
def chaos(ctx: WorkflowContext, input: dict[str, Any]) -> list[Any]:
    out = []
    for i, ms in enumerate(input["ms"]):
        name = f"s{i}"
        out.append(
            ctx.do(
                name,
                chaos_function(i),
                {"db": input["db"], "run": str(ctx.run_id), "step": name, "ms": ms},
            )
        )
    return out
