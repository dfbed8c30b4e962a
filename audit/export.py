"""Streaming exports of the audit trail: JSON Lines (verifiable) and CSV (for spreadsheets).

Both walk the queryset with ``.iterator(chunk_size=2000)`` (a server-side cursor on
PostgreSQL) and yield text in batches, so memory stays constant for a million events.

* JSON Lines: one object per line, oldest first: ``HASHED_FIELDS`` (times in the canonical
  format) plus ``hash``; for a format-2 event also ``index_json`` and ``detail_json``, the
  exact texts that were hashed (the readable fields are copies of them, checked on
  verification). ``manage.py audit verify --file`` and the standard-library script
  ``audit/verify_export.py`` recompute every hash from it.
* CSV: the same columns, but cells that a spreadsheet would run as a formula (starting with
  ``= + - @``, tab or carriage return) are prefixed with ``'``. The CSV is for reading; its
  neutralised cells no longer hash, so verification uses the JSON Lines export.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse

from audit.chain import (
    HASHED_FIELDS,
    INDEX_COLUMNS,
    canonical_time,
    leaf_hash,
    legacy_leaf,
    subtree_hashes_before,
)
from audit.checkpoints import Checkpoint
from audit.models import AuditEvent
from audit.verify_export import matches

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
    """The sealed events oldest first, as the dicts that were hashed (plus ``hash``)."""
    names = (*COLUMNS, "plan_id", "index_json", "detail_json")
    rows = (
        events.filter(seq__isnull=False)
        .order_by("seq")
        .values(*names)
        .iterator(chunk_size=CHUNK_SIZE)
    )
    for row in rows:
        row["created_at"] = canonical_time(row["created_at"])
        if row["index_json"]:
            # The readable fields from the texts that were hashed (not from the database's
            # copies): what a reader sees is exactly what the hash covers.
            row.update(readable(row["index_json"], row["detail_json"]))
        else:
            del row["index_json"], row["detail_json"], row["plan_id"]
        yield row


def readable(index_json: str, detail_json: str) -> dict[str, Any]:
    """A format-2 event's hashed texts as the readable columns (``HASHED_FIELDS`` names)."""
    index, detail = json.loads(index_json), json.loads(detail_json)
    fields = {INDEX_COLUMNS.get(k, k): v for k, v in index.items()}
    fields.update(detail)
    return fields


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


def _leaf(row: Any) -> bytes:
    if row["index_json"]:
        return leaf_hash(row["index_json"], row["detail_json"])
    return legacy_leaf(row["hash"])


def proof_lines(filters: dict[str, str], checkpoint: Checkpoint, first_seq: int) -> Iterator[str]:
    """A proof export (``dlo-audit-proof/1``, docs/audit.md): a header with the signed
    checkpoint and the Merkle subtree hashes left of ``first_seq``, then every event of
    ``first_seq``..``tree_size`` in seq order: in full when it matches ``filters`` (and every
    format-1 event, whose fields are not committed separately), otherwise withheld as its index
    text and the SHA-256 of its detail text. ``verify_export.py`` rebuilds the signed root from
    it and re-applies the filters to every index."""
    size = checkpoint.tree_size
    sealed = AuditEvent.objects.filter(seq__isnull=False).order_by("seq")
    before = sealed.filter(seq__lt=first_seq).values("index_json", "detail_json", "hash")
    prefix = subtree_hashes_before(
        (_leaf(row) for row in before.iterator(chunk_size=CHUNK_SIZE)), first_seq - 1, size
    )
    header = {
        "format": "dlo-audit-proof/1",
        "filters": filters,
        "first_seq": first_seq,
        "prefix": prefix,
        "checkpoint": checkpoint.body,
        "signature": checkpoint.signature,
    }
    yield jsonl_line(header)
    for row in export_rows(sealed.filter(seq__gte=first_seq, seq__lte=size)):
        index_json = row.get("index_json")
        if index_json and not matches(filters, row, json.loads(index_json)):
            detail = hashlib.sha256(row["detail_json"].encode("utf-8")).hexdigest()
            row = {"seq": row["seq"], "withheld": True, "index_json": index_json,
                   "detail_sha256": detail}  # fmt: skip
        yield jsonl_line(row)


def proof_filters(active: dict[str, str]) -> dict[str, str]:
    """The form's active filters as the proof states them (times in the canonical form)."""
    out = dict(active)
    for name in ("since", "until"):
        if name in out:
            out[name] = canonical_time(dt.datetime.fromisoformat(out[name]))
    return out
