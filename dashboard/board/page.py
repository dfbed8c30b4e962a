"""The health board (``/``): one row per channel, worst first, filtered by team/broker/state.

``board_rows`` builds the rows with one query (channels joined with their health and broker,
as tuples: ``dashboard.board.data``); the page and the websocket push (``dashboard.board.live``)
render each row with ``dashboard.board.rows``.

Nothing here grows with the whole table: the order (worst first) is the *stored* severity of
each health row (``ChannelHealth.severity``, written when health is evaluated), raised to STALE
in SQL for rows nobody polled recently, and PostgreSQL sorts and slices it (``LIMIT``); only
the rows on screen become Python objects. The counts per state and flag are one aggregate query.

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

from django.db.models import Count, Q, QuerySet, Value
from django.db.models.functions import Greatest, Lower
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from channels_registry.access import channels_for_user
from channels_registry.health import SEVERITY, DlqFlag, HealthState, fmt_duration
from channels_registry.models import Broker, Channel, ChannelHealth
from channels_registry.polling import SPARK_MINUTES
from dashboard.board.data import BoardRow, RowChannel, RowHealth, load_rows
from dashboard.board.rows import rows_html
from dashboard.http import HtmxHttpRequest

STATE_FILTERS = [*HealthState.choices, *DlqFlag.choices]
STATES = frozenset(HealthState.values)
FLAGS = frozenset(DlqFlag.values)
FIRST_ROWS = 100
MORE_ROWS = 300


#: The board's filters on the channel itself (enabled, team, broker, ids): the keys of
#: ``Channel`` lookups, applied to health rows through ``channel__``.
Conditions = dict[str, Any]


def _flag_q(flag: str, prefix: str = "channel__") -> Q:
    """Rows carrying the DLQ ``flag`` (see ``Channel.board_flags``)."""
    return Q(**{f"{prefix}board_flags__contains": f" {flag} "})


def _health(conditions: Conditions) -> QuerySet[ChannelHealth]:
    return ChannelHealth.objects.filter(**{f"channel__{k}": v for k, v in conditions.items()})


#: Stale health rows are read one by one along the ``stale_at`` index (normally a handful);
#: past this many (a stopped scheduler) the database ranks them instead.
STALE_SCAN = 2000
#: (severity, sort name, channel id, stored state, stored flags) of one stale health row.
StaleRow = tuple[int, str, int, str, str]
STALE_FIELDS = (
    "severity",
    "sort_name",
    "channel_id",
    "channel__board_state",
    "channel__board_flags",
)


@dataclasses.dataclass
class Ranking:
    """The board's order for one request, from stored keys and indexes only.

    A row's rank is its stored ``ChannelHealth.severity``, raised to STALE's when nobody polled
    it since ``stale_at``; never-polled channels rank as UNKNOWN. The planner cannot estimate a
    moving time cut-off well (every poll moves ``stale_at`` past the statistics), so no query
    here depends on that estimate: (1) the stale rows are read along the ``stale_at`` index
    (few); (2) the head of the board walks ``health_board_order`` and skips them; (3) channels
    awaiting their first poll come from a partial index. Only a stopped scheduler (every row
    stale) falls back to ranking in SQL.
    """

    conditions: Conditions
    now: dt.datetime
    state: str = ""

    def shown(self, stored_state: str, flags: str, stale: bool) -> bool:
        """Whether a row passes the state filter (a state, or a DLQ flag it carries)."""
        if not self.state or f" {self.state} " in flags:
            return True
        return self.state == (HealthState.STALE if stale else stored_state)

    @cached_property
    def stale(self) -> list[StaleRow] | None:
        """Every stale health row under the conditions, or None past ``STALE_SCAN``."""
        fields = (
            "severity",
            "sort_name",
            "channel_id",
            "channel__board_state",
            "channel__board_flags",
        )
        rows: list[StaleRow] = list(
            _health(self.conditions)
            .filter(stale_at__lte=self.now)
            .order_by("stale_at")
            .values_list(*fields)[: STALE_SCAN + 1]
        )
        rows += (
            _health(self.conditions)
            .filter(stale_at__isnull=True)
            .values_list(*fields)[: STALE_SCAN + 1]
        )
        return rows if len(rows) <= STALE_SCAN else None

    def _filtered(self, rows: QuerySet[ChannelHealth], stale: bool) -> QuerySet[ChannelHealth]:
        if not self.state:
            return rows
        if stale:
            return rows if self.state == HealthState.STALE else rows.filter(_flag_q(self.state))
        return rows.filter(Q(state=self.state) | _flag_q(self.state))

    def unknown(self) -> QuerySet[Channel]:
        channels = Channel.objects.filter(**self.conditions, awaiting_health=True)
        return channels if self.state in ("", HealthState.UNKNOWN) else channels.none()

    def ids(self, end: int) -> list[int]:
        """The ids of the first ``end`` rows, worst first (rank, name, id)."""
        rank = SEVERITY[HealthState.STALE]
        head = self._filtered(_health(self.conditions), stale=False).order_by(
            "-severity", "sort_name", "channel_id"
        )
        stale = self.stale
        keys: list[tuple[int, str, int]]
        if stale is not None:
            skip = {row[2] for row in stale}
            keys = [
                (max(sev, rank), name, pk)
                for sev, name, pk, state, flags in stale
                if self.shown(state, flags, stale=True)
            ]
            fresh = head.values_list("severity", "sort_name", "channel_id")[: end + len(skip)]
            keys += [k for k in fresh if k[2] not in skip]
        else:
            stale_rows = _health(self.conditions).filter(
                Q(stale_at__lte=self.now) | Q(stale_at__isnull=True)
            )
            keys = [
                *head.filter(stale_at__gt=self.now).values_list(
                    "severity", "sort_name", "channel_id"
                )[:end],
                *self._filtered(stale_rows, stale=True)
                .annotate(rank=Greatest("severity", Value(rank)))
                .order_by("-rank", "sort_name", "channel_id")
                .values_list("rank", "sort_name", "channel_id")[:end],
            ]
        unknown = (
            self.unknown()
            .annotate(sort=Lower("name"))
            .order_by("sort", "pk")
            .values_list("sort", "pk")
        )
        keys += [(SEVERITY[HealthState.UNKNOWN], name, pk) for name, pk in unknown[:end]]
        keys.sort(key=lambda k: (-k[0], k[1], k[2]))
        return [pk for _, _, pk in keys[:end]]

    def counts(self) -> Counter[str]:
        """Rows per shown state and DLQ flag.

        1. Every polled channel by its stored state and flags: one aggregate over the channel
           table's narrow partial index (``Channel.board_state``), never the wide health rows.
        2. Stale rows move from their stored state to STALE (their flags stay).
        3. Never-polled channels are UNKNOWN.
        With a state filter the same, over the rows that filter shows.
        """
        polled = Channel.objects.filter(**self.conditions, awaiting_health=False)
        if self.state:
            polled = polled.filter(Q(board_state=self.state) | _flag_q(self.state, ""))
        counts: Counter[str] = Counter()
        # One row per (state, flags) combination present, a handful: the flags are split here
        # (one filtered count per state and flag made PostgreSQL match ~13 patterns per row).
        # COUNT(*), not COUNT(id): the id is not in that index, and naming it forces a read of
        # every row (12 ms at 10,000 channels) where the index alone answers (3 ms).
        combinations = polled.order_by().values_list("board_state", "board_flags")
        for state, flags, n in combinations.annotate(n=Count("*")):
            if state in STATES:
                counts[state] += n
            for flag in flags.split():
                if flag in FLAGS:
                    counts[flag] += n
        stale = self.stale
        if stale is None and not self.state:
            # A stopped scheduler (every row stale): the database moves them, one aggregate.
            stale_rows = _health(self.conditions).filter(
                Q(stale_at__lte=self.now) | Q(stale_at__isnull=True)
            )
            moved = stale_rows.order_by().values_list("channel__board_state")
            for was, n in moved.annotate(n=Count("pk")):
                counts[was] -= n
                counts[HealthState.STALE] += n
            stale = []
        elif stale is None:  # the same with a state filter: read them (see ``ids``)
            stale = list(
                _health(self.conditions)
                .filter(Q(stale_at__lte=self.now) | Q(stale_at__isnull=True))
                .values_list(
                    "severity",
                    "sort_name",
                    "channel_id",
                    "channel__board_state",
                    "channel__board_flags",
                )
                .iterator(chunk_size=2000)
            )
        for _, _, _, state, flags in stale:
            # Counted in step 1 under its stored state if that matched the filter ...
            if self.shown(state, flags, stale=False):
                counts[state] -= 1
                if self.state:
                    counts.subtract(flags.split())
            # ... and shown as stale if that matches it.
            if self.shown(state, flags, stale=True):
                counts[HealthState.STALE] += 1
                if self.state:
                    counts.update(flags.split())
        counts[HealthState.UNKNOWN] += self.unknown().count()
        return counts


def conditions_for(**filters: Any) -> Conditions:
    """The board's conditions: enabled channels, narrowed by ``filters`` (Channel lookups)."""
    return {"enabled": True, **{k: v for k, v in filters.items() if v not in ("", None)}}


