"""Server-rendered SVG charts: board sparklines and the channel page's time series.

Only numbers computed here go into the markup (labels pass through ``format_html``), so no
broker- or user-provided text reaches an attribute unescaped. A ``None`` value is a gap in the
line (unknown), never a drop to zero.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from channels_registry.health import fmt_duration
from channels_registry.models import Channel, ChannelRollup, ChannelSample

Series = Sequence[tuple[float, float | None]]

RANGES: dict[str, dt.timedelta] = {
    "1h": dt.timedelta(hours=1),
    "24h": dt.timedelta(hours=24),
    "7d": dt.timedelta(days=7),
}
MAX_POINTS = 360


def _segments(
    series: Series, start: float, end: float, top: float, width: float, height: float
) -> list[str]:
    """Polyline point lists, split at unknown values."""
    span = max(end - start, 1.0)
    segments: list[str] = []
    current: list[str] = []
    for t, v in series:
        if v is None:
            if current:
                segments.append(" ".join(current))
            current = []
            continue
        x = (t - start) / span * width
        y = height - (v / top * (height - 2) if top > 0 else 0) - 1
        current.append(f"{x:.1f},{y:.1f}")
    if current:
        segments.append(" ".join(current))
    return segments


def _draw(segments: list[str]) -> SafeString:
    """A polyline per segment; a lone point (one sample between gaps) as a dot."""
    parts = []
    for seg in segments:
        if " " in seg:
            parts.append(format_html('<polyline points="{}"/>', seg))
        else:
            x, y = seg.split(",")
            parts.append(format_html('<circle cx="{}" cy="{}" r="1.5"/>', x, y))
    return mark_safe("".join(parts))


def sparkline(
    series: Series, start: float, end: float, *, width: int = 120, height: int = 24
) -> SafeString:
    known = [v for _, v in series if v is not None]
    if not known:
        return format_html(
            '<svg class="spark spark-empty" width="{}" height="{}" role="img"'
            ' aria-label="no data"><line x1="0" y1="{}" x2="{}" y2="{}"/></svg>',
            width,
            height,
            height - 1,
            width,
            height - 1,
        )
    top = max(known)
    lines = _draw(_segments(series, start, end, top, width, height))
    return format_html(
        '<svg class="spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img"'
        ' aria-label="backlog, last hour: max {}">{}</svg>',
        width,
        height,
        width,
        height,
        f"{top:,.0f}",
        lines,
    )


def line_chart(
    series: Series, start: float, end: float, *, label: str, width: int = 640, height: int = 120
) -> SafeString:
    """A labelled line chart with a zero baseline, the max value and the time span."""
    known = [v for _, v in series if v is not None]
    top = max(known) if known else 0.0
    pad = 40
    lines = _draw(_segments(series, start, end, top, width - pad, height))
    summary = f"max {top:,.0f}, last {known[-1]:,.0f}" if known else "no data"
    return format_html(
        '<figure class="chart"><figcaption>{} <span class="sub">{}</span></figcaption>'
        '<svg width="100%" viewBox="0 0 {} {}" preserveAspectRatio="none" role="img"'
        ' aria-label="{}: {}"><g transform="translate({},0)">'
        '<line class="axis" x1="0" y1="{}" x2="{}" y2="{}"/>{}</g>'
        '<text x="0" y="10">{}</text><text x="0" y="{}">0</text></svg>'
        '<div class="chart-x sub"><span>{} ago</span><span>now</span></div></figure>',
        label,
        summary,
        width,
        height,
        label,
        summary,
        pad,
        height - 1,
        width - pad,
        height - 1,
        lines,
        f"{top:,.0f}" if known else "",
        height - 2,
        fmt_duration(end - start),
    )


@dataclasses.dataclass
class ChartPoint:
    t: float
    backlog: float | None
    in_flight: float | None
    consumers: float | None
    dlq_depth: float | None


FIELDS = ("backlog", "in_flight", "consumers", "dlq_depth")
LABELS = {
    "backlog": "Backlog",
    "in_flight": "In flight",
    "consumers": "Consumers",
    "dlq_depth": "DLQ depth",
}


def _bucket(points: list[ChartPoint], start: float, end: float) -> list[ChartPoint]:
    """At most MAX_POINTS points: the last point of each bucket (gaps stay gaps)."""
    if len(points) <= MAX_POINTS:
        return points
    size = (end - start) / MAX_POINTS
    buckets: dict[int, ChartPoint] = {}
    for p in points:
        buckets[int((p.t - start) // size)] = p
    return [buckets[k] for k in sorted(buckets)]


def channel_charts(channel: Channel, range_key: str) -> dict[str, Any]:
    """Context for the channel page's charts: raw samples for 1 h, minute rollups beyond."""
    range_key = range_key if range_key in RANGES else "1h"
    end_dt = timezone.now()
    start_dt = end_dt - RANGES[range_key]
    points: list[ChartPoint]
    if range_key == "1h":
        rows: Any = (
            ChannelSample.objects.filter(channel=channel, taken_at__gte=start_dt)
            .order_by("taken_at")
            .values_list("taken_at", *FIELDS)
        )
    else:
        rows = (
            ChannelRollup.objects.filter(channel=channel, minute__gte=start_dt)
            .order_by("minute")
            .values_list("minute", *FIELDS)
        )
    points = [ChartPoint(t.timestamp(), *values) for t, *values in rows]
    start, end = start_dt.timestamp(), end_dt.timestamp()
    points = _bucket(points, start, end)
    charts = [
        line_chart([(p.t, getattr(p, name)) for p in points], start, end, label=LABELS[name])
        for name in FIELDS
    ]
    return {
        "charts": mark_safe("".join(charts)),
        "chart_range": range_key,
        "chart_ranges": list(RANGES),
        "chart_points": len(points),
    }
