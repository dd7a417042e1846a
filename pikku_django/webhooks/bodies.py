"""Reading a webhook body as JSON within bounds.

Any body a signed sender can send is either parsed or refused with a
:class:`BodyLimitError` (a ``ValueError``, answered 400) that says which bound it
broke: at most ``PIKKU["WEBHOOK_MAX_BODY"]`` bytes of JSON text, nested at most
:data:`MAX_JSON_DEPTH` arrays and objects deep. The depth is measured before
parsing, so a deep body never reaches the parser or the database.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from pikku_django.conf import pikku_settings

__all__ = ["MAX_JSON_DEPTH", "BodyLimitError", "check_json_text", "json_depth", "loads"]

#: The deepest JSON a webhook body may nest: what every database stores, as MariaDB
#: takes JSON 31 levels deep and the run's input wraps the data in up to two more.
MAX_JSON_DEPTH = 29


class BodyLimitError(ValueError):
    """JSON text larger or deeper than the bounds allow (answer 400)."""


# A JSON string, or an unterminated one running to the end (which the parser then
# refuses): possessive and always matching, so the scan is linear whatever the text.
# UTF-8 continuation bytes never equal '"' or '\\', so scanning the bytes is safe.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


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
    return bytes(text)


def json_depth(text: str | bytes) -> int:
    """How deep arrays and objects nest in JSON ``text`` (0 for a scalar), brackets in
    strings not counted."""
    brackets = _STRING.sub(b"", _as_bytes(text)).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets))))


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
    opened = data.count(b"[") + data.count(b"{")
    if opened > depth and json_depth(data) > depth:
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
