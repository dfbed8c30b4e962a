"""The database walk of ``audit verify``: every sealed event, in seq order, in constant memory
(a server-side cursor on PostgreSQL), checked against its own hash, its predecessor, the head
row and every signed checkpoint (``audit.checkpoints``) at its tree size."""

from __future__ import annotations

import json
import threading
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

# PostgreSQL compares the searchable/display copies with the hashed texts itself. The index
# first as text (its canonical JSON rebuilt by concatenation: cheap), falling back to jsonb on
# both sides; the detail as jsonb on both sides, so a number PostgreSQL normalises (1.0e+16,
# -0.0) is equal to itself, and the IP address as ``inet``.
_PG_INDEX_TEXT = """
'{"action":' || to_json(action)::text || ',"actor":' || to_json(actor_username)::text
|| ',"channel":' || to_json(channel_slug)::text || ',"created_at":"'
|| to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
|| '","outcome":' || to_json(outcome)::text || ',"plan":' || to_json(plan_id)::text
|| ',"target_id":' || to_json(target_id)::text || ',"target_type":' || to_json(target_type)::text
|| '}'
"""
_PG_COPIES_OK = f"""
CASE WHEN hash_version = 2 THEN (
  (index_json = {_PG_INDEX_TEXT} OR index_json::jsonb = jsonb_build_object(
    'action', action, 'actor', actor_username, 'channel', channel_slug,
    'created_at', to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'outcome', outcome, 'plan', plan_id, 'target_id', target_id, 'target_type', target_type))
  AND (detail_json::jsonb - 'source_ip') = jsonb_build_object(
    'actor_id', actor_id, 'after', COALESCE(after, 'null'::jsonb),
    'before', COALESCE(before, 'null'::jsonb), 'changes', COALESCE(changes, 'null'::jsonb),
    'reason', reason, 'target_repr', target_repr)
  AND (detail_json::jsonb ->> 'source_ip')::inet IS NOT DISTINCT FROM source_ip
) END
"""


def _walk_pg(walk: ChainWalk) -> None:
    """The sealed events in seq order through a server-side cursor; format-2 rows go straight
    to ``ChainWalk.add_texts`` as bytes, format-1 rows as dicts."""
    v1 = ", ".join(f"CASE WHEN hash_version = 1 THEN {c} END" for c in _V1)
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    sql = (
        f"SELECT seq, prev_hash, hash, convert_to(index_json, 'UTF8'), "
        f"convert_to(detail_json, 'UTF8'), {v1} FROM {table} WHERE seq IS NOT NULL ORDER BY seq"
    )
    with transaction.atomic():
        connection.ensure_connection()
        raw = connection.connection
        assert raw is not None
        # Binary results: the texts arrive as the UTF-8 bytes that are hashed, undecoded.
        with raw.cursor(name="dlo_audit_verify", binary=True) as cursor:
            cursor.itersize = FETCH
            cursor.execute(sql)
            add = walk.add_texts
            for row in cursor:
                if row[3]:
                    if not add(row[0], row[1], row[2], row[3], row[4]):
                        return
                    continue
                event = dict(zip(_V1, row[5:], strict=True))
                event.update(seq=row[0], prev_hash=row[1], hash=row[2])
                event["created_at"] = canonical_time(event["created_at"])
                if event["source_ip"] is not None:
                    event["source_ip"] = str(event["source_ip"])
                if not walk.add(event):
                    return


def _first_bad_copy_pg() -> int | None:
    """The first format-2 event whose searchable/display columns differ from its texts."""
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT min(seq) FROM {table} WHERE seq IS NOT NULL AND hash_version = 2 "
            f"AND NOT COALESCE({_PG_COPIES_OK}, false)"
        )
        row = cursor.fetchone()
    return row[0] if row else None


def _first_bad_copy_threaded(found: list[int | None]) -> None:
    try:
        found.append(_first_bad_copy_pg())
    finally:
        connection.close()


