"""Queues declared in ``PIKKU["QUEUES"]``: each one's lease, concurrency and rate.

``{"reports": {"lease_ms": 300_000, "concurrency": 8, "rate": "100/1m"}}``; every
key is optional, and a queue not declared runs with the defaults (no limit, the
``STEP_LEASE_MS`` lease). The older ``QUEUE_LEASE_MS`` (queue to lease) is still
read, under the lease a queue declares here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pikku_django.workflows.durations import parse_duration

#: The keys a queue's declaration may hold.
QUEUE_KEYS = ("lease_ms", "concurrency", "rate")
_RATE = re.compile(r"\s*(\d+)\s*/\s*(.+?)\s*")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` claims per ``per_seconds``."""

    count: int
    per_seconds: float

    def __str__(self) -> str:
        return f"{self.count}/{self.per_seconds:g}s"


@dataclass(frozen=True)
class QueueSettings:
    """One declared queue (None: no value of its own)."""

    name: str
    lease_ms: int | None = None
    #: At most this many of its steps claimed under a live lease at once.
    concurrency: int | None = None
    rate: Rate | None = None


def parse_rate(value: object) -> Rate:
    """``"100/1m"``, ``"10/s"`` or ``"5/30s"`` as a :class:`Rate`; ValueError if not."""
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"a rate is text like '100/1m' (claims per period), not {value!r}")
    period = match.group(2)
    seconds = parse_duration("1" + period if period.isalpha() else period, what="a rate's period")
    count = int(match.group(1))
    if count <= 0 or seconds <= 0:
        raise ValueError(f"a rate needs a positive count and period, not {value!r}")
    return Rate(count, seconds)


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive int, not {value!r}")
    return value


def _one(name: object, spec: object) -> QueueSettings:
    if not isinstance(name, str) or not 0 < len(name) <= 100 or name != name.strip():
        raise ValueError(f"a queue name is a str of 1 to 100 characters, not {name!r}")
    if not isinstance(spec, Mapping):
        raise ValueError(f"queue {name!r} must be a dict with keys {', '.join(QUEUE_KEYS)}")
    unknown = sorted(set(spec) - set(QUEUE_KEYS))
    if unknown:
        raise ValueError(
            f"queue {name!r} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(QUEUE_KEYS)}"
        )
    lease = spec.get("lease_ms")
    concurrency = spec.get("concurrency")
    rate = spec.get("rate")
    return QueueSettings(
        name=name,
        lease_ms=None if lease is None else _positive_int(lease, f"queue {name!r} lease_ms"),
        concurrency=None
        if concurrency is None
        else _positive_int(concurrency, f"queue {name!r} concurrency"),
        rate=None if rate is None else _rate_of(name, rate),
    )


def _rate_of(name: str, rate: object) -> Rate:
    try:
        return parse_rate(rate)
    except ValueError as exc:
        raise ValueError(f"queue {name!r}: {exc}") from None


def queue_problems(raw: object) -> list[str]:
    """What is wrong with a ``QUEUES`` value, one line per problem (none: usable)."""
    if not isinstance(raw, Mapping):
        return [f"must be a dict of queue name to its settings, not {type(raw).__name__}"]
    problems = []
    for name, spec in raw.items():
        try:
            _one(name, spec)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


def parse_queues(raw: object, legacy_leases: object = None) -> dict[str, QueueSettings]:
    """The declared queues, with ``QUEUE_LEASE_MS`` folded in (a queue's own
    ``lease_ms`` wins); ValueError naming every problem."""
    problems = queue_problems(raw or {})
    if problems:
        raise ValueError("PIKKU['QUEUES'] " + "; ".join(problems))
    queues = {name: _one(name, spec) for name, spec in dict(raw or {}).items()}  # type: ignore[call-overload]
    for name, lease in dict(legacy_leases or {}).items():  # type: ignore[call-overload]
        found = queues.get(name)
        if found is None:
            queues[name] = QueueSettings(name=str(name), lease_ms=int(lease))
        elif found.lease_ms is None:
            queues[name] = QueueSettings(name, int(lease), found.concurrency, found.rate)
    return queues


def describe(queues: Mapping[str, QueueSettings]) -> dict[str, dict[str, Any]]:
    """The queues as a ``QUEUES`` value (what a deprecation hint suggests)."""
    return {
        q.name: {
            k: v
            for k, v in (
                ("lease_ms", q.lease_ms),
                ("concurrency", q.concurrency),
                ("rate", None if q.rate is None else str(q.rate)),
            )
            if v is not None
        }
        for q in queues.values()
    }
