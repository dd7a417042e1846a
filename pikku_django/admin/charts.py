"""Small line charts drawn on the server as inline SVG: no script, no CDN, works offline."""

from __future__ import annotations

from datetime import datetime

from django.utils.html import format_html
from django.utils.safestring import SafeString

WIDTH = 420
HEIGHT = 130
LEFT = 32  # room for the y labels
BOTTOM = 18  # room for the x labels
TOP = 8


def polyline_points(counts: list[int], peak: int) -> str:
    """The chart's points, one per count, scaled into the plot area."""
    if not counts:
        return ""
    plot_w = WIDTH - LEFT - 4
    plot_h = HEIGHT - TOP - BOTTOM
    step = plot_w / max(1, len(counts) - 1)
    scale = plot_h / peak if peak else 0.0
    return " ".join(
        f"{LEFT + i * step:.1f},{TOP + plot_h - n * scale:.1f}" for i, n in enumerate(counts)
    )


def line_chart(
    counts: list[int],
    *,
    since: datetime,
    until: datetime,
    title: str,
    css: str = "pikku-chart-line",
) -> SafeString:
    """A line of ``counts`` (one per minute from ``since`` to ``until``) as an SVG."""
    peak = max(counts, default=0)
    base = HEIGHT - BOTTOM
    mid_x = LEFT + (WIDTH - LEFT - 4) / 2
    return format_html(
        '<svg class="pikku-chart" viewBox="0 0 {w} {h}" role="img" aria-label="{title}" '
        'xmlns="http://www.w3.org/2000/svg">'
        "<title>{title}</title>"
        '<line class="pikku-chart-grid" x1="{left}" y1="{top}" x2="{right}" y2="{top}"/>'
        '<line class="pikku-chart-grid" x1="{left}" y1="{base}" x2="{right}" y2="{base}"/>'
        '<text x="{ylab}" y="{top_text}" text-anchor="end">{peak}</text>'
        '<text x="{ylab}" y="{base}" text-anchor="end">0</text>'
        '<text x="{left}" y="{h_text}">{start}</text>'
        '<text x="{mid}" y="{h_text}" text-anchor="middle">{middle}</text>'
        '<text x="{right}" y="{h_text}" text-anchor="end">{end}</text>'
        '<polyline class="{css}" points="{points}"/>'
        "</svg>",
        w=WIDTH,
        h=HEIGHT,
        title=title,
        left=LEFT,
        right=WIDTH - 4,
        top=TOP,
        base=base,
        ylab=LEFT - 4,
        top_text=TOP + 8,
        h_text=HEIGHT - 4,
        mid=f"{mid_x:.0f}",
        peak=peak,
        start=since.strftime("%H:%M"),
        middle=(since + (until - since) / 2).strftime("%H:%M"),
        end=until.strftime("%H:%M"),
        css=css,
        points=polyline_points(counts, peak),
    )