def make_row(channel: Channel | RowChannel, now: dt.datetime) -> BoardRow:
    health: ChannelHealth | RowHealth | None = getattr(channel, "health", None)
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
    if health.stale_at is None or health.stale_at <= now:
        # Nobody polled recently: whatever was stored is not current, so it is not OK.
        state = HealthState.STALE
        age = (now - health.updated_at).total_seconds() if health.updated_at else None
        # A broker that cannot be polled names its cause, not the scheduler's.
        cause = (channel.broker.config_problems() or [""])[0]
        evidence = [
            disabled
            or (f"No poll for {fmt_duration(age)}: {cause}" if cause else "")
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


def board_rows(
    conditions: Conditions,
    now: dt.datetime | None = None,
    *,
    start: int = 0,
    end: int | None = None,
    state: str = "",
    ranking: Ranking | None = None,
) -> list[BoardRow]:
    """The rows ``start:end`` of the board (``end`` None: all), worst first; the database
    ranks and cuts (see ``Ranking``), then only those rows are loaded whole."""
    now = now or timezone.now()
    ranking = ranking or Ranking(conditions, now, state)
    if end is None:
        end = Channel.objects.filter(**conditions).count()
    ids = ranking.ids(end)[start:]
    loaded = load_rows(ids)
    return [make_row(loaded[pk], now) for pk in ids if pk in loaded]


def state_counts(ranking: Ranking) -> list[tuple[str, str, int]]:
    """(value, label, rows) per shown state and DLQ flag present, worst first."""
    counts = ranking.counts()
    labels = dict(STATE_FILTERS)
    order = sorted((v for v, n in counts.items() if n > 0), key=lambda v: (-SEVERITY.get(v, 0), v))
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
    # isascii: "²".isdigit() is true, yet int("²") fails.
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 7 else 0


@require_GET
def board(request: HtmxHttpRequest) -> HttpResponse:
    channels = channels_for_user(request)
    filters = {name: request.GET.get(name, "") for name in ("team", "broker", "state")}
    declared = channels.exists()
    selected = conditions_for(owner_team=filters["team"], broker__name=filters["broker"])
    now = timezone.now()
    state = filters["state"]
    query = request.GET.copy()
    for name in ("from", "all"):
        query.pop(name, None)
    start = _offset(request.GET.get("from", ""))
    if start and request.htmx:
        # The next slice of rows, appended in place of the "more" row that asked for it.
        end = start + MORE_ROWS
        more_qs = query.copy()
        more_qs["from"] = str(end)
        # One row past the slice says whether there is more; the count only then.
        ranking = Ranking(selected, now, state)
        rows = board_rows(selected, now, start=start, end=end + 1, ranking=ranking)
        more = 0
        if len(rows) > MORE_ROWS:
            total = sum(n for v, _, n in state_counts(ranking) if v in STATES)
            more = max(0, total - end)
        context_more = {
            "rows_html": rows_html(rows[:MORE_ROWS]),
            "more": more,
            "more_qs": more_qs.urlencode(),
            "query": query.urlencode(),
        }
        return render(request, "dashboard/board.html#more", context_more)
    ranking = Ranking(selected, now, state)
    counts = state_counts(ranking)
    # Every row has exactly one state (flags are extra), so the states add up to the total.
    total = sum(n for value, _, n in counts if value in STATES)
    end = total if request.GET.get("all") else FIRST_ROWS
    rows = board_rows(selected, now, end=end, ranking=ranking)
    more_qs = query.copy()
    more_qs["from"] = str(end)
    context: dict[str, Any] = {
        "rows": rows,
        "rows_html": rows_html(rows),
        "total": total,
        "more": max(0, total - end),
        "more_qs": more_qs.urlencode(),
        "counts": _count_links(counts, query),
        "filters": filters,
        "filtered": any(filters.values()),
        "declared": declared,
        "never_polled": declared and not ChannelHealth.objects.exists(),
        "teams": Channel.owner_teams(),
        "brokers": Broker.objects.order_by("name").values_list("name", flat=True),
        "states": STATE_FILTERS,
        "query": query.urlencode(),
        "can_declare": request.user.has_perm("channels_registry.add_channel"),
    }
    template = "dashboard/board.html"
    if request.htmx and not request.htmx.boosted:
        template += "#board"
    return render(request, template, context)
