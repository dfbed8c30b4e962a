"""HTML for the few long lists the pages render row by row (the board's rows, the failure
groups, a select of every channel): built in Python because Django's template engine costs
5–10 µs per variable, tag and filter, which a 100–10,000-row list multiplies into most of the
page's time (docs/performance.md, "Board and DLQ groups"). Markup stays in one place per list;
every interpolated value is escaped here exactly as the project's template engine escapes it:
invisible and direction-changing characters shown as markers (``dashboard.text.visible``), then
HTML-escaped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape as _html_escape
from typing import Any
from urllib.parse import quote

from django.db.models import QuerySet
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from dashboard.text import visible


def escape(value: Any) -> str:
    """Django's ``escape`` (the same five characters replaced) without its lazy-string wrapper,
    which costs more than the rest of a row, after ``visible``, as the project's engine does
    for every template variable."""
    return _html_escape(visible(str(value)))


class ChannelLinks:
    """Channel page URLs for a list of rows, escaped for an attribute: the pattern is reversed
    once per list (``reverse`` per row cost ~10 µs, a tenth of a board row)."""

    def __init__(self) -> None:
        # A placeholder slug: ``<slug:slug>`` matches only [-a-zA-Z0-9_], which ``quote``
        # leaves as they are (as ``reverse`` would), and it escapes anything else.
        self._pattern = reverse("channel_detail", args=["slug"]).replace("/slug/", "/{}/")

    def __call__(self, slug: str) -> str:
        return escape(self._pattern.format(quote(slug, safe="")))


def options(values: Iterable[str], selected: str) -> SafeString:
    """``<option>`` per value (label = value), ``selected`` marked: what
    ``{% for c in values %}<option value="{{ c }}"{% if c == selected %} selected{% endif %}>
    {{ c }}</option>{% endfor %}`` renders. A select of every channel holds 10,000 values:
    they are escaped in one pass over the joined text (split on newlines, which ``escape``
    keeps and no value holds — else one by one)."""
    values = [str(v) for v in values]
    joined = "\n".join(values)
    if joined.count("\n") == max(0, len(values) - 1):
        texts = escape(joined).split("\n") if values else []
    else:
        texts = [escape(v) for v in values]
    return mark_safe(  # every value escaped above
        "".join(
            f'<option value="{text}"{" selected" if value == selected else ""}>{text}</option>'
            for value, text in zip(values, texts, strict=True)
        )
    )


#: Past this many channels the channel filter is a text field for the slug: a select of
#: 10,000 options is ~500 KB on every DLQ page, and nobody scrolls it to find one.
CHANNEL_SELECT_MAX = 500


def channel_filter(slugs: Sequence[str] | QuerySet[Any, str], selected: str) -> SafeString:
    """The DLQ pages' channel filter: a select of every channel while there are at most
    ``CHANNEL_SELECT_MAX`` (at most that many + 1 are read), else a search field holding the
    chosen slug, so the page's size does not grow with the channel table."""
    shown = list(slugs[: CHANNEL_SELECT_MAX + 1])
    if len(shown) <= CHANNEL_SELECT_MAX:
        return mark_safe(  # options() escapes every value
            '<select name="channel" aria-label="Channel"><option value="">All channels</option>'
            f"{options(shown, selected)}</select>"
        )
    return mark_safe(  # the one value is escaped
        f'<input type="search" name="channel" value="{escape(selected)}" size="18" '
        f'placeholder="Channel slug (over {CHANNEL_SELECT_MAX:,} channels)" aria-label="Channel">'
    )
