"""The database walk of ``audit verify``: every sealed event, in seq order, in constant memory
(a server-side cursor on PostgreSQL), checked against its own hash, its predecessor, the head
row and every signed checkpoint (``audit.checkpoints``) at its tree size."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DataError, connection, transaction
from django.utils import timezone

from audit import sealer
from audit.anchors import RowRules, find_anchors
from audit.chain import (
    DETAIL_FIELDS,
    INDEX_COLUMNS,
    INDEX_FIELDS,
    ChainWalk,
    VerifyResult,
    canonical_time,
)
from audit.checkpoints import Checkpoint, read_dir, trusted_keys, verify_chain_of_checkpoints
from audit.history import checkpoint_history_problem
from audit.models import AuditEvent, AuditHead, ChainVerification, Outcome
from audit.recording import Actor, record
from audit.witnessing import witnessed_head

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
CASE WHEN seq > %s THEN (
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


def _walk_pg(walk: ChainWalk, rules: RowRules) -> None:
    """The sealed events in seq order through a server-side cursor: format-2 rows (by their
    place, ``rules.legacy``) go straight to ``ChainWalk.add_texts`` as bytes, format-1 rows
    as dicts; each row first passes ``rules``."""
    v1 = ", ".join(f"CASE WHEN seq <= %s THEN {c} END" for c in _V1)
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    sql = (
        f"SELECT seq, prev_hash, hash, convert_to(index_json, 'UTF8'), "
        f"convert_to(detail_json, 'UTF8'), hash_version, plan_id, mac, created_at, {v1} "
        f"FROM {table} WHERE seq IS NOT NULL ORDER BY seq"
    )
    legacy = rules.legacy
    check_format, check_origin = rules.check_format, rules.check_origin
    with transaction.atomic():
        connection.ensure_connection()
        raw = connection.connection
        assert raw is not None
        # Binary results: the texts arrive as the UTF-8 bytes that are hashed, undecoded.
        with raw.cursor(name="dlo_audit_verify", binary=True) as cursor:
            cursor.itersize = FETCH
            cursor.execute(sql, [legacy] * len(_V1))
            add = walk.add_texts
            for row in cursor:
                seq, index_json, detail_json = row[0], row[3] or b"", row[4] or b""
                # The common case (a format-2 row after the re-anchor) without a call.
                if not (seq > legacy and row[5] == 2 and index_json and detail_json):
                    problem = check_format(seq, row[5], index_json, detail_json, row[6])
                    if problem:
                        walk.fail(seq, problem)
                        return
                if seq > legacy:
                    if not add(seq, row[1], row[2], index_json, detail_json):
                        return
                else:
                    event = dict(zip(_V1, row[9:], strict=True))
                    event.update(seq=seq, prev_hash=row[1], hash=row[2])
                    event["created_at"] = canonical_time(event["created_at"])
                    if event["source_ip"] is not None:
                        event["source_ip"] = str(event["source_ip"])
                    if not walk.add(event):
                        return
                problem = check_origin(seq, index_json, detail_json, row[7], row[8])
                if problem:
                    walk.fail(seq, problem)
                    return


def _first_bad_copy_pg(legacy: int) -> int | None:
    """The first format-2 event (by place) whose searchable/display columns differ from its
    texts."""
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"SELECT min(seq) FROM {table} WHERE seq IS NOT NULL AND seq > %s "
                f"AND NOT COALESCE({_PG_COPIES_OK}, false)",
                [legacy, legacy],
            )
            row = cursor.fetchone()
    except DataError:
        # A text that is not JSON at all (only tampering writes one): find it row by row.
        return _first_bad_copy_python(legacy)
    return row[0] if row else None


def _first_bad_copy_python(legacy: int) -> int | None:
    names = ["seq", "index_json", "detail_json", "plan_id", "created_at", *_V1]
    rows = AuditEvent.objects.filter(seq__gt=legacy).order_by("seq").values(*names)
    for row in rows.iterator(chunk_size=FETCH):
        row["created_at"] = canonical_time(row["created_at"])
        if row["source_ip"] is not None:
            row["source_ip"] = str(row["source_ip"])
        if not _copies_match(row):
            return int(row["seq"])
    return None


def _first_bad_copy_threaded(found: list[int | None], legacy: int) -> None:
    try:
        found.append(_first_bad_copy_pg(legacy))
    finally:
        connection.close()


def _walk_orm(walk: ChainWalk, rules: RowRules) -> int | None:
    """SQLite (development): the same walk through the ORM; returns the first bad copy."""
    names = [
        "seq", "prev_hash", "hash", "index_json", "detail_json", "plan_id", "hash_version",
        "mac", *_V1,
    ]  # fmt: skip
    events = AuditEvent.objects.filter(seq__isnull=False).order_by("seq").values(*names)
    first_bad: int | None = None
    for row in events.iterator(chunk_size=FETCH):
        seq, created_at = row["seq"], row["created_at"]
        index_json, detail_json = row["index_json"].encode(), row["detail_json"].encode()
        problem = rules.check_format(
            seq, row["hash_version"], index_json, detail_json, row["plan_id"]
        )
        if problem:
            walk.fail(seq, problem)
            break
        row["created_at"] = canonical_time(created_at)
        if seq > rules.legacy and first_bad is None and not _copies_match(row):
            first_bad = seq
        text_row = {k: row[k] for k in ("seq", "prev_hash", "hash", "index_json", "detail_json")}
        if not walk.add(text_row if seq > rules.legacy else {**row, "index_json": ""}):
            break
        problem = rules.check_origin(seq, index_json, detail_json, row["mac"], created_at)
        if problem:
            walk.fail(seq, problem)
            break
    return first_bad


def _copies_match(row: dict[str, Any]) -> bool:
    """The SQLite side of ``_PG_COPIES_OK`` (its JSON columns round-trip through Python)."""
    try:
        index, detail = json.loads(row["index_json"]), json.loads(row["detail_json"])
    except ValueError:
        return False
    if not isinstance(index, dict) or not isinstance(detail, dict):
        return False
    return all(
        index.get(field) == row[INDEX_COLUMNS.get(field, field)] for field in INDEX_FIELDS
    ) and all(detail.get(field) == row[field] for field in DETAIL_FIELDS)


def walk_stored(walk: ChainWalk, rules: RowRules) -> int | None:
    """Run ``walk`` over the sealed log; returns the first event whose copies differ from its
    texts. On PostgreSQL that check runs as one query on a second connection, in parallel
    with the walk (in the caller's connection when inside a transaction, which a second
    connection could not see)."""
    if connection.vendor != "postgresql":
        return _walk_orm(walk, rules)
    if connection.in_atomic_block:
        bad = _first_bad_copy_pg(rules.legacy)
        _walk_pg(walk, rules)
        return bad
    found: list[int | None] = []
    checker = threading.Thread(target=_first_bad_copy_threaded, args=(found, rules.legacy))
    checker.start()
    try:
        _walk_pg(walk, rules)
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
        checkpoints, refused = _signed_checkpoints(checkpoint_dir, public_keys, head)
        if refused is not None:
            return refused
    anchors = find_anchors()
    if anchors.problem:
        return VerifyResult(False, 0, None, "", anchors.bad_seq, anchors.problem)
    rules = RowRules(anchors)
    walk = ChainWalk()
    walk.notes.extend(rules.notes)
    walk.tolerated = anchors.tolerated
    pending = [cp for cp in checkpoints if cp.tree_size > 0]
    sizes: dict[int, Checkpoint | None] = {cp.tree_size: cp for cp in pending}
    if anchors.legacy_events:
        sizes.setdefault(anchors.legacy_events, None)  # the root the re-anchor commits to
    if witnessed is not None:
        sizes.setdefault(witnessed.tree_size, witnessed)
    roots = _remember_roots(walk, sizes)
    bad_copy = walk_stored(walk, rules)
    result = walk.result()
    legacy_root = roots.get(anchors.legacy_events, ("", ""))[0]
    if (
        anchors.legacy_events
        and legacy_root
        and legacy_root != anchors.legacy_root
        and (result.ok or (result.first_bad_seq or 0) > anchors.legacy_events)
    ):
        return VerifyResult(
                False, walk.count, walk.last_seq, walk.last_hash, anchors.reanchor_seq,
                f"the re-anchor (#{anchors.reanchor_seq}) commits to a Merkle root over "
                f"{anchors.legacy_events} format-1 events that they no longer have: format-1 "
                "events were replaced", walk.notes,
            )  # fmt: skip
    matched, mismatch = _match_checkpoints(pending, roots, checkpoints, walk, result)
    if mismatch is not None:
        return mismatch
    pending = [cp for cp in pending if cp.number > matched]
    first_bad = result.first_bad_seq
    copied = _first_copied_mac() if result.ok else None
    if copied is not None:
        return VerifyResult(
            False, walk.count, walk.last_seq, walk.last_hash, copied,
            f"event #{copied} carries the same MAC as an earlier event: a copy of a genuine "
            "event (replayed into the log)", walk.notes,
        )  # fmt: skip
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


def _signed_checkpoints(
    checkpoint_dir: str | Path, public_keys: list[str] | None, head: AuditHead | None
) -> tuple[list[Checkpoint], VerifyResult | None]:
    """Step 1: the directory's checkpoints, their signatures, numbers and links, and the
    history the log itself records; a refusal is the verification's result."""
    check = verify_chain_of_checkpoints(
        read_dir(checkpoint_dir),
        trusted_keys(public_keys),
        expected_last=head.checkpoint_number if head else 0,
    )
    if not check.ok:
        return [], VerifyResult(False, 0, None, "", None, check.problem, [], check.bad_number)
    history = checkpoint_history_problem(check.checkpoints, head)
    if history:
        return [], VerifyResult(False, 0, None, "", None, history, [], None)
    return check.checkpoints, None


