"""Streaming exports of the audit trail: JSON Lines (verifiable) and CSV (for spreadsheets).

Both walk the queryset with ``.iterator(chunk_size=2000)`` (a server-side cursor on
PostgreSQL) and yield text in batches, so memory stays constant for a million events.

* JSON Lines: one object per line with exactly the hashed fields (``HASHED_FIELDS``, times in
  the canonical format) plus ``hash``, oldest first. ``manage.py audit verify --file`` and the
  standard-library script ``audit/verify_export.py`` recompute every hash from it.
* CSV: the same columns, but cells that a spreadsheet would run as a formula (starting with
  ``= + - @``, tab or carriage return) are prefixed with ``'``. The CSV is for reading; its
  neutralised cells no longer hash, so verification uses the JSON Lines export.
"""

from __future__ import annotations

import csv
import json
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse

from audit.chain import HASHED_FIELDS, canonical_time
from audit.models import AuditEvent

COLUMNS = (*HASHED_FIELDS, "hash")
JSON_FIELDS = frozenset({"before", "after", "changes"})
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
CHUNK_SIZE = 2000  # rows per database fetch
BATCH_ROWS = 500  # rows per piece of the response body

CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "jsonl": "application/x-ndjson; charset=utf-8",
}


def export_rows(events: QuerySet[AuditEvent]) -> Iterator[dict[str, Any]]:
    """The events oldest first, as the dicts that were hashed (plus ``hash``)."""
    rows = events.order_by("seq").values(*COLUMNS).iterator(chunk_size=CHUNK_SIZE)
    for row in rows:
        row["created_at"] = canonical_time(row["created_at"])
        yield row


def jsonl_line(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


def neutralise(cell: str) -> str:
    """Defuse spreadsheet formula injection (OWASP "CSV injection")."""
    return "'" + cell if cell.startswith(FORMULA_PREFIXES) else cell


def csv_cell(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name in JSON_FIELDS:
        value = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return neutralise(str(value))


class _Line:
    """A file-like that hands back what ``csv.writer`` writes (Django's streaming-CSV idiom)."""

    def write(self, value: str) -> str:
        return value


def _batched(lines: Iterable[str]) -> Iterator[str]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= BATCH_ROWS:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)


def jsonl_chunks(events: QuerySet[AuditEvent]) -> Iterator[str]:
    return _batched(jsonl_line(row) for row in export_rows(events))


def csv_chunks(events: QuerySet[AuditEvent]) -> Iterator[str]:
    writer = csv.writer(_Line(), quoting=csv.QUOTE_ALL, lineterminator="\r\n")

    def lines() -> Iterator[str]:
        yield writer.writerow(COLUMNS)
        for row in export_rows(events):
            yield writer.writerow([csv_cell(name, row[name]) for name in COLUMNS])

    return _batched(lines())


def chunks(events: QuerySet[AuditEvent], fmt: str) -> Iterator[str]:
    if fmt == "csv":
        return csv_chunks(events)
    if fmt == "jsonl":
        return jsonl_chunks(events)
    raise ValueError(f"unknown export format {fmt!r}")


async def _async_chunks(pieces: Iterator[str]) -> AsyncIterator[str]:
    # Each batch is fetched in the request's sync thread (where its database cursor lives).
    fetch = sync_to_async(lambda: next(pieces, None), thread_sensitive=True)
    try:
        while (piece := await fetch()) is not None:
            yield piece
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            await sync_to_async(close, thread_sensitive=True)()


def streaming_response(
    request: HttpRequest, pieces: Iterator[str], filename: str
) -> StreamingHttpResponse:
    """A download that streams ``pieces``.

    Under ASGI (daphne) Django buffers a *synchronous* iterator whole before sending it, so
    there the pieces are handed over as an asynchronous iterator; under WSGI (and the test
    client) they stay synchronous.
    """
    fmt = filename.rsplit(".", 1)[-1]
    content: Iterator[str] | AsyncIterator[str] = (
        _async_chunks(pieces) if isinstance(request, ASGIRequest) else pieces
    )
    response = StreamingHttpResponse(content, content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["Cache-Control"] = "no-store"
    return response
