"""A JSON column whose rows always load, even those holding JSON this process cannot
decode (an integer longer than ``sys.get_int_max_str_digits()``, a number beyond a
float's range), so one such row never stops the loads of the others."""

from __future__ import annotations

import json
import math
from typing import Any

from django.db import models
from django.db.models.fields.json import KeyTransform


class UnreadableJSON:
    """A stored JSON value Python cannot read back: its ``text``, and the ``reason``."""

    __slots__ = ("reason", "text")

    def __init__(self, text: str, reason: str) -> None:
        self.text = text
        self.reason = reason

    def __repr__(self) -> str:
        return f"UnreadableJSON({self.reason!r}, {len(self.text)} characters)"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UnreadableJSON):
            return NotImplemented
        return (self.text, self.reason) == (other.text, other.reason)

    def __hash__(self) -> int:
        return hash(self.text)

    def __str__(self) -> str:
        return f"(stored JSON Python cannot read back: {self.reason})"


def shown(value: Any) -> Any:
    """``value`` as pages and answers show it: an :class:`UnreadableJSON` as its note."""
    return str(value) if isinstance(value, UnreadableJSON) else value


class UnreadableValueError(ValueError):
    """A stored value Python cannot read back was about to be used."""


def readable(value: Any, what: str) -> Any:
    """``value``, or :class:`UnreadableValueError` naming ``what`` when it is an
    :class:`UnreadableJSON`."""
    if isinstance(value, UnreadableJSON):
        raise UnreadableValueError(f"{what} cannot be read back from the database: {value.reason}")
    return value


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(
            f"the number {text[:40]}{'...' if len(text) > 40 else ''} is beyond a float"
        )
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_stored_json(text: str, *, finite: bool = False) -> Any:
    """``text`` as a value, or :class:`UnreadableJSON` saying why Python cannot read it
    back; with ``finite``, also for a float out of range (it would come back as
    infinity, which cannot be stored again). ``json.JSONDecodeError`` for text that is
    not JSON."""
    try:
        if finite:
            return json.loads(text, parse_float=_finite, parse_constant=_constant)
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        return UnreadableJSON(text, "it nests too deeply for Python to read")
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer..."
        return UnreadableJSON(text, str(exc))


class ReadableJSONField(models.JSONField):
    """A ``JSONField`` whose undecodable values load as :class:`UnreadableJSON` instead
    of raising; such a value cannot be saved back.

    The column is a plain JSON column: migrations record it as ``JSONField``. With
    ``finite_floats``, a float out of range loads as unreadable too (for values that
    are stored again as they are read, such as a receipt's run input).
    """

    def __init__(self, *args: Any, finite_floats: bool = False, **kwargs: Any) -> None:
        self.finite_floats = finite_floats
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if (
            not isinstance(value, str)
            or self.decoder is not None
            or isinstance(expression, KeyTransform)
        ):
            return super().from_db_value(value, expression, connection)
        try:
            return decode_stored_json(value, finite=self.finite_floats)
        except json.JSONDecodeError:  # as JSONField answers it: the text itself
            return value

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if isinstance(value, UnreadableJSON):
            raise TypeError(
                "An unreadable stored JSON value cannot be saved back; leave its field out"
            )
        return super().get_db_prep_value(value, connection, prepared)