def _remember_roots(walk: ChainWalk, sizes: Mapping[int, object]) -> dict[int, tuple[str, str]]:
    """Step 2: remember the Merkle root (and chain hash) at each of ``sizes`` as the walk
    passes it; a wrapper on the frontier's append keeps the hot loop free of the check."""
    roots: dict[int, tuple[str, str]] = {}
    if not sizes:
        return roots
    frontier = walk.frontier
    append = frontier.append

    def remembering(leaf: bytes) -> None:
        append(leaf)
        if frontier.size in sizes:
            roots[frontier.size] = (frontier.root(), walk.pending_hash)

    frontier.append = remembering  # type: ignore[method-assign]
    return roots


def _match_checkpoints(
    pending: list[Checkpoint],
    roots: dict[int, tuple[str, str]],
    checkpoints: list[Checkpoint],
    walk: ChainWalk,
    result: VerifyResult,
) -> tuple[int, VerifyResult | None]:
    """Step 3: the newest checkpoint the walked log matches, or the first it contradicts
    (unless the walk broke earlier, which then names the first bad event)."""
    matched = 0
    for cp in pending:
        if cp.tree_size not in roots:
            break
        problem = _compare(cp, roots[cp.tree_size], matched, checkpoints)
        if problem and (result.ok or (result.first_bad_seq or 0) > cp.tree_size):
            return matched, VerifyResult(
                False, walk.count, walk.last_seq, walk.last_hash, None, problem,
                walk.notes, cp.number,
            )  # fmt: skip
        if problem:
            break
        matched = cp.number
    return matched, None


