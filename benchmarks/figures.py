"""Repeats, their order and their summaries: what every benchmark script reports.

A figure is measured ``repeat`` times; the systems it compares take turns in an
order that rotates by one place each repeat (``rotations``), so none always runs
first, on a cold server, or last, after the others' dead rows. Each figure is then
printed as its median with its spread (``Summary``), and a comparison as the ratio
of two medians measured in the same run.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def rotated(items: Sequence[T], by: int) -> list[T]:
    """``items`` rotated left by ``by`` places (modulo their number)."""
    shift = by % len(items) if items else 0
    return [*items[shift:], *items[:shift]]


def rotations(items: Sequence[T], repeat: int) -> Iterator[tuple[int, list[T]]]:
    """``(repeat index, items in that repeat's order)``: the list rotated by one each time."""
    for r in range(repeat):
        yield r, rotated(items, r)


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0-100) by linear interpolation; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Summary:
    """Median and spread of one figure's repeats."""

    median: float
    low: float
    high: float
    q1: float
    q3: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("a summary needs at least one value")
        vals = tuple(float(v) for v in values)
        return cls(
            median=statistics.median(vals),
            low=min(vals),
            high=max(vals),
            q1=percentile(vals, 25),
            q3=percentile(vals, 75),
            values=vals,
        )

    @property
    def spread_pct(self) -> float:
        """(max - min) / median, in percent."""
        return (self.high - self.low) / self.median * 100 if self.median else 0.0

    def text(self, fmt: str = ".1f") -> str:
        """``median (min-max)``."""
        if len(self.values) == 1:
            return format(self.median, fmt)
        return f"{self.median:{fmt}} ({self.low:{fmt}}-{self.high:{fmt}})"

    def as_json(self, digits: int = 2) -> dict[str, Any]:
        return {
            "median": round(self.median, digits),
            "min": round(self.low, digits),
            "max": round(self.high, digits),
            "q1": round(self.q1, digits),
            "q3": round(self.q3, digits),
            "spread_pct": round(self.spread_pct, 1),
            "repeats": [round(v, digits) for v in self.values],
        }


def ratio(ours: Summary | None, theirs: Summary | None) -> float | None:
    """The ratio of two medians, or None when either is missing or zero."""
    if ours is None or theirs is None or not theirs.median:
        return None
    return ours.median / theirs.median


def latency_json(values_ms: Sequence[float]) -> dict[str, Any] | None:
    """p50, p95 and max of a list of per-step latencies, in ms."""
    if not values_ms:
        return None
    return {
        "n": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50), 2),
        "p95_ms": round(percentile(values_ms, 95), 2),
        "max_ms": round(max(values_ms), 2),
    }


def slope_last_half(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(x, y)`` over the points whose x is in the last half of
    the x range; None with fewer than two such points."""
    if len(points) < 2:
        return None
    top = max(x for x, _ in points)
    half = [(x, y) for x, y in points if x >= top / 2]
    if len(half) < 2:
        return None
    mx = statistics.fmean(x for x, _ in half)
    my = statistics.fmean(y for _, y in half)
    den = sum((x - mx) ** 2 for x, _ in half)
    if not den:
        return None
    return sum((x - mx) * (y - my) for x, y in half) / den