def _walk_orm(walk: ChainWalk) -> int | None:
    """SQLite (development): the same walk through the ORM; returns the first bad copy."""
    names = ["seq", "prev_hash", "hash", "index_json", "detail_json", "plan_id", *_V1]
    events = AuditEvent.objects.filter(seq__isnull=False).order_by("seq").values(*names)
    first_bad: int | None = None
    for row in events.iterator(chunk_size=FETCH):
        row["created_at"] = canonical_time(row["created_at"])
        if row["index_json"] and first_bad is None and not _copies_match(row):
            first_bad = row["seq"]
        text_row = {k: row[k] for k in ("seq", "prev_hash", "hash", "index_json", "detail_json")}
        if not walk.add(text_row if row["index_json"] else row):
            break
    return first_bad


def _copies_match(row: dict[str, Any]) -> bool:
    """The SQLite side of ``_PG_COPIES_OK`` (its JSON columns round-trip through Python)."""
    try:
        index, detail = json.loads(row["index_json"]), json.loads(row["detail_json"])
    except ValueError:
        return False
    return all(
        index.get(field) == row[INDEX_COLUMNS.get(field, field)] for field in INDEX_FIELDS
    ) and all(detail.get(field) == row[field] for field in DETAIL_FIELDS)


def walk_stored(walk: ChainWalk) -> int | None:
    """Run ``walk`` over the sealed log; returns the first event whose copies differ from its
    texts. On PostgreSQL that check runs as one query on a second connection, in parallel
    with the walk (in the caller's connection when inside a transaction, which a second
    connection could not see)."""
    if connection.vendor != "postgresql":
        return _walk_orm(walk)
    if connection.in_atomic_block:
        bad = _first_bad_copy_pg()
        _walk_pg(walk)
        return bad
    found: list[int | None] = []
    checker = threading.Thread(target=_first_bad_copy_threaded, args=(found,))
    checker.start()
    try:
        _walk_pg(walk)
    finally:
        checker.join()
    return found[0] if found else None


def verify_log(
    *,
    checkpoint_dir: str | Path | None = None,
    public_keys: list[str] | None = None,
    witnessed: Checkpoint | None = None,
) -> VerifyResult:
    """Walk the sealed log from #1 (constant memory) and check it against the head row and,
    when a checkpoint directory is given, against every signed checkpoint in it; with
    ``witnessed`` (a witness's last head, ``audit.witnessing``), the log must extend it."""
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
    sizes = {cp.tree_size: cp for cp in pending}
    if witnessed is not None:
        sizes.setdefault(witnessed.tree_size, witnessed)
    roots: dict[int, tuple[str, str]] = {}
    if sizes:
        # Remember the root at each checkpoint's size as the walk passes it (a wrapper on the
        # frontier's append keeps the hot loop free of the check).
        frontier = walk.frontier
        append = frontier.append

        def remembering(leaf: bytes) -> None:
            append(leaf)
            if frontier.size in sizes:
                roots[frontier.size] = (frontier.root(), walk.pending_hash)

        frontier.append = remembering  # type: ignore[method-assign]
    bad_copy = walk_stored(walk)
    result = walk.result()
    for cp in pending:
        if cp.tree_size not in roots:
            break
        problem = _compare(cp, roots[cp.tree_size], matched, checkpoints)
        if problem and (result.ok or (result.first_bad_seq or 0) > cp.tree_size):
            return VerifyResult(
                False, walk.count, walk.last_seq, walk.last_hash, None, problem,
                walk.notes, cp.number,
            )  # fmt: skip
        if problem:
            break
        matched = cp.number
    pending = [cp for cp in pending if cp.number > matched]
    first_bad = result.first_bad_seq
    if bad_copy is not None and (result.ok or first_bad is None or bad_copy < first_bad):
        return VerifyResult(
            False, walk.count, walk.last_seq, walk.last_hash, bad_copy,
            "the event's searchable columns differ from its hashed record: the event was "
            "modified", walk.notes,
        )  # fmt: skip
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
    if witnessed is not None:
        from audit.witnessing import compare_witnessed

        problem = compare_witnessed(witnessed, roots.get(witnessed.tree_size), walk.count)
        if problem:
            return VerifyResult(
                False, walk.count, walk.last_seq, walk.last_hash, None, problem, walk.notes,
                witnessed.number,
            )  # fmt: skip
    result.checkpoints_matched = matched
    return result


def _compare(
    cp: Checkpoint, at_size: tuple[str, str], matched: int, all_cps: list[Checkpoint]
) -> str:
    root, head_hash = at_size
    if root == cp.body.get("root_hash") and head_hash == cp.body.get("head_hash"):
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
