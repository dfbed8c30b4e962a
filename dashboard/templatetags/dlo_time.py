"""``{{ value|when }}``: a time as ``<time>`` in UTC that ``static/dlo/ui.js`` shows in the
viewer's own time zone, with the UTC time kept on hover (title). Without JavaScript the UTC
text stays, labelled as such."""

from __future__ import annotations

import datetime as dt

from django import template
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

FORMATS = {
    "seconds": "%Y-%m-%d %H:%M:%S",
    "minutes": "%Y-%m-%d %H:%M",
    "time": "%H:%M",
    "date": "%Y-%m-%d",
}


def _formatted(utc: dt.datetime, iso: str, style: str) -> str:
    """``utc.strftime(FORMATS[style])``, cut from its ``isoformat()`` ("2026-12-03T07:51:00…"):
    a third of the cost, and the failure groups page shows two times per row. Below the year
    1000 ``strftime`` does not pad the year, so those go through it."""
    if utc.year < 1000:
        return utc.strftime(FORMATS[style])
    if style == "date":
        return iso[:10]
    if style == "time":
        return iso[11:16]
    return f"{iso[:10]} {iso[11:19] if style == 'seconds' else iso[11:16]}"


@register.filter
def when(value: dt.datetime | None, style: str = "minutes") -> SafeString | str:
    if not isinstance(value, dt.datetime):
        return "—"
    style = style if style in FORMATS else "minutes"
    utc = value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    iso = utc.isoformat()
    # Only digits, "-", ":", "+", "." and spaces, and ``style`` is one of FORMATS' keys:
    # nothing to escape (format_html's escaping cost a long list ~50 µs per time).
    return mark_safe(
        f'<time datetime="{iso}" data-local="{style}" title="{_formatted(utc, iso, "seconds")}'
        f' UTC">{_formatted(utc, iso, style)} UTC</time>'
    )


@register.filter
def epoch_when(value: float | None, style: str = "seconds") -> SafeString | str:
    """``when`` for epoch seconds (chart events)."""
    if value is None:
        return "—"
    return when(dt.datetime.fromtimestamp(value, tz=dt.UTC), style)
