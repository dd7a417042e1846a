"""The rule for an identifier that comes from outside (a delivery id in a header, an
event id in a body, the key of the run an event goes to): what may be stored, logged
and shown. At most :data:`MAX_IDENTIFIER_LENGTH` characters, every one printable, so
no newline can forge a log line and no escape sequence can reach a terminal.
"""

from __future__ import annotations

__all__ = ["MAX_IDENTIFIER_LENGTH", "UnusableIdentifierError", "check_identifier", "is_usable"]

MAX_IDENTIFIER_LENGTH = 255
"""An identifier longer than this is refused (the columns that store them hold 255)."""


class UnusableIdentifierError(ValueError):
    """An identifier from outside breaks the rule (the request is answered 400)."""


def is_usable(value: str) -> bool:
    """Whether ``value`` may be stored, logged and shown as it is."""
    return len(value) <= MAX_IDENTIFIER_LENGTH and value.isprintable()


def check_identifier(value: object, what: str) -> str:
    """``value`` as text when it is usable, else :class:`UnusableIdentifierError`
    saying ``what`` it is and the rule (never the value itself)."""
    text = str(value)
    if not is_usable(text):
        raise UnusableIdentifierError(
            f"{what} is not a usable id (at most {MAX_IDENTIFIER_LENGTH} printable "
            "characters, no control characters)"
        )
    return text
