"""Ids for new rows: time-ordered UUIDs (RFC 9562 version 7).

A run's id is its primary key. Random (version 4) ids land all over the key's
b-tree, so each new run touches a page no recent write has; ids that start with the
time land next to each other. Python 3.14 has ``uuid.uuid7``; older ones get the
same layout here rather than a dependency for one function.
"""

from __future__ import annotations

import os
import time
import uuid

__all__ = ["time_ordered_uuid"]


def time_ordered_uuid() -> uuid.UUID:
    """A new version 7 UUID: 48 bits of Unix time in milliseconds, then 74 random bits."""
    stdlib = getattr(uuid, "uuid7", None)
    if stdlib is not None:
        return uuid.UUID(int=stdlib().int)
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & 0xFFFF_FFFF_FFFF) << 80  # unix_ts_ms
    value |= 0x7 << 76  # version
    value |= ((rand >> 64) & 0xFFF) << 64  # rand_a
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b
    return uuid.UUID(int=value)
