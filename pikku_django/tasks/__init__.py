"""A durable backend for Django's tasks framework (``django.tasks``, or the ``django-tasks``
backport on Django 5.2): every enqueue is a workflow run that ``pikku_worker`` runs.

    TASKS = {"default": {"BACKEND": "pikku_django.tasks.PikkuBackend"}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pikku_django.tasks.backend import PikkuBackend, PikkuTask
    from pikku_django.tasks.runner import TaskExitedError

__all__ = ["PikkuBackend", "PikkuTask", "TaskExitedError"]


def __getattr__(name: str) -> Any:
    # The framework is imported on first use, so projects without it can install
    # pikku_django (and its registered task step) all the same.
    if name in ("PikkuBackend", "PikkuTask"):
        from pikku_django.tasks import backend

        return getattr(backend, name)
    if name == "TaskExitedError":
        from pikku_django.tasks.runner import TaskExitedError

        return TaskExitedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
