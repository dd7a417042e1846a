"""Every log record of the engine and the worker names the run, step and attempt it is about."""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_context: ContextVar[dict[str, Any] | None] = ContextVar("pikku_log_context", default=None)

FIELDS = ("run_id", "step", "attempt")


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Within the block, records carry these fields (``run_id``, ``step``, ``attempt``)."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class WorkflowLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds ``run_id``, ``step`` and ``attempt`` to each record (as attributes, for
    formatters and filters) and to its message."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        current = _context.get() or {}
        extra = dict(kwargs.get("extra") or {})
        for name in FIELDS:
            extra.setdefault(name, current.get(name))
        kwargs["extra"] = extra
        tags = " ".join(f"{name}={current[name]}" for name in FIELDS if current.get(name))
        return (f"[{tags}] {msg}" if tags else msg), kwargs


def workflow_logger(name: str) -> WorkflowLogger:
    return WorkflowLogger(logging.getLogger(name), {})
