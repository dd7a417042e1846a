"""Workflow version ids: declared, or made from the workflow function's code."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

#: The longest version a run records.
VERSION_MAX = 64

#: The prefix of a step that records a ``ctx.patched`` change id.
PATCH_PREFIX = "patch:"


def check_version(value: object, what: str) -> str:
    """``value`` as a version: a str of 1 to 64 characters."""
    if not isinstance(value, str) or not value.strip() or len(value) > VERSION_MAX:
        raise ImproperlyConfigured(
            f"workflow {what}= takes str versions of 1 to {VERSION_MAX} characters, not {value!r}"
        )
    return value


def code_version(fn: Callable[..., Any]) -> str:
    """A version made from the function's code: its source (or its bytecode)."""
    try:
        text = inspect.getsource(fn).encode()
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        text = code.co_code + repr(code.co_consts).encode() if code is not None else b""
        text = text or repr(fn).encode()
    return "code-" + hashlib.sha256(text).hexdigest()[:16]