def _first_copied_mac() -> int | None:
    """A sealed event whose MAC an earlier one carries too. The unique index ``audit_mac_unique``
    makes that impossible while it stands (checked in the catalogue: cheap); without it (a
    superuser dropped it), one aggregate over the table finds the copy."""
    if connection.vendor != "postgresql":
        return None  # SQLite (development) keeps its index; no superuser to drop it
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = 'audit_mac_unique' AND i.indisunique AND i.indisvalid "
            "AND i.indrelid = %s::regclass AND pg_get_expr(i.indpred, i.indrelid) IS NOT NULL",
            [AuditEvent._meta.db_table],
        )
        if cursor.fetchone() is not None:
            return None
        cursor.execute(
            f"SELECT max(seq) FROM {table} WHERE seq IS NOT NULL AND mac <> '' "
            "GROUP BY mac HAVING count(*) > 1 ORDER BY max(seq) LIMIT 1"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else None


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


def verify_chain(
    *,
    checkpoint_dir: str | Path | None = None,
    public_keys: list[str] | None = None,
    witness_state: str | Path | None = None,
) -> VerifyResult:
    """Walk the sealed log from #1 to the head (constant memory), and against the signed
    checkpoints in ``checkpoint_dir`` when given (see ``audit.verify``); with
    ``witness_state``, the log must also extend the last head that witness saw."""
    witnessed = None
    if witness_state is not None:
        witnessed = witnessed_head(witness_state, trusted_keys(public_keys))
    return verify_log(checkpoint_dir=checkpoint_dir, public_keys=public_keys, witnessed=witnessed)


def do_verify_chain(
    actor: Actor,
    *,
    checkpoint_dir: str | Path | None = None,
    public_keys: list[str] | None = None,
    witness_state: str | Path | None = None,
) -> ChainVerification:
    """Verify the log (against the configured checkpoint directory unless another is given),
    keep the result for the audit page, and audit the verification."""
    if checkpoint_dir is None and settings.DLO_AUDIT_CHECKPOINT_DIR:
        checkpoint_dir = settings.DLO_AUDIT_CHECKPOINT_DIR
    started = ChainVerification.objects.create()
    try:
        result = verify_chain(
            checkpoint_dir=checkpoint_dir, public_keys=public_keys, witness_state=witness_state
        )
    except (OSError, ValueError) as exc:  # an unreadable key or directory: say so, no trace
        result = VerifyResult(False, 0, None, "", None, f"cannot verify: {exc}")
    unsealed = sealer.unsealed_status()
    if unsealed["count"]:
        result.notes.append(
            f"{unsealed['count']} newer events are not sealed yet (oldest "
            f"{unsealed['oldest_age_s']:.0f} s): they join the chain within seconds and are "
            "not covered by this verification"
        )
    with transaction.atomic():
        ChainVerification.objects.filter(pk=started.pk).update(
            finished_at=timezone.now(),
            ok=result.ok,
            events=result.events,
            head_seq=result.head_seq,
            head_hash=result.head_hash,
            first_bad_seq=result.first_bad_seq,
            problem=result.summary()
            if not result.ok and result.first_bad_seq is None
            else result.problem,
            checkpoints_matched=result.checkpoints_matched,
            notes="\n".join(result.notes),
        )
        record(
            "audit.verify",
            actor=actor,
            target_type="audit.chain",
            target_repr=result.summary()[:300],
            outcome=Outcome.SUCCESS if result.ok else Outcome.FAILED,
        )
    started.refresh_from_db()
    return started
