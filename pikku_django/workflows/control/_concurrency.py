"""Per-key concurrency: the run options that make runs sharing a key take turns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The longest concurrency key (the column's length).
KEY_MAX_LENGTH = 255
#: The largest per-key limit.
LIMIT_MAX = 10_000

#: A workflow's default key: text, or a function of the run's input that returns
#: the key (or None: that run has no key).
KeyDefault = str | Callable[[Any], str | None]


def check_concurrency_key(key: object) -> str:
    """``key`` if it is a str of 1 to 255 characters; TypeError or ValueError if not."""
    if not isinstance(key, str):
        raise TypeError(
            f"concurrency_key must be a str (e.g. a customer id), not {type(key).__name__}"
        )
    if not 0 < len(key) <= KEY_MAX_LENGTH:
        raise ValueError(
            f"concurrency_key must be 1 to {KEY_MAX_LENGTH} characters, not {len(key)}"
        )
    return key


def check_concurrency_limit(limit: object) -> int:
    """``limit`` if it is an int from 1 to 10 000; TypeError or ValueError if not."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"concurrency_limit must be an int from 1 to {LIMIT_MAX}, not {limit!r}")
    if not 1 <= limit <= LIMIT_MAX:
        raise ValueError(
            f"concurrency_limit must be from 1 to {LIMIT_MAX} (runs of one key at a time), "
            f"not {limit}"
        )
    return limit


def check_key_default(key: object) -> KeyDefault:
    """A workflow's ``concurrency_key=``: a key, or a function of the input."""
    if callable(key):
        return key
    return check_concurrency_key(key)


def key_for(default: KeyDefault | None, input: Any) -> str | None:
    """The key a run of ``input`` gets from its workflow's default (None: no key)."""
    if default is None:
        return None
    if isinstance(default, str):
        return default
    key = default(input)
    return None if key is None else check_concurrency_key(key)
