"""The one definition of "which entries": list page, API and (later) bulk actions all use it,
so the count a page shows is exactly what a bulk action on that filter would act on.

Pagination is keyset on ``id`` descending (``?after=<id>``): each page is an index range scan,
never ``OFFSET``; there is no exact ``COUNT(*)`` per page, only an approximate total on the
first page (see ``approximate_total``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from channels_registry.models import Channel
from dlq.models import DeadLetter, EntryState, SearchText, Source, Status

PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
# The list's count stops here ("more than 1,000"): counting further cost more than the page
# itself on a broad filter. The bulk-action preview always counts exactly.
COUNT_CAP = 1_000
# A text search counts to 200 ("more than 200"): its walk reads about cap ÷ density rows of
# the search index newest first, each text matched again, so a broad term (2 % of 1M entries)
# read ~50,000 texts for a count of 1,000 (142 ms p95) and reads ~10,000 for 200.
SEARCH_COUNT_CAP = 200
MIN_SEARCH = 3  # shorter terms cannot use the trigram index


def _parse_when(raw: str) -> dt.datetime | None:
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = parse_datetime(raw)
        if value is None:
            day = parse_date(raw)
            value = dt.datetime.combine(day, dt.time()) if day else None
    except ValueError:
        return None
    if value is not None and timezone.is_naive(value):
        value = timezone.make_aware(value, dt.UTC)
    try:
        # A time that exists in UTC too: 9999-12-31T23:59:59-14:00 does not, and would fail
        # in the query (a 500) instead of here.
        return value.astimezone(dt.UTC) if value is not None else None
    except OverflowError:
        return None


def parse_id(raw: Any) -> int | None:
    """A positive 64-bit id from untrusted text, else None (never raises: ``"²".isdigit()``
    is true, yet ``int("²")`` fails)."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return None
    return value if 0 < value < 2**63 else None


