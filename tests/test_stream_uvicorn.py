"""The status stream under uvicorn: 50 clients follow their runs at once, and the
server process does not hold a thread per client; each client gets its run's end."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connections

from pikku_django.workflows import WorkflowEngine
from tests.conftest import database_alias, on_databases

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = 50


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(alias: str, port: int) -> subprocess.Popen[str]:
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.asgi_settings",
        "PIKKU_TEST_ALIAS": alias,
        "PIKKU_TEST_DB_NAME": str(connections[alias].settings_dict["NAME"]),
        "PIKKU_TEST_DEFAULT_NAME": str(connections["default"].settings_dict["NAME"]),
    }
    args = ["tests.asgi:application", "--port", str(port), "--lifespan", "off"]
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "uvicorn", *args, "--log-level", "warning"],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


async def open_stream(port: int, run_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /pikku/runs/{run_id}/stream HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def read_until(reader: asyncio.StreamReader, marker: bytes, timeout: float) -> bytes:
    return await asyncio.wait_for(reader.readuntil(marker), timeout)


async def wait_until_up(port: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"uvicorn exited: {proc.communicate()[0]}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return
    pytest.fail(f"uvicorn did not listen on {port} within {timeout}s")


@on_databases("postgres")
def test_fifty_streams_under_uvicorn_hold_no_thread_each(vendor: str) -> None:
    alias = database_alias(vendor)
    engine = WorkflowEngine(alias)
    # No worker runs: each run stays running with nothing to stream but its init.
    runs = [
        str(engine.start("testapp.async_naps", {"n": n, "seconds": 0}).id) for n in range(CLIENTS)
    ]
    port = free_port()
    server = serve(alias, port)
    try:
        counts = asyncio.run(_follow(port, server, runs, engine))
    finally:
        server.terminate()
        try:
            out = server.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            out = server.communicate()[0]
    before, during = counts
    print(f"uvicorn threads: {before} before, {during} with {CLIENTS} streams open")
    # A thread per client would add 50; the loop's shared pool and one LISTEN add a few.
    assert during - before < 15, (before, during, out)


def cancel_all(engine: WorkflowEngine, runs: list[str]) -> None:
    try:
        for run in runs:
            engine.cancel(run)
    finally:
        connections.close_all()


async def _follow(
    port: int, server: subprocess.Popen[str], runs: list[str], engine: WorkflowEngine
) -> tuple[int, int]:
    await wait_until_up(port, server)
    # One stream first, to its init frame and closed: the server's pools are warm.
    reader, writer = await open_stream(port, runs[0])
    await read_until(reader, b"event: init", 30)
    writer.close()
    await asyncio.sleep(1.0)
    before = threads_of(server.pid)
    streams = await asyncio.gather(*(open_stream(port, run) for run in runs))
    for reader, _ in streams:
        head = await read_until(reader, b"event: init", 60)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        await read_until(reader, b"\n\n", 30)  # the rest of the init frame
    during = 0
    for _ in range(5):
        await asyncio.sleep(0.2)
        during = max(during, threads_of(server.pid))
    # Every run ends; each client is told, woken by the notification.
    await asyncio.to_thread(cancel_all, engine, runs)
    for reader, writer in streams:
        await read_until(reader, b"event: done", 60)
        writer.close()
    return before, during
