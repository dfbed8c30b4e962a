"""One health-board row as HTML: the page, its slices (htmx) and the websocket push
(``dashboard.board.live``) all render rows here, so a pushed row is the very row the page shows.

Written in Python rather than as a template partial on purpose: the board renders 100 rows per
first screen (and every row of ``?all=1``), and Django's template engine spent ~1 ms per row
resolving its ~40 variables, filters and tags, more than the queries of the whole page
(docs/performance.md, "Board and DLQ groups"). The markup is the old partial's, byte for byte.
Every value from the database or a broker goes through ``escape`` (Django's, see
``dashboard.html``), evidence also through ``visible`` (control and direction-changing
characters shown as markers); the sparkline is already safe SVG.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import TYPE_CHECKING, Any

from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from channels_registry.health import fmt_duration
from channels_registry.templatetags.dlo_health import num
from dashboard.board.versions import row_digest
from dashboard.html import ChannelLinks, escape
from dlq.text.render import visible

if TYPE_CHECKING:
    from dashboard.board.data import BoardRow

_DASH = "—"


def _duration(value: float | None) -> str:
    """The template filter ``duration``: "—" for unknown."""
    return _DASH if value is None else fmt_duration(float(value))


def _channel_cell(row: BoardRow, links: ChannelLinks) -> str:
    channel = row.channel
    team = f" · {escape(channel.owner_team)}" if channel.owner_team else ""
    return (
        f'<td data-label="Channel"><a href="{links(channel.slug)}">{escape(channel.name)}</a>'
        f'<div class="sub">{escape(channel.broker.name)}{team}</div></td>'
    )


def _state_cell(row: BoardRow) -> str:
    flags = "".join(
        f' <span class="state state-{escape(value)}">{escape(label)}</span>'
        for value, label in row.dlq_flags
    )
    evidence = (
        f'<div class="evidence sub">{escape(visible(str(row.evidence[0])))}</div>'
        if row.evidence
        else ""
    )
    return (
        f'<td data-label="State"><span class="state state-{escape(row.state)}">'
        f"{escape(row.state_label)}</span>{flags}{evidence}</td>"
    )


def _stored(depth: Any, unresolved: Any) -> str:
    """The broker's depth, then the stored dead letters awaiting triage (if any)."""
    extra = f'<div class="stored">+{num(unresolved)} stored</div>' if unresolved else ""
    return f"{num(depth)}{extra}"


def _retrying(count: Any, unknown: str) -> str:
    """Messages waiting for a retry (stored by the poll), or "unknown" with the reason."""
    if count is not None:
        return num(count)
    if not unknown:
        return _DASH
    return f'unknown<div class="sub why">{escape(unknown)}</div>'


def _number_cells(row: BoardRow) -> str:
    h = row.health
    if h is None:
        return (
            f'<td class="n" data-label="Backlog">{_DASH}</td>\n'
            f'<td class="n" data-label="In flight">{_DASH}</td>\n'
            f'<td class="n" data-label="Consumers">{_DASH}</td>\n'
            f'<td class="n" data-label="Oldest / lag">{_DASH}</td>\n'
            f'<td class="n" data-label="Retrying">{_DASH}</td>\n'
            f'<td class="n" data-label="DLQ">{_DASH}</td>\n'
            f'<td class="n" data-label="Poison">{_DASH}</td>\n'
        )
    if h.oldest_age_s is not None:
        oldest = _duration(h.oldest_age_s)
    elif h.lag_s is not None:
        oldest = f"~{_duration(h.lag_s)}"
    else:
        oldest = _DASH
    return (
        f'<td class="n" data-label="Backlog">{num(h.backlog)}</td>\n'
        f'<td class="n" data-label="In flight">{num(h.in_flight)}</td>\n'
        f'<td class="n" data-label="Consumers">{num(h.active_consumers)} / {num(h.consumers)}'
        "</td>\n"
        f'<td class="n" data-label="Oldest / lag">{escape(oldest)}</td>\n'
        f'<td class="n" data-label="Retrying">{_retrying(h.retry_waiting, h.retry_unknown)}</td>\n'
        f'<td class="n" data-label="DLQ">{_stored(h.dlq_depth, h.dlq_unresolved)}</td>\n'
        f'<td class="n" data-label="Poison">{_stored(h.poison_depth, h.poison_unresolved)}'
        "</td>\n"
    )


@functools.lru_cache(maxsize=256)
def _clock(when: dt.datetime, zone: dt.tzinfo) -> tuple[str, str]:
    """A sample time in ``zone``: ISO and as shown, escaped. Every row of a poll shares one
    sample time, so a pushed batch formats it once, not once per row (~40 µs each)."""
    at = timezone.localtime(when, zone)
    text = f"{at:%b} {at.day}, {at:%H:%M:%S} {at.tzname() or ''}".rstrip()
    return escape(at.isoformat()), escape(text)


def _sample_cell(row: BoardRow) -> str:
    """The time of the last sample, as a clock time (still true on a page that never updates);
    the page shows its age from ``datetime`` and moves it when the broker's next poll is pushed
    (``data-broker``, ``static/dlo/board.js``), so the row need not be pushed for it."""
    if not row.last_sample_at:
        return '<td data-label="Last sample">never</td>'
    iso, text = _clock(row.last_sample_at, timezone.get_current_timezone())
    return (
        f'<td data-label="Last sample"><time datetime="{iso}" data-age'
        f' data-broker="{int(row.channel.broker.pk)}">{text}</time></td>'
    )


def row_html(row: BoardRow, oob: bool = False, links: ChannelLinks | None = None) -> SafeString:
    """The row's ``<tr>`` (``oob``: marked for an htmx out-of-band swap, as pushed); ``links``
    shared by the rows of one list. The ``<tr>`` carries the row's version (``data-v``,
    ``dashboard.board.versions``), the same in the page and in a push."""
    stale = " is-stale" if row.stale else ""
    head = f'\n<tr id="{escape(row.dom_id)}" class="row-{escape(row.state)}{stale}"'
    body = (
        f"{_channel_cell(row, links or ChannelLinks())}\n"
        f"{_state_cell(row)}\n"
        f"{_number_cells(row)}"
        f'<td data-label="Backlog, 1 h">{row.spark}</td>\n'
        f'<td data-label="Drain ETA">{escape(row.eta)}</td>\n'
        f"{_sample_cell(row)}\n"
        "</tr>\n"
    )
    version = row_digest(f"{head}>\n{body}")  # hex digits
    swap = ' hx-swap-oob="true"' if oob else ""
    # Every interpolated value above and here is escaped.
    return mark_safe(f'{head} data-v="{version}"{swap}>\n{body}')


def rows_html(rows: list[BoardRow]) -> SafeString:
    """Every row, in order."""
    links = ChannelLinks()
    return mark_safe("".join(row_html(r, links=links) for r in rows))  # each row is escaped
