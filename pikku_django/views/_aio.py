"""What lets a stream under ASGI wait without a thread: a notification wakes an asyncio
event, snapshots are read on the loop's shared pool, and the request's own thread goes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from asgiref.sync import SyncToAsync, sync_to_async
from django.db import close_old_connections

from pikku_django.workflows.runs.status import RunSnapshot, notifications, snapshot

logger = logging.getLogger(__name__)


def release_request_thread() -> None:
    """Let the thread the request's sync middleware ran on go while its stream runs.

    Django gives each ASGI request a thread of its own for its sync code (and keeps
    it to the end of the response); a stream has no sync code left once it is
    streaming, so that idle thread would be held per client. A later sync call of
    the request gets a new one, as its first did.
    """
    context = SyncToAsync.thread_sensitive_context.get(None)
    if context is None:
        return
    executor: Any = SyncToAsync.context_to_thread_executor.pop(context, None)
    if executor is not None:
        executor.shutdown(wait=False)


def _read(run_id: uuid.UUID | str, using: str) -> RunSnapshot | None:
    try:
        return snapshot(run_id, using)
    finally:
        close_old_connections()


#: A snapshot read on the event loop's shared pool of threads, not a thread per client.
read_snapshot = sync_to_async(_read, thread_sensitive=False)


class ChangeWaiter:
    """Waits, on the event loop, for the next change announced on ``using`` (where it
    can be listened to, :mod:`pikku_django.wakeups`) or a timeout; no thread waits for it."""

    def __init__(self, using: str) -> None:
        self._event = asyncio.Event()
        loop = asyncio.get_running_loop()

        def notified() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
                loop.call_soon_threadsafe(self._event.set)

        self._unsubscribe = notifications(using).subscribe(notified)

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        self._event.clear()

    def close(self) -> None:
        self._unsubscribe()
