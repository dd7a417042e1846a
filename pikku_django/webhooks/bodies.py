"""Reading a webhook body as JSON within bounds.

Any body a signed sender can send is either parsed or refused with a
:class:`BodyError` (a ``ValueError``, answered 400) that says why:
:class:`BodyLimitError` for a bound it broke (at most ``PIKKU["WEBHOOK_MAX_BODY"]``
bytes of JSON text, nested at most :data:`MAX_JSON_DEPTH` arrays and objects deep,
numbers Python reads back: integers of at most ``sys.get_int_max_str_digits()``
digits, others within a float's range), :class:`BodyNotJSONError` for a body that is
not JSON at all (NaN, plain text, a form, bytes that are not UTF-8). The bounds are
checked before parsing, so such a body never reaches the parser or the database,
nor is stored for a worker that could not read it back.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from array import array
from itertools import accumulate
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from pikku_django.conf import pikku_settings

__all__ = [
    "ASGI_SCOPE_KEY",
    "MAX_JSON_DEPTH",
    "BodyError",
    "BodyLimitError",
    "BodyNotJSONError",
    "check_json_text",
    "json_depth",
    "loads",
    "not_json_reason",
    "note_unbounded_asgi",
    "utf8_text",
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


class BodyError(ValueError):
    """A body that cannot be taken as JSON; its message says why (answer 400)."""


class BodyLimitError(BodyError):
    """JSON text larger or deeper than the bounds allow, or holding a number Python
    cannot read back (answer 400)."""


class BodyNotJSONError(BodyError):
    """A body that is not JSON: NaN or Infinity, plain text, a form, not UTF-8
    (answer 400)."""


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
    _check_numbers(data)


# Digits as "0", the rest as is: a number Python may not read back shows as "0e",
# "0E" or a run of 300 "0" (a float needs 309 digits to pass its range, an integer
# 640 to pass the least limit), found at the speed of a bytes search.
_ZEROED = bytes.maketrans(b"123456789", b"0" * 9)
_LONG_RUN = b"0" * 300
_NUMBER = re.compile(rb"-?([0-9]+)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def _suspect(data: bytes) -> bool:
    zeroed = data.translate(_ZEROED)
    return b"0e" in zeroed or b"0E" in zeroed or _LONG_RUN in zeroed


def _check_numbers(data: bytes) -> None:
    """Refuse a number outside strings that Python would not read back as it is: an
    integer past ``sys.get_int_max_str_digits()`` digits, or a number past a float's
    range (Python would read infinity; PostgreSQL would store it as an integer)."""
    if not _suspect(data):  # the usual answer
        return
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b" ".join(data.split(b'"')[::2])  # strings' text cannot hold a number
    if not _suspect(outside):
        return
    limit = sys.get_int_max_str_digits()
    for number in _NUMBER.finditer(outside):
        if number[2] or number[3]:
            if not math.isfinite(float(number[0])):
                raise BodyLimitError(
                    f"the JSON holds the number {_shown(number[0])}, beyond the range of a float"
                )
        elif limit and len(number[1]) > limit:
            raise BodyLimitError(
                f"the JSON holds an integer of {len(number[1])} digits, more than the "
                f"{limit} Python reads"
            )


def _shown(number: bytes) -> str:
    text = number.decode("ascii")
    return text if len(text) <= 40 else f"{text[:20]}...{text[-12:]}"


def _no_constant(name: str) -> Any:
    raise BodyNotJSONError(f"{name} is not JSON (JSON has no NaN or Infinity)")


# A form's text: name=value pairs joined by "&" (the names and values percent-encoded).
_FORM = re.compile(r"[\w.~%+*\-\[\]]+=[^&=\s]*(?:&[\w.~%+*\-\[\]]+=?[^&=\s]*)*&?")


def _not_json(text: str, error: json.JSONDecodeError) -> BodyNotJSONError:
    """Why ``text``, which the parser refused with ``error``, is not JSON."""
    stripped = text.strip()
    if not stripped:
        return BodyNotJSONError("an empty body is not JSON")
    if error.pos <= len(text) - len(text.lstrip()):  # refused at its first character
        if _FORM.fullmatch(stripped):
            return BodyNotJSONError(
                "the body is form-encoded (application/x-www-form-urlencoded), not JSON"
            )
        return BodyNotJSONError("the body is plain text, not JSON")
    return BodyNotJSONError(
        f"the body is not JSON: {error.msg} at line {error.lineno} column {error.colno}"
    )


def utf8_text(body: bytes) -> str:
    """``body`` decoded as UTF-8: :class:`BodyNotJSONError` (saying where) when it is not."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyNotJSONError(
            f"the body is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from exc


def loads(text: str | bytes) -> Any:
    """``text`` parsed as JSON within the bounds: :class:`BodyNotJSONError` when it is
    not JSON (NaN and Infinity are not), :class:`BodyLimitError` when it is out of
    bounds; both say why."""
    check_json_text(text)
    if isinstance(text, bytes | bytearray):
        text = utf8_text(bytes(text))
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # a bound above what this stack can parse
        raise BodyLimitError("the JSON nests too deeply to parse") from None
    except json.JSONDecodeError as exc:
        raise _not_json(text, exc) from None
    except BodyError:
        raise
    except ValueError as exc:  # a number the scan let pass, should a limit have changed
        raise BodyLimitError(f"the JSON holds a number Python cannot read: {exc}") from None


def not_json_reason(text: str | bytes) -> str | None:
    """Why ``text`` is not JSON that Python reads back within the bounds, or None when
    it is."""
    try:
        loads(text)
    except BodyError as exc:
        return str(exc)
    return None
