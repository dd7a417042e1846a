"""System checks for each ``TASKS`` entry whose backend is ``PikkuBackend``."""

from __future__ import annotations

from typing import Any

import django
from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from pikku_django.tasks.options import RetryPolicy

BACKEND_PATH = "pikku_django.tasks.PikkuBackend"
#: The longest queue name a step can hold (WorkflowStep.queue).
MAX_QUEUE = 100


def framework_missing() -> str | None:
    """Why neither django.tasks nor the backport can be imported, or None."""
    if django.VERSION >= (6, 0):
        return None
    try:
        import django_tasks  # noqa: F401
    except ImportError:
        return (
            f"Django {django.get_version()} has no django.tasks and the django-tasks backport "
            f"is not installed"
        )
    return None


def _is_pikku_backend(path: object) -> bool:
    if path == BACKEND_PATH:
        return True
    if not isinstance(path, str) or framework_missing():
        return False
    try:
        from pikku_django.tasks.backend import PikkuBackend

        found = import_string(path)
    except ImportError:
        return False  # the framework's own check reports a backend it cannot import
    return isinstance(found, type) and issubclass(found, PikkuBackend)


def pikku_task_backends() -> dict[str, dict[str, Any]]:
    """The ``TASKS`` entries that use PikkuBackend (or a subclass), by alias."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return {}
    return {
        alias: params
        for alias, params in configured.items()
        if isinstance(params, dict) and _is_pikku_backend(params.get("BACKEND"))
    }


@checks.register(checks.Tags.compatibility)
def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each PikkuBackend entry: the framework importable, QUEUES and OPTIONS well formed."""
    messages: list[checks.CheckMessage] = []
    for alias, params in pikku_task_backends().items():
        missing = framework_missing()
        if missing:
            messages.append(
                checks.Error(
                    f"TASKS[{alias!r}] uses {BACKEND_PATH}, but {missing}.",
                    hint="pip install 'pikku-django[tasks]' (or move to Django 6.0+).",
                    id="pikku_django.tasks.E001",
                )
            )
        messages += _check_queues(alias, params.get("QUEUES"))
        try:
            RetryPolicy.parse(params.get("OPTIONS", {}), f"TASKS[{alias!r}]['OPTIONS']")
        except ValueError as exc:
            messages.append(
                checks.Error(
                    f"{exc}.",
                    hint="OPTIONS takes retries (int >= 0), retry_delay (seconds, a timedelta "
                    "or text like '30s'), backoff ('fixed' or 'exponential') and "
                    "transactional (bool).",
                    id="pikku_django.tasks.E002",
                )
            )
    return messages


def _check_queues(alias: str, queues: object) -> list[checks.CheckMessage]:
    if queues is None:
        return []
    bad = not isinstance(queues, list | tuple | set | frozenset) or not all(
        isinstance(q, str) and 0 < len(q) <= MAX_QUEUE for q in queues
    )
    if bad:
        return [
            checks.Error(
                f"TASKS[{alias!r}]['QUEUES'] must be a list of queue names (non-empty str of "
                f"at most {MAX_QUEUE} characters), not {queues!r}.",
                hint="Each name is a pikku_worker queue: pikku_worker --queue NAME serves it.",
                id="pikku_django.tasks.E003",
            )
        ]
    if not queues:
        return [
            checks.Warning(
                f"TASKS[{alias!r}]['QUEUES'] is empty, so tasks may name any queue.",
                hint="List the queues your pikku_worker processes serve, so a task naming "
                "another is refused when it is declared.",
                id="pikku_django.tasks.W001",
            )
        ]
    return []
