"""Server-rendered SVG charts: board sparklines and the channel page's time series.

Only numbers computed here go into the markup (labels are escaped: ``format_html``, or
``escape`` in the sparkline drawn for every board row), so no broker- or user-provided text
reaches an attribute unescaped. A ``None`` value is a gap in the
line (unknown), never a drop to zero.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math
from collections.abc import Callable, Sequence
from html import escape
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
    """A polyline per segment; a lone point (one sample between gaps) as a dot. The segments
    are ``_segments``' "x,y" pairs of formatted floats (digits, ".", "-", "inf", "nan"):
    nothing to escape, so no ``format_html`` (half the cost of a board row's sparkline)."""
    parts = []
    for seg in segments:
        if " " in seg:
            parts.append(f'<polyline points="{seg}"/>')
        else:
            x, y = seg.split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="1.5"/>')
    return mark_safe("".join(parts))  # numbers only, see above


def sparkline(
    series: Series, start: float, end: float, *, width: int = 140, height: int = 32
) -> SafeString:
    """The board's backlog sparkline (built with f-strings: it is drawn for every row shown;
    the sizes are ints and the label is escaped)."""
    width, height = int(width), int(height)
    known = [v for _, v in series if v is not None]
    if not known:
        return mark_safe(  # ints only
            f'<svg class="spark spark-empty" width="{width}" height="{height}" role="img"'
            f' aria-label="no data"><line x1="0" y1="{height - 1}" x2="{width}"'
            f' y2="{height - 1}"/></svg>'
        )
    top = max(known)
    lines = _draw(_segments(series, start, end, top, width, height))
    text = escape(f"backlog, last hour: max {top:,.0f}, now {known[-1]:,.0f}")
    return mark_safe(  # ints, the escaped label and _draw's numbers
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        f' role="img" aria-label="{text}"><title>{text}</title>{lines}</svg>'
    )


@dataclasses.dataclass(frozen=True)
class ChartEvent:
    """Something that happened to the channel, marked on its charts: ``end`` set draws a band
    (a replay plan's run), else a line (a failure group first seen, an alert firing)."""

    t: float
    kind: str  # "group", "plan" or "alert": the mark's CSS class
    label: str
    end: float | None = None


#: Upper apps (dlq, alerts) register where their events come from: lower floors do not import
#: them. Each source answers ``(channel, start, end)`` with the events in that range.
EventSource = Callable[[Channel, dt.datetime, dt.datetime], list[ChartEvent]]
_event_sources: list[EventSource] = []


def register_event_source(source: EventSource) -> None:
    if source not in _event_sources:
        _event_sources.append(source)


def chart_events(channel: Channel, start: dt.datetime, end: dt.datetime) -> list[ChartEvent]:
    events = [e for source in _event_sources for e in source(channel, start, end)]
    return sorted(events, key=lambda e: e.t)[:MAX_EVENTS]


@dataclasses.dataclass(frozen=True)
class Line:
    key: str  # CSS class suffix: the series' colour
    label: str
    points: Series


WIDTH, HEIGHT, PAD = 640, 140, 44
HOVER_BANDS = 120
MAX_EVENTS = 50


def _clock(t: float) -> str:
    """A chart time in UTC; ``ui.js`` rewrites it in the viewer's zone from the element's
    ``data-t`` (epoch seconds), keeping the UTC time beside it."""
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%H:%M:%S UTC")


def _hover_bands(
    lines: list[Line], start: float, end: float, width: float, fmt: Callable[[float], str]
) -> SafeString:
    """Transparent columns over the plot, each titled with every series' value at that time:
    the browser shows the title on hover, no script needed (CSP)."""
    times = sorted({t for line in lines for t, _ in line.points})
    if not times:
        return mark_safe("")
    step = max(1, -(-len(times) // HOVER_BANDS))
    picked = times[step - 1 :: step] or times[-1:]
    if picked[-1] != times[-1]:
        picked.append(times[-1])
    values = [dict(line.points) for line in lines]
    span = max(end - start, 1.0)
    xs = [(t - start) / span * width for t in picked]
    parts = []
    for i, t in enumerate(picked):
        left = 0.0 if i == 0 else (xs[i - 1] + xs[i]) / 2
        right = width if i == len(picked) - 1 else (xs[i] + xs[i + 1]) / 2
        # The value at or just before t in each series (a bucket's last point).
        text = " · ".join(
            f"{line.label} {_value_at(v, t, fmt)}" for line, v in zip(lines, values, strict=True)
        )
        parts.append(
            format_html(
                '<rect class="hit" x="{}" y="0" width="{}" height="{}" data-t="{}">'
                "<title>{}: {}</title></rect>",
                f"{left:.1f}",
                f"{max(right - left, 0.5):.1f}",
                HEIGHT,
                f"{t:.0f}",
                _clock(t),
                text,
            )
        )
    return mark_safe("".join(parts))


def _value_at(values: dict[float, float | None], t: float, fmt: Callable[[float], str]) -> str:
    if t in values:
        v = values[t]
        return "unknown" if v is None else fmt(v)
    earlier = [k for k in values if k <= t]
    if not earlier:
        return "—"
    v = values[max(earlier)]
    return "unknown" if v is None else fmt(v)


def _marks(events: list[ChartEvent], start: float, end: float, width: float) -> SafeString:
    span = max(end - start, 1.0)
    parts = []
    for e in events:
        x = max(0.0, min(width, (e.t - start) / span * width))
        title = f"{_clock(e.t)}: {e.label}"
        if e.end is not None:
            x2 = max(x + 1.0, min(width, (e.end - start) / span * width))
            parts.append(
                format_html(
                    '<rect class="mark mark-{}" x="{}" y="0" width="{}" height="{}"'
                    ' data-t="{}" data-t2="{}"><title>{} – {}</title></rect>',
                    e.kind,
                    f"{x:.1f}",
                    f"{x2 - x:.1f}",
                    HEIGHT,
                    f"{e.t:.0f}",
                    f"{e.end:.0f}",
                    title,
                    _clock(e.end),
                )
            )
        else:
            parts.append(
                format_html(
                    '<g class="mark mark-{}"><line x1="{}" y1="0" x2="{}" y2="{}"/>'
                    '<rect class="mark-hit" x="{}" y="0" width="6" height="{}" data-t="{}">'
                    "<title>{}</title></rect></g>",
                    e.kind,
                    f"{x:.1f}",
                    f"{x:.1f}",
                    HEIGHT,
                    f"{x - 3:.1f}",
                    HEIGHT,
                    f"{e.t:.0f}",
                    title,
                )
            )
    return mark_safe("".join(parts))


def nice_ticks(top: float, most: int = 4, *, integer: bool = False) -> list[float]:
    """Round y-axis ticks from 0 to at least ``top``: steps of 1, 2 or 5 × 10^k, at most
    ``most`` steps (``[0, 1]`` when there is nothing above zero); whole steps for counts."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / most
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    if integer:
        step = max(step, 1.0)
    count = max(1, math.ceil(top / step - 1e-9))
    return [i * step for i in range(count + 1)]


def _axis_label(value: float, fmt: Callable[[float], str]) -> str:
    if value >= 10_000 and value == int(value):
        for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if value >= size:
                return f"{value / size:g}{unit}"
    return fmt(value)


def _table(lines: list[Line], label: str, fmt: Callable[[float], str]) -> SafeString:
    """The chart's values as a table (screen readers; the crosshair reads it too): one row per
    time, a cell per series, "unknown" for a gap."""
    times = sorted({t for line in lines for t, _ in line.points})
    values = [dict(line.points) for line in lines]
    head = mark_safe("".join(format_html('<th scope="col">{}</th>', line.label) for line in lines))
    rows = []
    for t in times:
        cells = mark_safe(
            "".join(
                format_html("<td>{}</td>", _value_at(v, t, fmt) if t in v else "—") for v in values
            )
        )
        when = dt.datetime.fromtimestamp(t, tz=dt.UTC)
        rows.append(
            format_html(
                '<tr data-t="{}"><th scope="row"><time datetime="{}" data-local="seconds">{}'
                "</time></th>{}</tr>",
                f"{t:.0f}",
                when.isoformat(),
                when.strftime("%Y-%m-%d %H:%M:%S UTC"),
                cells,
            )
        )
    return format_html(
        '<details class="chart-table"><summary>{} as a table</summary>'
        '<div class="scroll-x" tabindex="0" role="region" aria-label="{} values">'
        '<table class="grid"><caption class="visually-hidden">{}</caption>'
        '<thead><tr><th scope="col">Time</th>{}</tr></thead><tbody>{}</tbody></table></div>'
        "</details>",
        label,
        label,
        label,
        head,
        mark_safe("".join(rows)) if rows else mark_safe("<tr><td>no data</td></tr>"),
    )


def line_chart(
    lines: list[Line],
    start: float,
    end: float,
    *,
    label: str,
    events: Sequence[ChartEvent] = (),
    fmt: Callable[[float], str] = lambda v: f"{v:,.0f}",
    integer: bool = True,
) -> SafeString:
    """A labelled chart of one or more series: round y-axis ticks (whole ones for counts,
    ``integer``) with grid lines, the time span, the channel's events marked (``ChartEvent``),
    values on hover (titles) and, with ``static/dlo/charts.js``, a crosshair by mouse, touch
    and keyboard; and the same values as a table for screen readers."""
    known = [v for line in lines for _, v in line.points if v is not None]
    top = max(known) if known else 0.0
    ticks = nice_ticks(top, integer=integer)
    scale = ticks[-1]
    plot = WIDTH - PAD
    drawn = [
        format_html(
            '<g class="series s-{}">{}</g>',
            line.key,
            _draw(_segments(line.points, start, end, scale, plot, HEIGHT)),
        )
        for line in lines
    ]
    grid = mark_safe(
        "".join(
            f'<line class="grid-line" x1="0" y1="{y:.1f}" x2="{plot}" y2="{y:.1f}"/>'
            for y in (HEIGHT - 1 - v / scale * (HEIGHT - 2) for v in ticks[1:])
        )
    )
    y_axis = mark_safe(
        "".join(
            format_html(
                '<span style="bottom:{}%">{}</span>',
                f"{v / scale * 100:.1f}",
                _axis_label(v, fmt),
            )
            for v in ticks
        )
    )
    last = {line.label: [v for _, v in line.points if v is not None] for line in lines}
    summary = (
        ", ".join(f"{name} last {fmt(vs[-1])}" for name, vs in last.items() if vs)
        if known
        else "no data"
    )
    legend = mark_safe(
        "".join(
            format_html('<span class="key s-{}">{}</span>', line.key, line.label) for line in lines
        )
    )
    return format_html(
        '<figure class="chart"><figcaption>{} <span class="legend">{}</span>'
        ' <span class="sub">max {}; {}</span></figcaption>'
        '<div class="plot" data-start="{}" data-end="{}" data-pad="{}" data-width="{}">'
        '<div class="y-axis" aria-hidden="true">{}</div>'
        '<svg width="100%" viewBox="0 0 {} {}" preserveAspectRatio="none" role="img"'
        ' aria-label="{}: max {}; {}"><g transform="translate({},0)">{}'
        '<line class="axis" x1="0" y1="{}" x2="{}" y2="{}"/>{}{}{}</g></svg></div>'
        '<output class="readout sub" aria-live="polite"></output>'
        '<div class="chart-x sub"><span>{} ago</span><span>now</span></div>{}</figure>',
        label,
        legend,
        fmt(top) if known else "—",
        summary,
        f"{start:.0f}",
        f"{end:.0f}",
        PAD,
        WIDTH,
        y_axis,
        WIDTH,
        HEIGHT,
        label,
        fmt(top) if known else "—",
        summary,
        PAD,
        grid,
        HEIGHT - 1,
        plot,
        HEIGHT - 1,
        _marks(list(events), start, end, plot),
        mark_safe("".join(drawn)),
        _hover_bands(lines, start, end, plot, fmt),
        fmt_duration(end - start),
        _table(lines, label, fmt),
    )


@dataclasses.dataclass
class ChartPoint:
    t: float
    backlog: float | None
    in_flight: float | None
    consumers: float | None
    dlq_depth: float | None
    poison_depth: float | None
    produced: float | None = None


FIELDS = ("backlog", "in_flight", "consumers", "dlq_depth", "poison_depth")


def _bucket(points: list[ChartPoint], start: float, end: float) -> list[ChartPoint]:
    """At most MAX_POINTS points: the last point of each bucket (gaps stay gaps)."""
    if len(points) <= MAX_POINTS:
        return points
    size = (end - start) / MAX_POINTS
    buckets: dict[int, ChartPoint] = {}
    for p in points:
        buckets[int((p.t - start) // size)] = p
    return [buckets[k] for k in sorted(buckets)]


def _rates(points: list[ChartPoint]) -> list[tuple[float, float | None]]:
    """Messages published per second between samples, from the ``produced`` counter; a reset
    (the counter went down: a broker restart) or an unknown is a gap."""
    rates: list[tuple[float, float | None]] = []
    for before, after in itertools.pairwise(points):
        if before.produced is None or after.produced is None or after.t <= before.t:
            rates.append((after.t, None))
            continue
        grown = after.produced - before.produced
        rates.append((after.t, grown / (after.t - before.t) if grown >= 0 else None))
    return rates


def _points(
    channel: Channel, range_key: str, start_dt: dt.datetime, end_dt: dt.datetime
) -> list[ChartPoint]:
    if range_key == "1h":
        rows: Any = (
            ChannelSample.objects.filter(
                channel=channel, taken_at__gte=start_dt, taken_at__lte=end_dt
            )
            .order_by("taken_at")
            .values_list("taken_at", *FIELDS, "produced")
        )
    else:
        rows = (
            ChannelRollup.objects.filter(channel=channel, minute__gte=start_dt, minute__lte=end_dt)
            .order_by("minute")
            .values_list("minute", *FIELDS)
        )
    return [ChartPoint(t.timestamp(), *values) for t, *values in rows]


#: A chosen range: at least a minute, at most the longest fixed range; samples up to this
#: span (rollups beyond, as for the fixed ranges).
MIN_WINDOW_S, MAX_WINDOW_S, RAW_WINDOW_S = 60.0, RANGES["7d"].total_seconds(), 7200.0


def _instant(raw: str) -> float | None:
    """Epoch seconds or an ISO 8601 time (UTC when it names no offset); ``None`` if neither."""
    raw = raw.strip()[:40]
    try:
        return float(int(raw))
    except (ValueError, OverflowError):
        pass
    try:
        when = dt.datetime.fromisoformat(raw)
        return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()
    except (ValueError, OverflowError):
        return None


def parse_window(params: Any, now: dt.datetime) -> tuple[tuple[float, float] | None, str]:
    """The ``from``/``to`` the page was asked for (drag-to-zoom or the range inputs), clamped
    to ``MIN_WINDOW_S``..``MAX_WINDOW_S`` ending no later than now; ``(None, why)`` when they
    are missing or unusable (the page then draws its fixed range and says why)."""
    raw_from, raw_to = params.get("from", ""), params.get("to", "")
    if not raw_from and not raw_to:
        return None, ""
    start = _instant(raw_from) if raw_from else None
    end = _instant(raw_to) if raw_to else now.timestamp()
    if start is None or end is None or not (math.isfinite(start) and math.isfinite(end)):
        return None, "That range is not a time: give from and to as dates and times (UTC)."
    end = min(end, now.timestamp())
    if end - start < MIN_WINDOW_S:
        return None, "Pick a range of at least a minute that ends before now."
    return (max(start, end - MAX_WINDOW_S), end), ""


def channel_charts(
    channel: Channel, range_key: str, window: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Context for the channel page's charts: raw samples for 1 h, minute rollups beyond; the
    inflow rate needs the raw counters, so it is drawn for 1 h only. ``window`` (epoch seconds,
    ``parse_window``) is a chosen range instead of the fixed one, shared by every chart."""
    range_key = range_key if range_key in RANGES else "1h"
    end_dt = timezone.now()
    start_dt = end_dt - RANGES[range_key]
    if window is not None:
        start_dt = dt.datetime.fromtimestamp(window[0], tz=dt.UTC)
        end_dt = dt.datetime.fromtimestamp(window[1], tz=dt.UTC)
        range_key = "1h" if window[1] - window[0] <= RAW_WINDOW_S else "custom"
    start, end = start_dt.timestamp(), end_dt.timestamp()
    points = _bucket(_points(channel, range_key, start_dt, end_dt), start, end)
    events = chart_events(channel, start_dt, end_dt)

    def series(name: str) -> Series:
        return [(p.t, getattr(p, name)) for p in points]

    charts = [
        line_chart(
            [Line("backlog", "Backlog", series("backlog")),
             Line("in-flight", "In flight", series("in_flight"))],
            start, end, label="Backlog", events=events,
        ),
        line_chart(
            [Line("dlq", "DLQ depth", series("dlq_depth")),
             Line("poison", "Poison", series("poison_depth"))],
            start, end, label="Dead letters on the broker", events=events,
        ),
    ]  # fmt: skip
    if range_key == "1h":
        charts.append(
            line_chart(
                [Line("inflow", "Inflow", _rates(points))],
                start,
                end,
                label="Inflow rate (msg/s)",
                events=events,
                fmt=lambda v: f"{v:,.1f}",
                integer=False,
            )
        )
    charts.append(
        line_chart(
            [Line("consumers", "Consumers", series("consumers"))],
            start,
            end,
            label="Consumers",
            events=events,
        )
    )
    return {
        "charts": mark_safe("".join(charts)),
        "chart_range": range_key if window is None else "",
        "chart_window": window,
        "chart_from": start_dt.strftime("%Y-%m-%dT%H:%M"),
        "chart_to": end_dt.strftime("%Y-%m-%dT%H:%M"),
        "chart_ranges": list(RANGES),
        "chart_points": len(points),
        "chart_events": events,
    }
