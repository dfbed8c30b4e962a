"""``{{ value|when }}``: a time as ``<time>`` in UTC that ``static/dlo/ui.js`` shows in the
viewer's own time zone, with the UTC time kept on hover (title). Without JavaScript the UTC
text stays, labelled as such."""

from __future__ import annotations

import datetime as dt

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

FORMATS = {
    "seconds": "%Y-%m-%d %H:%M:%S",
    "minutes": "%Y-%m-%d %H:%M",
    "time": "%H:%M",
    "date": "%Y-%m-%d",
}


@register.filter
def when(value: dt.datetime | None, style: str = "minutes") -> SafeString | str:
    if not isinstance(value, dt.datetime):
        return "—"
    style = style if style in FORMATS else "minutes"
    utc = value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return format_html(
        '<time datetime="{}" data-local="{}" title="{} UTC">{} UTC</time>',
        utc.isoformat(),
        style,
        utc.strftime(FORMATS["seconds"]),
        utc.strftime(FORMATS[style]),
    )


@register.filter
def epoch_when(value: float | None, style: str = "seconds") -> SafeString | str:
    """``when`` for epoch seconds (chart events)."""
    if value is None:
        return "—"
    return when(dt.datetime.fromtimestamp(value, tz=dt.UTC), style)