@dataclasses.dataclass
class EntryFilter:
    channel: str = ""
    source: str = ""
    status: str = ""
    group: int | None = None
    reason: str = ""
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    idempotency_key: str = ""
    message_type: str = ""
    q: str = ""
    errors: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> EntryFilter:
        def get(name: str) -> str:
            return str(params.get(name, "") or "").strip()[:500]

        f = cls(
            channel=get("channel"),
            source=get("source") if get("source") in Source.values else "",
            status=get("status") if get("status") in Status.values else "",
            group=parse_id(get("group")),
            reason=get("reason")[:100],
            since=_parse_when(get("since")),
            until=_parse_when(get("until")),
            idempotency_key=get("key")[:255],
            message_type=get("type")[:200],
            q=get("q")[:200],
        )
        if get("since") and f.since is None:
            f.errors.append("'since' is not a date or date-time; ignored.")
        if get("until") and f.until is None:
            f.errors.append("'until' is not a date or date-time; ignored.")
        if f.q and len(f.q) < MIN_SEARCH:
            f.errors.append(f"Search needs at least {MIN_SEARCH} characters; ignored.")
        return f

    @property
    def search(self) -> str:
        return self.q.lower() if len(self.q) >= MIN_SEARCH else ""

    @property
    def is_empty(self) -> bool:
        return not any(
            [self.channel, self.source, self.status, self.group, self.reason, self.since]
            + [self.until, self.idempotency_key, self.message_type, self.search]
        )

    def apply(self, entries: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
        if self.channel:
            # A concrete id, not a join on the slug: the planner then walks the (channel, id)
            # index instead of scanning every entry backwards for a channel that may not exist.
            channel_id = (
                Channel.objects.filter(slug=self.channel).values_list("pk", flat=True).first()
            )
            if channel_id is None:
                return entries.none()
            entries = entries.filter(channel_id=channel_id)
        if self.source:
            entries = entries.filter(source=self.source)
        if self.status:
            entries = entries.filter(state__status=self.status)
        if self.group:
            entries = entries.filter(group_id=self.group)
        if self.reason:
            entries = entries.filter(reason=self.reason)
        if self.since:
            entries = entries.filter(dead_lettered_at__gte=self.since)
        if self.until:
            entries = entries.filter(dead_lettered_at__lt=self.until)
        if self.idempotency_key:
            entries = entries.filter(idempotency_key=self.idempotency_key)
        if self.message_type:
            entries = entries.filter(message_type=self.message_type)
        if self.search:
            # The text is stored lower-cased in the narrow SearchText table, whose trigram
            # GIN index (PostgreSQL) serves a plain LIKE.
            matches = SearchText.objects.filter(text__contains=self.search)
            entries = entries.filter(pk__in=matches.values("entry_id"))
        return entries

    def params(self) -> dict[str, str]:
        """The filter as URL parameters (only the set ones)."""
        raw = {
            "channel": self.channel,
            "source": self.source,
            "status": self.status,
            "group": str(self.group or ""),
            "reason": self.reason,
            "since": self.since.isoformat() if self.since else "",
            "until": self.until.isoformat() if self.until else "",
            "key": self.idempotency_key,
            "type": self.message_type,
            "q": self.search,
        }
        return {k: v for k, v in raw.items() if v}

    def query_string(self, **extra: Any) -> str:
        return urlencode({**self.params(), **{k: v for k, v in extra.items() if v}})


@dataclasses.dataclass
class Page:
    rows: list[DeadLetter]
    next_after: int | None


def keyset_page(entries: QuerySet[DeadLetter], after: int | None, size: int) -> Page:
    """Up to ``size`` rows with ``id < after``, newest first, and the cursor of the next page."""
    if after:
        entries = entries.filter(id__lt=after)
        if _joins_state(entries):
            # The same bound on the state rows' side: the planner does not carry ``id < after``
            # across the join, and a merge join would walk their key from the newest entry down
            # to ``after`` (450,000 rows for the middle of 1M, 55 ms) to find the first match.
            entries = entries.filter(state__entry_id__lt=after)
    rows = list(entries.order_by("-id")[: size + 1])
    next_after = rows[size - 1].pk if len(rows) > size else None
    return Page(rows[:size], next_after)


def _joins_state(entries: QuerySet[DeadLetter]) -> bool:
    """Whether a filter of ``entries`` reads the entries' state rows (the status filter)."""
    table = EntryState._meta.db_table
    return any(getattr(j, "table_name", None) == table for j in entries.query.alias_map.values())


@dataclasses.dataclass
class Total:
    value: int
    exact: bool
    capped: bool

    def __str__(self) -> str:
        if self.capped:
            return f"more than {self.value:,}"
        return f"{self.value:,}" if self.exact else f"about {self.value:,}"


#: The planner's row estimate; for the partitioned table (PostgreSQL, ``dlq.capture.partitions``)
#: the sum over its partitions, which autovacuum analyzes (it never analyzes the parent). -1 while
#: nothing has been analyzed yet.
_ESTIMATE_SQL = """
SELECT CASE WHEN c.relkind <> 'p' THEN c.reltuples::bigint
            ELSE (SELECT CASE WHEN max(p.reltuples) < 0 THEN -1
                              ELSE sum(greatest(p.reltuples, 0))::bigint END
                  FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
                  WHERE i.inhparent = c.oid) END
FROM pg_class c WHERE c.oid = %s::regclass
"""


def _estimate() -> int:
    """The planner's row count of the whole table (-1: never analyzed)."""
    with connection.cursor() as cursor:
        cursor.execute(_ESTIMATE_SQL, [DeadLetter._meta.db_table])
        row = cursor.fetchone()
    return -1 if not row or row[0] is None else int(row[0])


def approximate_total(entries: QuerySet[DeadLetter], f: EntryFilter) -> Total:
    """Unfiltered on PostgreSQL: the planner's row estimate (free, ``_ESTIMATE_SQL``) when it is
    past the cap. Otherwise a count capped at ``COUNT_CAP`` + 1 rows, so it costs at most that
    many index entries."""
    estimated = _estimated_total(f)
    if estimated is not None:
        return estimated
    count = entries.order_by().values("id")[: COUNT_CAP + 1].count()
    return _capped(count)


def _estimated_total(f: EntryFilter) -> Total | None:
    """The free total of an unfiltered list on PostgreSQL, if the table is past the cap."""
    if f.is_empty and connection.vendor == "postgresql":
        estimate = _estimate()
        # A small (or never analyzed) table is counted: exact, and cheap below the cap.
        if estimate > COUNT_CAP:
            return Total(estimate, exact=False, capped=False)
    return None


def _capped(count: int, cap: int = COUNT_CAP) -> Total:
    return Total(min(count, cap), exact=True, capped=count > cap)


def first_page(
    entries: QuerySet[DeadLetter], f: EntryFilter, size: int, rows: QuerySet[DeadLetter]
) -> tuple[Page, Total]:
    """The first page and its total from one walk of the filter: the ids of up to
    ``COUNT_CAP`` + 1 matches (``SEARCH_COUNT_CAP`` + 1 for a text search), newest first,
    give the total and the page's ids; ``rows`` (the whole table, with the columns and joins
    the page shows) loads those ``size`` rows by primary key. So the filter — for a text
    search the trigram scan, the costliest part of the page — runs once, not once for the
    page and again for the count. An unfiltered list takes the planner's estimate and a plain
    keyset page of ``entries``."""
    estimated = _estimated_total(f)
    if estimated is not None:
        return keyset_page(entries, None, size), estimated
    cap = max(SEARCH_COUNT_CAP, size) if f.search else COUNT_CAP
    ids = list(entries.order_by("-id").values_list("id", flat=True)[: cap + 1])
    shown = ids[:size]
    found = {e.pk: e for e in rows.filter(pk__in=shown)} if shown else {}
    # An entry gone between the two statements (retention) is simply not shown.
    page = Page([found[i] for i in shown if i in found], ids[size - 1] if len(ids) > size else None)
    return page, _capped(len(ids), cap)
