"""Durations given as seconds, a timedelta, or text such as "5min" or "1h30m"."""

from __future__ import annotations

import contextlib
import math
import re
from datetime import timedelta

_UNITS = {
    "ms": 0.001,
    "msec": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 604800.0,
    "week": 604800.0,
    "weeks": 604800.0,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")

Duration = float | int | timedelta | str


def parse_duration(value: object, *, what: str = "duration") -> float:
    """``value`` in seconds; ValueError naming ``what`` if it is not a duration >= 0."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be seconds, a timedelta or text like '5min', not a bool")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value, what)
    else:
        raise ValueError(
            f"{what} must be seconds, a timedelta or text like '5min', not {type(value).__name__}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be a finite duration of 0 or more, not {value!r}")
    return seconds


def _parse_text(text: str, what: str) -> float:
    s = text.strip().lower()
    if not s:
        raise ValueError(f"{what} is empty")
    with contextlib.suppress(ValueError):
        return float(s)  # plain seconds
    total = 0.0
    pos = 0
    while pos < len(s):
        match = _PART.match(s, pos)
        if match is None or match.group(2) not in _UNITS:
            raise ValueError(
                f"{what} {text!r} is not a duration: use e.g. '30s', '5min', '2h', '1h30m', '1d'"
            )
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return total
