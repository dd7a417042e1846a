"""Django's tasks framework: ``django.tasks`` on Django 6.0+, else the ``django-tasks`` backport.

Everything the backend needs from the framework is imported here, once, so the rest
of the package is the same on both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import django
from django.core.exceptions import ImproperlyConfigured

#: Where the framework was found: "django.tasks" or "django_tasks".
FRAMEWORK: str

if TYPE_CHECKING or django.VERSION >= (6, 0):
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
else:
    try:
        import django_tasks  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on what is installed
        raise ImproperlyConfigured(
            f"pikku_django.tasks needs Django 6.0+ (django.tasks) or, on Django "
            f"{django.get_version()}, the django-tasks backport: "
            f"pip install 'pikku-django[tasks]'"
        ) from exc
    from django_tasks import DEFAULT_TASK_QUEUE_NAME, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus, task
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    FRAMEWORK = "django_tasks"


__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
