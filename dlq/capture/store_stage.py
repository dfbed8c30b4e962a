"""Ingest's commit-then-ack step, overlapped with the next batch (``StoreStage``).

The serial loop fetches a batch, builds its rows, stores them in one transaction, acks, and
only then fetches the next: while PostgreSQL inserts, the ingest process waits, and while the
process decodes and builds, PostgreSQL waits. On PostgreSQL the stage runs each batch's
transaction on a thread of its own (with its own connection) while the caller fetches and
builds the next batch. The order that makes ingest safe does not change:

- a batch is acked only after its transaction committed, by the caller's thread (the broker
  sessions are not thread-safe), in fetch order;
- at most one batch is being stored while the next is built: two batches are unacknowledged at
  most, which the drain sessions' prefetch (twice the batch) already allows;
- a failed transaction is never acked: its error reaches the caller at the next ``submit`` or
  when the stage closes, and the broker hands the batch back (the unique dedupe key makes a
  second delivery of a committed batch a no-op);
- when the caller's loop fails while a batch is being stored, the stage still waits for that
  batch and acks it if it committed, as the serial loop would have before it fetched again.

The stage stores on the caller's thread instead where the session does not hand out a batch
before the one before is acked (``DrainSession.fetch_ahead``: ActiveMQ holds its page until
then), on SQLite (one writer), and inside a transaction of the caller's (a test's, say), whose
rows another connection would not see.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Protocol

from django.db import connection

from brokers.base import DeadLetter as Letter
from channels_registry.service import close_connections, one_line

log = logging.getLogger(__name__)

#: Stores one batch in its own transaction and returns (inserted, duplicates), adding the new
#: rows' ids to the list it is given.
StoreFn = Callable[[list[int]], tuple[int, int]]


class _Session(Protocol):
    fetch_ahead: bool

    def ack(self, letters: Sequence[Letter]) -> None: ...


class _Indexer(Protocol):
    def submit(self, ids: Sequence[int]) -> None: ...


class _Counts(Protocol):
    fetched: int
    inserted: int
    duplicates: int


def _crash_after_commit_requested() -> bool:
    """Fault injection (tests only): end the process after a commit, before its ack."""
    return os.environ.get("DLO_TEST_CRASH_AFTER_COMMIT") == "1"


def overlapping() -> bool:
    """Whether the database allows a stage opened now to store on a thread of its own (see the
    module docstring)."""
    return connection.vendor == "postgresql" and not connection.in_atomic_block


class StoreStage:
    """A context manager around one drain session: ``submit`` a built batch's store, and the
    stage acks it once committed, hands its new ids to the search indexer and counts it."""

    def __init__(self, session: _Session, indexer: _Indexer, counts: _Counts) -> None:
        self._session, self._indexer, self._counts = session, indexer, counts
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[Future[tuple[int, int]], Sequence[Letter], list[int]] | None = None

    def __enter__(self) -> StoreStage:
        if self._session.fetch_ahead and overlapping():
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlq-ingest-store")
        return self

    @property
    def threaded(self) -> bool:
        """Whether batches are stored on the stage's own thread (``overlapping``)."""
        return self._pool is not None

    def submit(self, letters: Sequence[Letter], store: StoreFn) -> None:
        """Store ``letters`` with ``store``: on the stage's thread once the batch before it is
        settled (acked), else here and now. Raises the error of an earlier batch's store."""
        self.settle()
        ids: list[int] = []
        if self._pool is None:
            self._acked(letters, ids, store(ids))
        else:
            self._pending = (self._pool.submit(store, ids), letters, ids)

    def settle(self) -> None:
        """Wait for the batch being stored, if any, and ack it (raises its store's error)."""
        if self._pending is None:
            return
        future, letters, ids = self._pending
        self._pending = None
        self._acked(letters, ids, future.result())

    def _acked(self, letters: Sequence[Letter], ids: list[int], counts: tuple[int, int]) -> None:
        if _crash_after_commit_requested():
            os._exit(137)
        self._session.ack(letters)
        # Off the commit-then-ack path: the text index follows the ack, on the indexer's own
        # thread and connection (caught up by ``search.index_missing`` after the drain).
        self._indexer.submit(ids)
        self._counts.fetched += len(letters)
        self._counts.inserted += counts[0]
        self._counts.duplicates += counts[1]

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self.settle()
            elif self._pending is not None:
                # The loop failed while a batch was being stored: ack it if it committed (as the
                # serial loop had before fetching again); the loop's error is the one raised.
                try:
                    self.settle()
                except Exception as late:  # noqa: BLE001 - the batch stays on the broker
                    log.warning("ingest: a batch left unacknowledged (%s)", one_line(late))
        finally:
            if self._pool is not None:
                # The stage thread's connection, closed before the thread ends.
                self._pool.submit(close_connections).result()
                self._pool.shutdown()
