"""The text filter's index (``SearchText``), kept off the ingest path.

Ingest stores ``DeadLetter.search_text`` with the row (no index on it) and, once the batch is
committed and acknowledged, copies it into ``SearchText`` (``index_entries``), whose trigram
GIN index the list's text filter uses. Whatever a crash left uncopied is caught up by
``index_missing`` (run after every drain), so the index trails ingest by at most one batch
or one run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Max

from dlq.models import DeadLetter, SearchText

#: How far below the newest indexed id the catch-up looks for rows a crash left uncopied
#: (concurrent ingesters commit ids slightly out of order).
CATCH_UP_WINDOW = 50_000
CATCH_UP_BATCH = 2_000


def index_entries(ids: Sequence[int]) -> int:
    """Copy the search text of the entries ``ids`` into the index; returns rows added.
    Idempotent (an entry already indexed is skipped)."""
    if not ids:
        return 0
    table, search = DeadLetter._meta.db_table, SearchText._meta.db_table
    params: list[Any]
    if connection.vendor == "postgresql":
        where, params = "id = ANY(%s)", [list(ids)]
    else:
        where, params = f"id IN ({', '.join(['%s'] * len(ids))})", list(ids)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {search} (entry_id, text) SELECT id, search_text FROM {table} "
            f"WHERE {where} AND search_text <> '' ON CONFLICT (entry_id) DO NOTHING",
            params,
        )
        return max(cursor.rowcount, 0)


def index_missing(limit: int = 10 * CATCH_UP_BATCH) -> int:
    """Index recent entries that have search text but no index row (a crash between the
    ingest commit and ``index_entries``); bounded. Returns rows added."""
    newest = SearchText.objects.aggregate(n=Max("entry_id"))["n"] or 0
    added = 0
    for _ in range(max(1, limit // CATCH_UP_BATCH)):
        ids = list(
            DeadLetter.objects.filter(id__gt=max(0, newest - CATCH_UP_WINDOW), search__isnull=True)
            .exclude(search_text="")
            .order_by("id")
            .values_list("id", flat=True)[:CATCH_UP_BATCH]
        )
        if not ids:
            break
        added += index_entries(ids)
        newest = max(newest, ids[-1])
    return added


def forget(ids: Sequence[int]) -> None:
    """Drop the index rows of purged entries (their search text is gone)."""
    SearchText.objects.filter(entry_id__in=ids).delete()
