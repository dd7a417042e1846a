"""Every log record of the engine and the worker names the workflow, run, step and
attempt it is about."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_context: ContextVar[dict[str, Any] | None] = ContextVar("pikku_log_context", default=None)

FIELDS = ("workflow", "run_id", "step", "attempt")


class Lazy:
    """A value worked out the first time a record shows it (e.g. a run's workflow name,
    read from the database only when something is logged)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make: Callable[[], Any] | None = make
        self._value: Any = None

    def __str__(self) -> str:
        if self._make is not None:
            make, self._make = self._make, None
            try:
                self._value = make()
            except Exception:
                self._value = "?"
        return str(self._value)


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Within the block, records carry these fields (``workflow``, ``run_id``, ``step``,
    ``attempt``)."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class WorkflowLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds ``workflow``, ``run_id``, ``step`` and ``attempt`` to each record (as
    attributes, for formatters and filters) and to its message; ``pikku_msg`` keeps
    the message without them (for :class:`pikku_django.logging.JsonFormatter`)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        current = _context.get() or {}
        extra = dict(kwargs.get("extra") or {})
        for name in FIELDS:
            value = current.get(name)
            extra.setdefault(name, str(value) if isinstance(value, Lazy) else value)
        extra.setdefault("pikku_msg", msg)
        kwargs["extra"] = extra
        tags = " ".join(f"{name}={extra[name]}" for name in FIELDS if extra.get(name))
        return (f"[{tags}] {msg}" if tags else msg), kwargs


def workflow_logger(name: str) -> WorkflowLogger:
    return WorkflowLogger(logging.getLogger(name), {})
