"""The database walk of ``audit verify``: every sealed event, in seq order, in constant memory
(a server-side cursor on PostgreSQL), checked against its own hash, its predecessor, the head
row and every signed checkpoint (``audit.checkpoints``) at its tree size."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from audit.chain import (
    DETAIL_FIELDS,
    INDEX_COLUMNS,
    INDEX_FIELDS,
    ChainWalk,
    VerifyResult,
    canonical_time,
)
from audit.checkpoints import Checkpoint, read_dir, trusted_keys, verify_chain_of_checkpoints
from audit.models import AuditEvent, AuditHead

FETCH = 10_000  # rows per round trip of the server-side cursor

_V1 = ("created_at", "actor_id", "actor_username", "source_ip", "action", "target_type",
       "target_id", "target_repr", "channel_slug", "reason", "before", "after", "changes",
       "outcome")  # fmt: skip

# PostgreSQL compares the searchable/display copies with the hashed texts itself, as jsonb on
# both sides, so a number it normalises (1.0e+16, -0.0) is equal to itself.
_PG_COPIES_OK = """
CASE WHEN hash_version = 2 THEN (
  index_json::jsonb = jsonb_build_object(
    'action', action, 'actor', actor_username, 'channel', channel_slug,
    'created_at', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'outcome', outcome, 'plan', plan_id, 'target_id', target_id, 'target_type', target_type)
  AND (detail_json::jsonb - 'source_ip') = jsonb_build_object(
    'actor_id', actor_id, 'after', COALESCE(after, 'null'::jsonb),
    'before', COALESCE(before, 'null'::jsonb), 'changes', COALESCE(changes, 'null'::jsonb),
    'reason', reason, 'target_repr', target_repr)
  AND (detail_json::jsonb ->> 'source_ip')::inet IS NOT DISTINCT FROM source_ip
) END
"""


def _pg_rows() -> Iterator[dict[str, Any]]:
    v1 = ", ".join(f"CASE WHEN hash_version = 1 THEN {c} END" for c in _V1)
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    sql = (
        f"SELECT seq, prev_hash, hash, index_json, detail_json, {_PG_COPIES_OK}, {v1} "
        f"FROM {table} WHERE seq IS NOT NULL ORDER BY seq"
    )
    with transaction.atomic():
        connection.ensure_connection()
        raw = connection.connection
        assert raw is not None
        with raw.cursor(name="dlo_audit_verify") as cursor:
            cursor.itersize = FETCH
            cursor.execute(sql)
            for row in cursor:
                if row[3]:
                    yield {
                        "seq": row[0],
                        "prev_hash": row[1],
                        "hash": row[2],
                        "index_json": row[3],
                        "detail_json": row[4],
                        "copies_ok": row[5],
                    }
                else:
                    event = dict(zip(_V1, row[6:], strict=True))
                    event.update(seq=row[0], prev_hash=row[1], hash=row[2])
                    event["created_at"] = canonical_time(event["created_at"])
                    if event["source_ip"] is not None:
                        event["source_ip"] = str(event["source_ip"])
                    yield event


def _orm_rows() -> Iterator[dict[str, Any]]:
    names = ["seq", "prev_hash", "hash", "index_json", "detail_json", "plan_id", *_V1]
    events = AuditEvent.objects.filter(seq__isnull=False).order_by("seq").values(*names)
    for row in events.iterator(chunk_size=FETCH):
        row["created_at"] = canonical_time(row["created_at"])
        if row["index_json"]:
            row["copies_ok"] = _copies_match(row)
        yield row


def _copies_match(row: dict[str, Any]) -> bool:
    """The SQLite side of ``_PG_COPIES_OK`` (its JSON columns round-trip through Python)."""
    try:
        index, detail = json.loads(row["index_json"]), json.loads(row["detail_json"])
    except ValueError:
        return False
    return all(
        index.get(field) == row[INDEX_COLUMNS.get(field, field)] for field in INDEX_FIELDS
    ) and all(detail.get(field) == row[field] for field in DETAIL_FIELDS)


def stored_events() -> Iterator[dict[str, Any]]:
    return _pg_rows() if connection.vendor == "postgresql" else _orm_rows()


def verify_log(
    *, checkpoint_dir: str | Path | None = None, public_keys: list[str] | None = None
) -> VerifyResult:
    """Walk the sealed log from #1 (constant memory) and check it against the head row and,
    when a checkpoint directory is given, against every signed checkpoint in it."""
    head = AuditHead.objects.filter(pk=1).first()
    checkpoints: list[Checkpoint] = []
    if checkpoint_dir is not None:
        check = verify_chain_of_checkpoints(
            read_dir(checkpoint_dir),
            trusted_keys(public_keys),
            expected_last=head.checkpoint_number if head else 0,
        )
        if not check.ok:
            return VerifyResult(False, 0, None, "", None, check.problem, [], check.bad_number)
        checkpoints = check.checkpoints
    walk = ChainWalk()
    walk.tolerated = _known_bad_at_reanchor()
    pending = [cp for cp in checkpoints if cp.tree_size > 0]
    matched = 0
    for event in stored_events():
        if not walk.add(event):
            break
        while pending and pending[0].tree_size == walk.count:
            problem = _compare(pending[0], walk, matched, checkpoints)
            if problem:
                return VerifyResult(
                    False, walk.count, walk.last_seq, walk.last_hash, None, problem,
                    walk.notes, pending[0].number,
                )  # fmt: skip
            matched = pending.pop(0).number
    result = walk.result()
    if not result.ok:
        return result
    if pending:
        cp = pending[0]
        return VerifyResult(
            False, walk.count, walk.last_seq, walk.last_hash, walk.count + 1,
            f"checkpoint #{cp.number} signed a log of {cp.tree_size} events but the database "
            f"ends at #{walk.count}: events #{walk.count + 1}–#{cp.tree_size} were deleted",
            walk.notes, cp.number,
        )  # fmt: skip
    if head is None:
        return VerifyResult(
            False, walk.count, walk.last_seq, walk.last_hash, None,
            f"the head row (audit_audithead) is missing: it was deleted. {walk.count} events "
            f"verified up to #{walk.last_seq or 0}"
            + (f", matching signed checkpoint #{matched}" if matched else "")
            + "; events after the last checkpoint cannot be shown complete",
            walk.notes,
        )  # fmt: skip
    if not walk.end_at(head.seq, head.hash):
        return walk.result()
    result.checkpoints_matched = matched
    return result


def _compare(cp: Checkpoint, walk: ChainWalk, matched: int, all_cps: list[Checkpoint]) -> str:
    root = walk.frontier.root()
    if root == cp.body.get("root_hash") and walk.last_hash == cp.body.get("head_hash"):
        return ""
    after = next((c.tree_size for c in all_cps if c.number == matched), 0)
    return (
        f"checkpoint #{cp.number} (signed {cp.body.get('time')}, {cp.tree_size} events) does "
        f"not match the database: its Merkle root differs, so events #{after + 1}–"
        f"#{cp.tree_size} were rewritten after it was signed (even with re-computed hashes)"
        + (f"; checkpoint #{matched} still matches" if matched else "")
    )


def _known_bad_at_reanchor() -> set[int]:
    """Format-1 seqs that already failed when the log was re-anchored (the migration records
    them in its ``audit.reanchor`` event): reported, not confused with later tampering."""
    event = AuditEvent.objects.filter(action="audit.reanchor").order_by("id").first()
    if event is None or not event.detail_json:
        return set()
    after = json.loads(event.detail_json).get("after") or {}
    return {int(seq) for seq in after.get("legacy_failures", [])}
