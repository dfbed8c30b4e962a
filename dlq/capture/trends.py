"""The failure groups page's trend: entries dead-lettered per group and hour, stored.

``GroupHour`` holds one row per (failure group, hour) with the number of entries of that group
whose ``dead_lettered_at`` falls in that hour. Ingest adds to it in the transaction that stores
the entries (``count_new``, beside the groups' own counts); the groups page reads the rows of
the groups it shows (``trends``: at most 48 small rows per group, never the dead-letter table);
the hourly retention task drops rows older than both windows (``prune``).

What the trend means, and why it never needs a recount: "entries of this group dead-lettered in
that hour, as ingested". Replaying or discarding an entry, retention purging its payload, or a
whole partition of old entries being dropped does not change how many failed in that hour, so
none of those touch these rows. (Ingest inserts each entry once: ``ON CONFLICT DO NOTHING`` on
its dedupe key, and only the rows actually inserted are counted.)

The windows are whole hours in UTC: "last 24 h" is the current hour and the 23 before it, "the
24 h before" the 24 hours before those.

The model itself lives in ``dlq.models.trends`` (imported at the end of ``dlq.models`` so Django
registers it), so the models never import this logic.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models import Q, Sum

from dlq.models.trends import GroupHour

if TYPE_CHECKING:
    from dlq.models import DeadLetter

WINDOW_HOURS = 24
#: Rows per upsert statement (3 parameters each; SQLite allows 32,766 per statement).
UPSERT_ROWS = 500


def hour_of(moment: dt.datetime) -> dt.datetime:
    """The start of ``moment``'s hour, in UTC."""
    return moment.astimezone(dt.UTC).replace(minute=0, second=0, microsecond=0)


def windows(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """(start of the "last 24 h" window, start of the 24 h before it)."""
    recent = hour_of(now) - dt.timedelta(hours=WINDOW_HOURS - 1)
    return recent, recent - dt.timedelta(hours=WINDOW_HOURS)


def count_new(entries: Iterable[DeadLetter], now: dt.datetime) -> None:
    """Add newly inserted entries (with their ``group_id``) to their hours: one upsert per
    ``UPSERT_ROWS`` (group, hour) pairs. Hours already before both windows are skipped (they
    would never be shown and ``prune`` would drop them)."""
    oldest = windows(now)[1]
    counts = Counter(
        (e.group_id, hour_of(e.dead_lettered_at)) for e in entries if e.group_id is not None
    )
    rows = sorted((g, h, n) for (g, h), n in counts.items() if h >= oldest)
    table = connection.ops.quote_name(GroupHour._meta.db_table)
    for start in range(0, len(rows), UPSERT_ROWS):
        chunk = rows[start : start + UPSERT_ROWS]
        params: list[Any] = []
        for group_id, hour, n in chunk:
            params += [group_id, connection.ops.adapt_datetimefield_value(hour), n]
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (group_id, hour, count) VALUES "
                + ", ".join(["(%s, %s, %s)"] * len(chunk))
                + f" ON CONFLICT (group_id, hour) DO UPDATE SET count = {table}.count"
                " + EXCLUDED.count",
                params,
            )


def trends(group_ids: list[int], now: dt.datetime) -> dict[int, tuple[int, int]]:
    """Per group: (entries dead-lettered in the last 24 h, in the 24 h before)."""
    recent, previous = windows(now)
    rows = (
        GroupHour.objects.filter(group_id__in=group_ids, hour__gte=previous)
        .values("group_id")
        .annotate(
            recent=Sum("count", filter=Q(hour__gte=recent)),
            previous=Sum("count", filter=Q(hour__lt=recent)),
        )
        .order_by()
    )
    return {r["group_id"]: (r["recent"] or 0, r["previous"] or 0) for r in rows}


def prune(now: dt.datetime) -> int:
    """Drop the hours before both windows; returns how many rows went."""
    deleted, _ = GroupHour.objects.filter(hour__lt=windows(now)[1]).delete()
    return deleted
