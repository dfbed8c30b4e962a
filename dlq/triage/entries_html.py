"""The entry list's rows as HTML (``PAGE_SIZE`` per page), built in Python for the reason
``dashboard.html`` gives: through the template engine the 50 rows cost more than every query of
the page (~25 variables, filters and tags per row). The markup is what the template's row loop
rendered, byte for byte (``tests/dlq/triage/test_entry_rows.py`` renders both); each value is
escaped as the engine escaped it, and broker-supplied text goes through ``visible`` first."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.template.defaultfilters import date, filesizeformat, truncatechars, urlencode
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import localtime

from dashboard.html import escape
from dashboard.templatetags.dlo_time import when
from dlq.models import Source, Status
from dlq.text.render import visible

SOURCES = dict(Source.choices)
STATUSES = dict(Status.choices)


def truncate(text: str, length: int) -> str:
    """``text|truncatechars:length`` (``length`` > 0). ASCII text is already NFC and has no
    combining characters, so Django's ``Truncator`` (NFC-normalises, then walks every
    character) comes down to a slice; anything else still goes through it."""
    if not text.isascii():
        return truncatechars(text, length)
    return text[: length - 1] + "…" if len(text) > length else text


def clipped(value: Any, length: int) -> str:
    """``value|visible|truncatechars:length``, escaped."""
    return escape(truncate(visible(value or ""), length))


def _id_cell(entry: Any, detail: str) -> str:
    badge = ""
    if entry.is_repeat_offender:
        badge = (
            f' <span class="badge badge-error" title="replayed {entry.generation} times, back'
            ' every time">repeat offender</span>'
        )
    elif entry.parent_id:
        badge = (
            f' <span class="badge" title="a replay of #{entry.parent_id} that dead-lettered'
            f' again">replay of #{entry.parent_id}</span>'
        )
    return f'<td data-label="#"><a href="{detail.format(entry.pk)}">{entry.pk}</a>{badge}</td>'


def _status_cell(entry: Any, warn: bool) -> str:
    label = escape(STATUSES.get(entry.status, entry.status))
    if entry.purged_at:
        label += ' <span class="badge">purged</span>'
    elif warn:
        at = escape(date(localtime(entry.eviction_at()), "Y-m-d H:i"))
        label += (
            f' <span class="badge badge-warning" title="payload purged at {at}">evicts soon</span>'
        )
    return f'<td data-label="Status">{label}</td>'


def _type_cell(entry: Any, channel_param: str) -> str:
    if not entry.message_type:
        return '<td data-label="Type">—</td>'
    href = f"?{channel_param}type={escape(urlencode(entry.message_type))}"
    return (
        f'<td data-label="Type"><a href="{href}"><code>{clipped(entry.message_type, 60)}</code></a>'
        "</td>"
    )


def _error_cell(entry: Any) -> str:
    reason = visible(entry.reason or "")
    cell = escape(reason or "—")
    if entry.error_class:
        cell += f" · <code>{clipped(entry.error_class, 80)}</code>"
    if entry.error_message:
        cell += f'<div class="sub dlq-clip">{clipped(entry.error_message, 140)}</div>'
    return f'<td data-label="Reason / error">{cell}</td>'


def _key_cell(entry: Any) -> str:
    if entry.missing_idempotency_key:
        return (
            '<td data-label="Idempotency key"><span class="badge badge-error">missing</span></td>'
        )
    return (
        f'<td data-label="Idempotency key"><code>{clipped(entry.idempotency_key, 40)}</code></td>'
    )


def _row(entry: Any, warn: bool, detail: str, channel_param: str, can_bulk: bool) -> str:
    select = (
        f'<td class="select"><input type="checkbox" name="id" value="{entry.pk}" form="bulk"'
        f' aria-label="Select entry {entry.pk}"></td>'
        if can_bulk
        else ""
    )
    kind = "badge-error" if entry.source == Source.POISON else "badge-warning"
    source = escape(SOURCES.get(entry.source, entry.source))
    dead_lettered: dt.datetime | None = entry.dead_lettered_at
    return (
        "\n    <tr>\n"
        f"      {select}\n"
        f"      {_id_cell(entry, detail)}\n"
        f'      <td data-label="Channel">{escape(entry.channel.slug)}</td>\n'
        f'      <td data-label="Source"><span class="badge {kind}">{source}</span></td>\n'
        f"      {_status_cell(entry, warn)}\n"
        f"      {_type_cell(entry, channel_param)}\n"
        f"      {_error_cell(entry)}\n"
        f"      {_key_cell(entry)}\n"
        f'      <td data-label="Dead-lettered">{when(dead_lettered, "seconds")}</td>\n'
        f'      <td class="num" data-label="Size">{escape(filesizeformat(entry.size))}</td>\n'
        "    </tr>\n  "
    )


def entry_rows_html(rows: list[tuple[Any, bool]], channel: str, can_bulk: bool) -> SafeString:
    """The ``<tr>`` of each ``(entry, near eviction)``; ``channel`` is the filter's channel
    slug (the message-type links keep it)."""
    detail = escape(reverse("dlq:entry_detail", args=[0]).replace("/0/", "/{}/"))
    channel_param = f"channel={escape(urlencode(channel))}&amp;" if channel else ""
    return mark_safe(  # every value escaped above
        "".join(_row(entry, warn, detail, channel_param, can_bulk) for entry, warn in rows)
    )
