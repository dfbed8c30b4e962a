"""The text filter's index (``SearchText``), kept off the ingest path.

Ingest stores ``DeadLetter.search_text`` with the row (no index on it) and, once the batch is
committed and acknowledged, hands the new ids to a ``BackgroundIndexer``: a thread with its
own database connection that copies them into ``SearchText`` (``index_entries``), whose
trigram GIN index the list's text filter uses. The ~300 trigram keys per row are written by
that connection's server process while the ingest loop fetches, stores and acks the next
batch. Whatever the indexer did not get to (a full hand-over queue, a crash) is caught up by
``index_missing`` after every drain, so the index trails ingest by at most one run.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from django.db import DatabaseError, InterfaceError, connection
from django.db.models import Max

from channels_registry.service import close_connections, one_line
from dlq.models import DeadLetter, SearchText

log = logging.getLogger(__name__)

#: Batches of ids waiting for the indexer; past this the ingest loop does not wait for it
#: (``index_missing`` catches up after the drain).
PENDING_BATCHES = 20
STOP_WAIT_S = 30.0

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


class BackgroundIndexer:
    """Indexes submitted ids on a daemon thread (its own connection); a context manager.

    ``submit`` never blocks: with ``PENDING_BATCHES`` waiting, the batch is left to
    ``index_missing``. Leaving the block waits up to ``STOP_WAIT_S`` for the queue to drain;
    an error in the thread is logged, never raised into ingest (the rows are committed and
    acknowledged; only their searchability waits for the catch-up)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[list[int] | None] = queue.Queue(maxsize=PENDING_BATCHES)
        self._thread = threading.Thread(target=self._run, name="dlq-search-indexer", daemon=True)
        self.indexed = 0

    def __enter__(self) -> BackgroundIndexer:
        # SQLite (``make run``) has one writer at a time: index inline there.
        self._inline = connection.vendor != "postgresql"
        if not self._inline:
            self._thread.start()
        return self

    def submit(self, ids: Sequence[int]) -> None:
        if ids and self._inline:
            self.indexed += index_entries(ids)
        elif ids:
            try:
                self._queue.put_nowait(list(ids))
            except queue.Full:
                log.info("search indexer busy: %d entries left to the catch-up", len(ids))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._inline:
            return
        try:
            self._queue.put(None, timeout=STOP_WAIT_S)
        except queue.Full:
            log.warning("search indexer did not drain in %.0f s", STOP_WAIT_S)
        self._thread.join(STOP_WAIT_S)

    def _run(self) -> None:
        # A database outage is one clear line per outage (no chained tracebacks): the rows are
        # committed, and ``index_missing`` indexes what this thread could not.
        failing = False
        try:
            for _ in range(10**9):  # bounded: ends at the None sentinel
                ids = self._queue.get()
                if ids is None:
                    return
                try:
                    self._prepare()
                    self.indexed += index_entries(ids)
                except (DatabaseError, InterfaceError) as exc:
                    if not failing:
                        log.warning(
                            "search indexer: database unavailable (%s); the catch-up indexes "
                            "these entries later",
                            one_line(exc),
                        )
                    failing = True
                    close_connections()
                    continue
                except Exception as exc:  # a bug here must not end ingest's hand-over
                    log.warning("search indexing failed (%s); the catch-up retries", one_line(exc))
                    log.debug("search indexing failed", exc_info=True)
                    continue
                failing = False
        finally:
            close_connections()

    def _prepared(self) -> bool:
        return bool(getattr(connection, "_dlo_search_prepared", False) and connection.connection)

    def _prepare(self) -> None:
        """The index is derived data that index_missing rebuilds from the committed rows: its
        commits need not wait for the WAL flush (a crash loses at most the last few, which the
        catch-up after the next drain writes again). Once per connection."""
        if self._prepared():
            return
        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
        connection._dlo_search_prepared = True  # type: ignore[attr-defined]
