"""Log formats for pikku_django's loggers, and the set-up ``pikku_worker`` does.

:class:`JsonFormatter` writes one JSON object a line, with the run, workflow, step
and attempt of the record as keys of their own. Use it from ``LOGGING``::

    LOGGING = {
        "version": 1,
        "formatters": {"json": {"()": "pikku_django.logging.JsonFormatter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
        "loggers": {"pikku_django": {"handlers": ["console"], "level": "INFO"}},
    }

or run ``manage.py pikku_worker --log-format json``.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from pikku_django.workflows.logcontext import FIELDS

#: The logger every pikku_django module logs under.
ROOT_LOGGER = "pikku_django"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogFormat(enum.StrEnum):
    """The formats ``pikku_worker --log-format`` offers."""

    TEXT = "text"
    JSON = "json"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC, ISO 8601), level, logger, message, the
    record's ``workflow``, ``run_id``, ``step`` and ``attempt`` when it has them, and
    ``exception`` (type, message, traceback) for a record logged with one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": plain_message(record),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value if isinstance(value, int | float) else str(value)
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = {
                "type": record.exc_info[0].__name__,
                "message": str(record.exc_info[1]),
                "traceback": self.formatException(record.exc_info),
            }
        return json.dumps(entry, default=str)


def plain_message(record: logging.LogRecord) -> str:
    """The record's message without the ``[workflow=... run_id=...]`` tags."""
    template = getattr(record, "pikku_msg", None)
    if template is None:
        return record.getMessage()
    try:
        return str(template) % record.args if record.args else str(template)
    except (TypeError, ValueError, KeyError):
        return record.getMessage()


def formatter_for(log_format: LogFormat) -> logging.Formatter:
    if log_format is LogFormat.JSON:
        return JsonFormatter()
    return logging.Formatter(TEXT_FORMAT)


def level_for(verbosity: int) -> int:
    """The level of Django's ``-v``: 0 warnings, 1 information, 2 and 3 debug."""
    return {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)


def configure_worker_logging(
    verbosity: int = 1, log_format: LogFormat | None = None, *, name: str = ROOT_LOGGER
) -> None:
    """Make pikku_django's records visible on stderr unless the project's ``LOGGING``
    already handles them, at the level ``verbosity`` asks for.

    A ``log_format`` given is set on the handlers the project gave the logger; when only
    the root logger's handlers would show the records, the logger gets its own instead. ``name``
    is the logger to set up (pikku_django's own).
    """
    logger = logging.getLogger(name)
    if verbosity != 1 or logger.level == logging.NOTSET:
        logger.setLevel(level_for(verbosity))
    if logger.handlers:
        if log_format is not None:
            for configured in logger.handlers:
                configured.setFormatter(formatter_for(log_format))
        return
    if logger.propagate and logging.getLogger().handlers and log_format is None:
        return  # the project's root handlers show the records
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter_for(log_format or LogFormat.TEXT))
    logger.addHandler(handler)
    logger.propagate = False  # shown once, here


__all__ = ["JsonFormatter", "LogFormat", "configure_worker_logging", "level_for"]
