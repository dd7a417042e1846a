"""Task functions of the django.tasks backend tests (module level, as tasks must be).

Each records what it saw in the database of its run (``Effect`` rows), so a test can
tell how often, and on which attempt, it ran.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pikku_django.tasks import compat
from pikku_django.tasks.compat import task
from tests.testapp.markers import mark_started


@task()
def add(a: int, b: int = 0) -> int:
    return a + b


@task
def noop(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def add_async(a: int, b: int = 0) -> int:
    return a + b


@task(queue_name="emails")
def send_email(to: str) -> str:
    return f"sent to {to}"


@task()
def fail(message: str = "it failed") -> None:
    raise ValueError(message)


@task(retries=0)
def fail_once_only() -> None:
    raise ValueError("no second attempt")


@task(retries=3, retry_delay="2s", backoff="exponential")
def with_own_policy() -> None:
    return None


@task(takes_context=True)
def attempt_of(context: compat.TaskContext, fail_first: bool = False) -> dict[str, Any]:
    """Fails its first attempt when asked; returns the attempt and what context says."""
    if fail_first and context.attempt == 1:
        raise RuntimeError("first attempt fails")
    status = type(context.task_result).__module__  # the framework in use
    return {
        "attempt": context.attempt,
        "id": context.task_result.id,
        "status": str(context.task_result.status),
        "framework": status,
    }


@task(takes_context=True)
def status_seen_inside(context: compat.TaskContext) -> str:
    """The status that get_result() reads while this task runs."""
    return str(context.task_result.task.get_result(context.task_result.id).status)


@task()
def not_json() -> Any:
    return lambda: True


@task()
def exits() -> None:
    raise SystemExit(3)


@task(takes_context=True, transactional=True)
def record(context: compat.TaskContext, alias: str, tag: str) -> int:
    """Writes one Effect row on ``alias`` and fails its first attempt after the write;
    returns how many rows ``tag`` has."""
    from tests.testapp.models import Effect

    Effect.objects.using(alias).create(run_id=tag, step="task", attempt_pid=os.getpid())
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails after its write")
    return Effect.objects.using(alias).filter(run_id=tag).count()


@task()
def block_until_killed(started: str, alias: str, tag: str) -> int:
    """Attempt 1 writes its pid to ``started`` and waits to be killed; others finish."""
    from tests.testapp.models import Effect

    path = Path(started)
    Effect.objects.using(alias).create(run_id=tag, step="attempt", attempt_pid=os.getpid())
    if not path.exists():
        mark_started(path)
        time.sleep(300)
    return os.getpid()


@task()
async def where_awaited(seconds: float = 0) -> dict[str, Any]:
    """Awaits ``seconds``; answers the thread and process it was awaited in."""
    import asyncio
    import threading

    await asyncio.sleep(seconds)
    return {"thread": threading.current_thread().name, "pid": os.getpid()}


async def not_yet_a_task() -> None:
    """Made a task by tests/test_tasks_async.py, with options the backend refuses."""
