"""The failure groups page's rows as HTML (up to ``GROUPS_SHOWN`` per page), built in Python
for the reason ``dashboard.html`` gives: through the template engine, 200 rows cost more than
every query of the page. Each value is escaped as the template escaped it; broker-supplied text
(the sample's error message) is already passed through ``visible`` by the view."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from django.template.defaultfilters import truncatechars
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from dashboard.html import escape
from dashboard.templatetags.dlo_time import when

ARROWS = {"up": "▲", "down": "▼"}


def _group_cells(group: Any, entries: str) -> str:
    kind = f"<code>{escape(group.message_type)}</code> · " if group.message_type else ""
    error = (
        f'<div class="sub dlq-clip">{escape(truncatechars(group.normalized_error, 160))}</div>'
        if group.normalized_error
        else ""
    )
    return (
        f"      <td>{kind}{escape(group.reason or '—')}</td>\n"
        f'      <td><a href="{entries}"><code>{escape(group.error_class or "(no error class)")}'
        f"</code></a>{error}</td>\n"
        f'      <td class="num"><a href="{entries}" aria-label="{group.open_count} open of'
        f' {group.count}"><strong>{group.open_count}</strong></a> / <a href="{entries}">'
        f"{group.count}</a></td>\n"
    )


class _Urls:
    """The URLs of the rows, each pattern reversed once per page (ids are digits)."""

    def __init__(self) -> None:
        self.entries = reverse("dlq:entry_list")
        self.entry = reverse("dlq:entry_detail", args=[0]).replace("/0/", "/{}/")
        # A placeholder slug, reversed once: ``<slug:slug>`` matches only [-a-zA-Z0-9_], which
        # ``quote`` leaves as they are (as ``reverse`` would), and it escapes anything else.
        self._channel = reverse("channel_detail", args=["slug"]).replace("/slug/", "/{}/")

    def channel(self, slug: str) -> str:
        return escape(self._channel.format(quote(slug, safe="")))


def _row(row: dict[str, Any], urls: _Urls) -> str:
    group = row["group"]
    slug = escape(group.channel.slug)
    channel_url = urls.channel(group.channel.slug)
    entries = escape(f"{urls.entries}?group={group.pk}")
    trend = row["trend"]
    sample = ""
    if group.sample_id:
        url = escape(urls.entry.format(int(group.sample_id)))
        text = f'<div class="sub dlq-clip">{escape(row["sample"])}</div>' if row["sample"] else ""
        sample = f'<a href="{url}">#{group.sample_id}</a>{text}'
    return (
        "\n    <tr>\n"
        f'      <td><a href="{channel_url}">{slug}</a></td>\n'
        f"{_group_cells(group, entries)}"
        f'      <td class="num"><span class="trend trend-{escape(trend)}" title="previous 24 h:'
        f' {row["previous"]}">{row["recent"]} {ARROWS.get(trend, "=")} {row["previous"]}'
        "</span></td>\n"
        f"      <td>{when(group.first_seen)}</td>\n"
        f"      <td>{when(group.last_seen)}</td>\n"
        f"      <td>{sample}</td>\n"
        "    </tr>\n  "
    )


def group_rows_html(rows: list[dict[str, Any]]) -> SafeString:
    """The ``<tr>`` of each row (``group``, ``recent``, ``previous``, ``trend``, ``sample``)."""
    urls = _Urls()
    return mark_safe("".join(_row(r, urls) for r in rows))  # every value escaped above
