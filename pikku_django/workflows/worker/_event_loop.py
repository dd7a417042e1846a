"""A worker's event loop: claimed ``async def`` steps run on it, many at once.

One thread of the worker process runs an asyncio loop. A worker thread that
claims an async step hands it to the loop (waiting only while
``PIKKU["ASYNC_CONCURRENCY"]`` async steps are in flight) and goes back to
claiming. On the loop, each step's lease is renewed every half lease by a task
of its own, its function is awaited, and its outcome is settled, fenced by its
attempt, on a few database threads of the loop's own: the loop never waits on
the database, and a thousand steps awaiting I/O hold no thread each.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

from pikku_django.workflows import registry
from pikku_django.workflows._values import ClaimedStep, StepOutcome, Wake
from pikku_django.workflows.errors import StepFunctionNotFoundError
from pikku_django.workflows.logcontext import log_context, workflow_logger
from pikku_django.workflows.steps._current import calling
from pikku_django.workflows.steps._timeouts import renewal_ms
from pikku_django.workflows.steps.step_lease import (
    first_renewal_in,
    keep_step_lease,
    renewal_interval_s,
    warn_if_short,
)
from pikku_django.workflows.worker._connections import release_connections

logger = workflow_logger(__name__)

T = TypeVar("T")

#: Threads that do the loop's database work (attempt starts, settles, renewals).
DB_THREADS = 4


class StepSettler(Protocol):
    """What the loop needs of the engine's step execution: the attempt's start is
    announced, and what the function returned or raised is settled, fenced."""

    def attempt_started(self, claimed: ClaimedStep) -> tuple[Any, float]: ...

    def settle_call(
        self,
        claimed: ClaimedStep,
        wake: Wake,
        info: Any,
        began: float,
        *,
        value: Any = None,
        error: Exception | None = None,
    ) -> StepOutcome: ...


class AsyncStepEngine(Protocol):
    """What the loop needs of a WorkflowEngine."""

    @property
    def execution(self) -> StepSettler: ...

    def refresh_step_lease(
        self, step_id: int, lease_ms: int | None, attempt: int, token: int | None = None
    ) -> bool: ...


def is_async_step(claimed: ClaimedStep) -> bool:
    """Whether ``claimed`` calls a registered ``async def`` step function."""
    definition = registry.get_step(claimed.function)
    return definition is not None and definition.is_async


class AsyncSteps:
    """The event loop that runs one worker's async steps, at most ``limit`` at once.

    ``on_start(claimed)`` and ``on_done(claimed, outcome)`` are called as each
    step is taken in and once it has settled (from the loop's thread).
    """

    def __init__(
        self,
        engine: AsyncStepEngine,
        *,
        limit: int,
        on_start: Callable[[ClaimedStep], None],
        on_done: Callable[[ClaimedStep, StepOutcome], None],
        db_threads: int = DB_THREADS,
    ) -> None:
        if limit < 1:
            raise ValueError(f"ASYNC_CONCURRENCY must be at least 1, not {limit}")
        self.engine = engine
        self.limit = limit
        self._on_start = on_start
        self._on_done = on_done
        self._db_threads = db_threads
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    # -- lifecycle -------------------------------------------------------------------

    def in_flight(self) -> int:
        """How many async steps were handed over and have not settled yet."""
        with self._lock:
            return self._running

    def _start(self) -> asyncio.AbstractEventLoop:
        """The running loop, started on first use (a worker without async steps has none)."""
        with self._lock:
            if self._loop is not None:
                return self._loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._pool = ThreadPoolExecutor(self._db_threads, thread_name_prefix="pikku-aio-db")
            # Steps' own sync_to_async(thread_sensitive=False) calls use these threads
            # too, whose connections are closed with the loop.
            loop.set_default_executor(self._pool)
            self._thread = threading.Thread(target=run, name="pikku-worker-aio", daemon=True)
            self._thread.start()
            ready.wait()
            self._loop = loop
            return loop

    def close(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the steps in flight, then stop the loop and
        close its connections: whether every step had settled."""
        with self._idle:
            settled = self._idle.wait_for(lambda: self._running == 0, timeout)
        loop, thread, pool = self._loop, self._thread, self._pool
        if loop is None or thread is None or pool is None:
            return settled
        if not settled:
            logger.warning(
                "%d async steps were still running at shutdown; their leases lapse and "
                "another worker retries them",
                self.in_flight(),
            )
        with suppress(Exception):  # Django's async ORM thread keeps a connection otherwise
            asyncio.run_coroutine_threadsafe(sync_to_async(connections.close_all)(), loop).result(
                timeout=10
            )
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        _close_pool_connections(pool, self._db_threads)
        pool.shutdown(wait=False, cancel_futures=True)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = self._pool = None
        return settled

    # -- handing steps over ---------------------------------------------------------------

    def submit(self, claimed: ClaimedStep) -> None:
        """Run a claimed async step on the loop; blocks (the claim kept meanwhile) while
        ``limit`` async steps are in flight."""
        loop = self._start()
        warn_if_short(claimed)
        if not self._slots.acquire(blocking=False):
            with keep_step_lease(self.engine, claimed):
                self._slots.acquire()
        with self._lock:
            self._running += 1
        # The run is passed by whichever worker its settle wakes, not carried on here.
        claimed = replace(claimed, carried=None)
        try:
            self._on_start(claimed)
            asyncio.run_coroutine_threadsafe(self._run(claimed), loop)
        except BaseException:
            self._finished(claimed, StepOutcome.FAILED)
            raise

    def _finished(self, claimed: ClaimedStep, outcome: StepOutcome) -> None:
        self._slots.release()
        with self._idle:
            self._running -= 1
            self._idle.notify_all()
        try:
            self._on_done(claimed, outcome)
        except Exception:
            logger.exception("Counting the end of async step %s failed", claimed.name)

    # -- on the loop ----------------------------------------------------------------------

    async def _run(self, claimed: ClaimedStep) -> None:
        outcome = StepOutcome.FAILED
        fields = {"run_id": str(claimed.run_id), "step": claimed.name, "attempt": claimed.attempt}
        try:
            with log_context(**fields):
                renewal = asyncio.create_task(self._keep_lease(claimed))
                try:
                    outcome = await self._execute(claimed)
                finally:
                    renewal.cancel()
                    with suppress(asyncio.CancelledError):
                        await renewal
        except Exception:
            logger.exception(
                "Async step %s attempt %d could not be settled: its claim lapses and "
                "another attempt follows",
                claimed.name,
                claimed.attempt,
            )
        finally:
            self._finished(claimed, outcome)

    async def _execute(self, claimed: ClaimedStep) -> StepOutcome:
        definition = registry.get_step(claimed.function)
        execution = self.engine.execution
        info, began = await self._db(execution.attempt_started, claimed)
        value: Any = None
        error: Exception | None = None
        try:
            if definition is None:
                raise StepFunctionNotFoundError(claimed.function)
            if claimed.transactional:
                registry.check_not_async_transactional(definition.fn, f"Step {claimed.name!r}")
            with calling(claimed):
                value = await registry.acall_step_function(definition.fn, claimed.input)
        except Exception as exc:
            error = exc
        # Its run is woken for any worker: the loop does not pass runs.
        return await self._db(
            lambda: execution.settle_call(claimed, Wake.NOW, info, began, value=value, error=error)
        )

    async def _keep_lease(self, claimed: ClaimedStep) -> None:
        """Renew the claim every half lease until cancelled, or until a renewal finds
        that a newer attempt replaced this one (its settle will then be refused)."""
        await asyncio.sleep(first_renewal_in(claimed))
        interval = renewal_interval_s(claimed.lease_ms)
        while True:
            lease_ms = renewal_ms(claimed)
            if lease_ms is None:
                return  # past its timeout: the lease lapses at the deadline
            try:
                held = await self._db(
                    self.engine.refresh_step_lease,
                    claimed.step_id,
                    lease_ms,
                    claimed.attempt,
                    claimed.claim_token,
                )
            except Exception:
                logger.warning(
                    "Renewing the lease of step %s failed; will retry", claimed.name, exc_info=True
                )
            else:
                if not held:
                    logger.warning(
                        "Step %s attempt %d was claimed by a newer attempt; its outcome "
                        "will not be recorded",
                        claimed.name,
                        claimed.attempt,
                    )
                    return
            await asyncio.sleep(interval)

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on one of the loop's database threads, in this task's log context."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        return await loop.run_in_executor(self._pool, context.run, _on_db_thread, fn, args)


def _on_db_thread(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    try:
        return fn(*args)
    finally:
        release_connections()


def _close_pool_connections(pool: ThreadPoolExecutor, threads: int) -> None:
    """Close the connections of each of the pool's threads (one task per thread)."""
    barrier = threading.Barrier(threads, timeout=10)

    def close() -> None:
        connections.close_all()
        with suppress(threading.BrokenBarrierError):
            barrier.wait()

    futures = [pool.submit(close) for _ in range(threads)]
    for future in futures:
        with suppress(Exception):
            future.result(timeout=15)
