"""The failure groups page's rows as HTML (up to ``GROUPS_SHOWN`` per page), built in Python
for the reason ``dashboard.html`` gives: through the template engine, 200 rows cost more than
every query of the page. Each value is escaped as the template escaped it; broker-supplied text
goes through ``visible`` first (the sample's error message in the view, the rest here)."""

from __future__ import annotations

import datetime as dt
from typing import Any, NamedTuple

from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from dashboard.html import ChannelLinks, escape
from dashboard.templatetags.dlo_time import when
from dlq.text.render import visible
from dlq.triage.entries_html import clipped

ARROWS = {"up": "▲", "down": "▼"}
#: The trend in words beside its arrow: "350 ▲ up from 0" reads without a legend.
TREND_WORDS = {"up": "up from", "down": "down from"}


class Group(NamedTuple):
    """What a row shows of a group: loaded as tuples (``GROUP_FIELDS``), not model instances, which
    cost twice the query for 200 groups and their channels."""

    id: int
    channel_slug: str
    reason: str
    error_class: str
    normalized_error: str
    total: int  # ``count``: a tuple has a method of that name
    open_count: int
    first_seen: dt.datetime
    last_seen: dt.datetime
    message_type: str
    sample_id: int | None


#: The ``values_list`` fields of a ``Group``, in order.
GROUP_FIELDS = (
    "id", "channel__slug", "reason", "error_class", "normalized_error", "count", "open_count",
    "first_seen", "last_seen", "message_type", "sample_id",
)  # fmt: skip


def _group_cells(group: Group, entries: str) -> str:
    """Reason, error class, message type and error come from the broker's dead letters: like
    the entry list, control and direction-changing characters are shown as markers."""
    kind = f"<code>{escape(visible(group.message_type))}</code> · " if group.message_type else ""
    error = (
        f'<div class="sub dlq-clip">{clipped(group.normalized_error, 160)}</div>'
        if group.normalized_error
        else ""
    )
    error_class = visible(group.error_class or "(no error class)")
    return (
        f"      <td>{kind}{escape(visible(group.reason or '—'))}</td>\n"
        f'      <td><a href="{entries}"><code>{escape(error_class)}'
        f"</code></a>{error}</td>\n"
        f'      <td class="num"><a href="{entries}" aria-label="{group.open_count} open of'
        f' {group.total}"><strong>{group.open_count}</strong></a> / <a href="{entries}">'
        f"{group.total}</a></td>\n"
    )


class _Urls:
    """The URLs of the rows, each pattern reversed once per page (ids are digits)."""

    def __init__(self) -> None:
        self.entries = reverse("dlq:entry_list")
        self.entry = reverse("dlq:entry_detail", args=[0]).replace("/0/", "/{}/")
        self.channel = ChannelLinks()


def _row(row: dict[str, Any], urls: _Urls) -> str:
    group: Group = row["group"]
    slug = escape(group.channel_slug)
    channel_url = urls.channel(group.channel_slug)
    entries = escape(f"{urls.entries}?group={group.id}")
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
        f'      <td class="num"><span class="trend trend-{escape(trend)}">{row["recent"]}'
        f' <span aria-hidden="true">{ARROWS.get(trend, "=")}</span></span>'
        f' <span class="sub">{TREND_WORDS.get(trend, "same as")} {row["previous"]}'
        " the day before</span></td>\n"
        f"      <td>{when(group.first_seen)}</td>\n"
        f"      <td>{when(group.last_seen)}</td>\n"
        f"      <td>{sample}</td>\n"
        "    </tr>\n  "
    )


def group_rows_html(rows: list[dict[str, Any]]) -> SafeString:
    """The ``<tr>`` of each row (``group``, ``recent``, ``previous``, ``trend``, ``sample``)."""
    urls = _Urls()
    return mark_safe("".join(_row(r, urls) for r in rows))  # every value escaped above
