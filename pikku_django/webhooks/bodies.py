"""Reading a webhook body as JSON within bounds.

Any body a signed sender can send is either parsed or refused with a
:class:`BodyLimitError` (a ``ValueError``, answered 400) that says which bound it
broke: at most ``PIKKU["WEBHOOK_MAX_BODY"]`` bytes of JSON text, nested at most
:data:`MAX_JSON_DEPTH` arrays and objects deep. The depth is measured before
parsing, so a deep body never reaches the parser or the database.
"""

from __future__ import annotations

import json
import logging
from array import array
from itertools import accumulate
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from pikku_django.conf import pikku_settings

__all__ = [
    "ASGI_SCOPE_KEY",
    "MAX_JSON_DEPTH",
    "BodyLimitError",
    "check_json_text",
    "json_depth",
    "loads",
    "note_unbounded_asgi",
]

logger = logging.getLogger(__name__)

#: The deepest JSON a webhook body may nest: what every database stores, as MariaDB
#: takes JSON 31 levels deep and the run's input wraps the data in up to two more.
MAX_JSON_DEPTH = 29


#: Set in the ASGI scope by :class:`pikku_django.asgi.WebhookBodyLimit`: the body was
#: bounded as it arrived.
ASGI_SCOPE_KEY = "pikku_django.webhook_max_body"
_warned_unbounded = False


def note_unbounded_asgi(request: Any) -> None:
    """Warn once per process when a webhook request came through an ASGI application
    that read its whole body before the view (see :mod:`pikku_django.asgi`)."""
    global _warned_unbounded
    scope = getattr(request, "scope", None)
    if _warned_unbounded or not isinstance(scope, dict) or ASGI_SCOPE_KEY in scope:
        return
    _warned_unbounded = True
    logger.warning(
        "Webhook bodies are read whole under ASGI before PIKKU['WEBHOOK_MAX_BODY'] applies "
        "(a 300 MB body is read before its 413): build the ASGI application with "
        "pikku_django.asgi.get_asgi_application(), or wrap it with "
        "pikku_django.asgi.limit_webhook_bodies()."
    )


class BodyLimitError(ValueError):
    """JSON text larger or deeper than the bounds allow (answer 400)."""


# Only brackets and quotes matter for the depth: escaped backslashes and quotes go
# first, so every quote left opens or closes a string (exactly so in valid JSON, and in
# the valid part a parser reads of any other text: the depth is never under-counted).
_DROP = bytes(b for b in range(256) if b not in b'[]{}"')
# Openers as 1, closers as -1 (255, read as a signed byte).
_STEPS = bytes.maketrans(b"[{]}", bytes([1, 1, 255, 255]))


def _max_body() -> int:
    value = pikku_settings.WEBHOOK_MAX_BODY
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ImproperlyConfigured(
            f"PIKKU['WEBHOOK_MAX_BODY'] must be a positive int, not {value!r}"
        )
    return value


def _as_bytes(text: str | bytes) -> bytes:
    if isinstance(text, str):
        return text.encode("utf-8", "surrogatepass")
    return text if isinstance(text, bytes) else bytes(text)


def _outside_strings(data: bytes) -> bytes:
    """The brackets of JSON ``data`` that are not inside strings, in order."""
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = data.translate(None, _DROP)
    brackets = structure.replace(b'""', b"")  # strings without brackets: the usual case
    if b'"' in brackets:  # some string holds brackets: drop every string's content
        brackets = b"".join(structure.split(b'"')[::2])
    return brackets


def _depth(brackets: bytes) -> int:
    if not brackets:
        return 0
    return max(0, max(accumulate(array("b", brackets.translate(_STEPS)))))


def json_depth(text: str | bytes) -> int:
    """How deep arrays and objects nest in JSON ``text`` (0 for a scalar), brackets in
    strings not counted."""
    return _depth(_outside_strings(_as_bytes(text)))


def check_json_text(
    text: str | bytes, *, max_depth: int | None = None, max_size: int | None = None
) -> None:
    """Raise :class:`BodyLimitError` when ``text`` is larger or nests deeper than the
    bounds (by default ``PIKKU["WEBHOOK_MAX_BODY"]`` and :data:`MAX_JSON_DEPTH`)."""
    data = _as_bytes(text)
    size = _max_body() if max_size is None else max_size
    if len(data) > size:
        raise BodyLimitError(f"the JSON is larger than {size} bytes")
    depth = MAX_JSON_DEPTH if max_depth is None else max_depth
    brackets = _outside_strings(data)
    opened = brackets.count(b"[") + brackets.count(b"{")
    if opened > depth and _depth(brackets) > depth:
        raise BodyLimitError(f"the JSON nests deeper than {depth} levels")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(text: str | bytes) -> Any:
    """``text`` parsed as JSON within the bounds: ``ValueError`` when it is not JSON
    (NaN and Infinity are not), :class:`BodyLimitError` when it is out of bounds."""
    check_json_text(text)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # a bound above what this stack can parse
        raise BodyLimitError("the JSON nests too deeply to parse") from None
