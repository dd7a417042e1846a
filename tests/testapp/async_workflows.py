"""Async steps for the worker-process tests (tests/test_async_worker.py)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pikku_django.workflows import WorkflowContext, step, workflow


def _note(path: str, line: str) -> int:
    """Append ``line`` to the file at ``path``: how many lines it has now."""
    with Path(path).open("a") as f:
        f.write(line + "\n")
    return len(Path(path).read_text().splitlines())


@step(name="testapp.async_nap")
async def async_nap(data: dict[str, Any]) -> dict[str, Any]:
    """Awaits ``seconds`` of sleep, as I/O-bound work would."""
    await asyncio.sleep(data["seconds"])
    return {"n": data["n"], "pid": os.getpid()}


@workflow(name="testapp.async_naps")
def async_naps(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("nap", "testapp.async_nap", input)


@step(name="testapp.async_gather", retries=0)
async def async_gather(data: dict[str, Any]) -> dict[str, Any]:
    """Notes its start in the folder ``dir``, then awaits until ``together`` steps
    have (so that many await at once); fails if they have not within ``patience``."""
    folder = Path(data["dir"])
    (folder / str(data["n"])).touch()
    loop = asyncio.get_running_loop()
    give_up = loop.time() + data.get("patience", 60)
    while (seen := len(list(folder.iterdir()))) < data["together"]:
        if loop.time() > give_up:
            raise RuntimeError(f"{seen} of {data['together']} steps awaited together")
        await asyncio.sleep(0.05)
    return {"n": data["n"], "pid": os.getpid(), "seen": seen}


@workflow(name="testapp.async_gathers")
def async_gathers(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("gather", "testapp.async_gather", input)


@step(name="testapp.async_block_first", retries=3)
async def async_block_first(data: dict[str, Any]) -> dict[str, Any]:
    """Every attempt notes its start; the first then awaits for a long time, later
    ones finish (and note that) at once."""
    calls = _note(data["calls"], f"start {os.getpid()}")
    if calls == 1:
        await asyncio.sleep(data.get("block", 300))
    _note(data["done"], f"done {os.getpid()}")
    return {"pid": os.getpid(), "calls": calls}


@step(name="testapp.async_flaky", retries=3, retry_delay=0)
async def async_flaky(data: dict[str, Any]) -> dict[str, Any]:
    """Raises on the first ``fail`` attempts, then answers how many it took."""
    calls = _note(data["calls"], "call")
    await asyncio.sleep(0)
    if calls <= data["fail"]:
        raise RuntimeError(f"attempt {calls} fails")
    return {"calls": calls}


@workflow(name="testapp.async_step")
def async_step(ctx: WorkflowContext, input: dict[str, Any]) -> Any:
    return ctx.do("work", input["step"], input)
