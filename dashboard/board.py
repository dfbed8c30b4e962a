"""The health board (``/``): one row per channel, worst first, filtered by team/broker/state.

``board_rows`` builds the rows with one query (channels joined with their health and broker);
the websocket push (``dashboard.live``) renders the very same row partial.

A big board is sent in slices: the first response renders the worst ``FIRST_ROWS`` rows and a
count of every state and flag over all rows (each a filter link), so no unhealthy channel is
hidden; the remaining rows follow ``MORE_ROWS`` at a time when scrolled into view
(``?from=N``), or all at once without JavaScript (``?all=1``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from functools import cached_property
from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET

from channels_registry.access import channels_for_user
from channels_registry.charts import sparkline
from channels_registry.health import SEVERITY, DlqFlag, HealthState, fmt_duration
from channels_registry.models import Broker, Channel, ChannelHealth
from channels_registry.polling import SPARK_MINUTES, stale_after_s
from dashboard.http import HtmxHttpRequest

STATE_FILTERS = [*HealthState.choices, *DlqFlag.choices]
FIRST_ROWS = 100
MORE_ROWS = 300


@dataclasses.dataclass
class BoardRow:
    channel: Channel
    health: ChannelHealth | None
    state: str
    state_label: str
    evidence: list[str]
    dlq_flags: list[tuple[str, str]]
    severity: int
    spark_points: list[tuple[float, float | None]]
    spark_start: float
    spark_end: float
    last_sample_at: dt.datetime | None
    last_sample_age_s: float | None
    eta: str

    @cached_property
    def spark(self) -> SafeString:
        """Drawn only for rows that are rendered (the SVG is the costly part of a row)."""
        return sparkline(self.spark_points, self.spark_start, self.spark_end)

    @property
    def dom_id(self) -> str:
        return f"ch-{self.channel.pk}"

    @property
    def stale(self) -> bool:
        return self.state in (HealthState.STALE, HealthState.UNKNOWN)


def board_channels(channels: QuerySet[Channel]) -> QuerySet[Channel]:
    """The one query behind the board: channel + broker + health, minus the health window."""
    return (
        channels.filter(enabled=True)
        .select_related("broker", "health")
        .defer("health__window", "health__observed", "health__observed_findings")
    )


def make_row(channel: Channel, now: dt.datetime) -> BoardRow:
    health: ChannelHealth | None = getattr(channel, "health", None)
    disabled = (
        f"Broker {channel.broker.name} is disabled: its channels are not polled."
        if not channel.broker.enabled
        else ""
    )
    if health is None:
        return BoardRow(
            channel,
            None,
            HealthState.UNKNOWN,
            HealthState.UNKNOWN.label,
            [disabled or "No sample yet: waiting for the first poll."],
            [],
            SEVERITY[HealthState.UNKNOWN],
            [],
            0,
            1,
            None,
            None,
            "—",
        )
    state = HealthState(health.state)
    evidence = list(health.evidence or [])
    flags = [(f, DlqFlag(f).label) for f in health.dlq_flags or [] if f in DlqFlag.values]
    severity = health.severity
    limit = stale_after_s(channel.broker)
    if health.updated_at is None or (now - health.updated_at).total_seconds() > limit:
        # Nobody polled recently: whatever was stored is not current, so it is not OK.
        state = HealthState.STALE
        age = (now - health.updated_at).total_seconds() if health.updated_at else None
        evidence = [
            disabled
            or f"No poll for {fmt_duration(age)}: is the scheduler running?"
            " (python manage.py poll --once)"
        ]
        severity = max(severity, SEVERITY[HealthState.STALE])
    end = now.replace(second=0, microsecond=0).timestamp()
    start = end - SPARK_MINUTES * 60
    spark = [(p[0], p[1]) for p in health.spark or []]
    if health.eta_s is not None:
        eta = fmt_duration(health.eta_s)
    elif health.backlog and health.drain_rate is not None and health.drain_rate <= 0:
        eta = "not draining"
    else:
        eta = "—"
    return BoardRow(
        channel,
        health,
        state,
        state.label,
        evidence,
        flags,
        severity,
        spark,
        start,
        end,
        health.last_sample_at,
        (now - health.last_sample_at).total_seconds() if health.last_sample_at else None,
        eta,
    )


def board_rows(channels: QuerySet[Channel], now: dt.datetime | None = None) -> list[BoardRow]:
    now = now or timezone.now()
    rows = [make_row(c, now) for c in board_channels(channels)]
    rows.sort(key=lambda r: (-r.severity, r.channel.name.lower(), r.channel.pk))
    return rows


def state_counts(rows: list[BoardRow]) -> list[tuple[str, str, int]]:
    """(value, label, rows) per health state and DLQ flag present, worst first."""
    counts: Counter[str] = Counter()
    for r in rows:
        counts[r.state] += 1
        counts.update(f for f, _ in r.dlq_flags)
    labels = dict(STATE_FILTERS)
    order = sorted(counts, key=lambda v: (-SEVERITY.get(v, 0), v))
    return [(v, labels.get(v, v), counts[v]) for v in order]


def _count_links(counts: list[tuple[str, str, int]], query: Any) -> list[tuple[str, str, int, str]]:
    """Each count with the query string of the board filtered to it."""
    links = []
    for value, label, n in counts:
        qs = query.copy()
        qs["state"] = value
        links.append((value, label, n, qs.urlencode()))
    return links


def _offset(raw: str) -> int:
    return int(raw) if raw.isdigit() and len(raw) < 7 else 0


@require_GET
def board(request: HtmxHttpRequest) -> HttpResponse:
    channels = channels_for_user(request)
    filters = {name: request.GET.get(name, "") for name in ("team", "broker", "state")}
    declared = channels.exists()
    selected = channels
    if filters["team"]:
        selected = selected.filter(owner_team=filters["team"])
    if filters["broker"]:
        selected = selected.filter(broker__name=filters["broker"])
    rows = board_rows(selected)
    if filters["state"]:
        rows = [
            r
            for r in rows
            if r.state == filters["state"] or filters["state"] in {f for f, _ in r.dlq_flags}
        ]
    query = request.GET.copy()
    for name in ("from", "all"):
        query.pop(name, None)
    start = _offset(request.GET.get("from", ""))
    if start and request.htmx:
        # The next slice of rows, appended in place of the "more" row that asked for it.
        end = start + MORE_ROWS
        more_qs = query.copy()
        more_qs["from"] = str(end)
        context_more = {
            "rows": rows[start:end],
            "more": max(0, len(rows) - end),
            "more_qs": more_qs.urlencode(),
            "query": query.urlencode(),
        }
        return render(request, "dashboard/board.html#more", context_more)
    end = len(rows) if request.GET.get("all") else FIRST_ROWS
    more_qs = query.copy()
    more_qs["from"] = str(end)
    context: dict[str, Any] = {
        "rows": rows[:end],
        "total": len(rows),
        "more": max(0, len(rows) - end),
        "more_qs": more_qs.urlencode(),
        "counts": _count_links(state_counts(rows), query),
        "filters": filters,
        "filtered": any(filters.values()),
        "declared": declared,
        "never_polled": declared and not ChannelHealth.objects.exists(),
        "teams": channels.exclude(owner_team="")
        .order_by("owner_team")
        .values_list("owner_team", flat=True)
        .distinct(),
        "brokers": Broker.objects.order_by("name").values_list("name", flat=True),
        "states": STATE_FILTERS,
        "query": query.urlencode(),
        "can_declare": request.user.has_perm("channels_registry.add_channel"),
    }
    template = "dashboard/board.html"
    if request.htmx and not request.htmx.boosted:
        template += "#board"
    return render(request, template, context)
