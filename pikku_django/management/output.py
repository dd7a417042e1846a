"""What the management commands print: text from the database or from outside (names,
ids, errors, a provider's answers) shown with its control characters escaped, so a
stored newline cannot forge a line and an escape sequence never reaches the terminal
raw; and the tables they print."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_table", "shown", "yes_no"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(value: object) -> str:
    """``value`` as text fit for a terminal: every character that is not printable
    (controls, escape sequences, line and bidi separators) as a backslash escape."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart, under a dashed rule; each cell
    :func:`shown`."""
    cells = [[shown(cell) for cell in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)
