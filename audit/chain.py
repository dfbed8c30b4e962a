"""Hashing and verification of the audit chain, shared by the database walk and the offline
verification of an exported JSON Lines file.

The hash of an event is SHA-256 over its canonical serialization: the fields of
``AuditEvent.canonical_fields()`` (which include ``prev_hash``) as JSON with sorted keys, no
insignificant white space and non-ASCII kept as UTF-8. The first event's ``prev_hash`` is
``GENESIS``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

GENESIS = "0" * 64
HASHED_FIELDS = (
    "seq",
    "created_at",
    "actor_id",
    "actor_username",
    "source_ip",
    "action",
    "target_type",
    "target_id",
    "target_repr",
    "channel_slug",
    "reason",
    "before",
    "after",
    "changes",
    "outcome",
    "prev_hash",
)


def canonical_time(value: dt.datetime) -> str:
    """UTC, microsecond precision: what both SQLite and PostgreSQL store without loss."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def compute_hash(fields: Mapping[str, Any]) -> str:
    payload = {name: fields.get(name) for name in HASHED_FIELDS}
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


@dataclasses.dataclass
class VerifyResult:
    ok: bool
    events: int
    head_seq: int | None
    head_hash: str
    first_bad_seq: int | None = None
    problem: str = ""

    def summary(self) -> str:
        if self.ok:
            return f"OK: {self.events} events verified; head #{self.head_seq} {self.head_hash}"
        return f"BROKEN at seq {self.first_bad_seq}: {self.problem}"


def verify_events(
    events: Iterable[Mapping[str, Any]],
    *,
    start_prev_hash: str | None = GENESIS,
    start_seq: int | None = 1,
    expected_head: tuple[int, str] | None = None,
) -> VerifyResult:
    """Walk events in the order given and report the first that breaks the chain.

    1. Sequence numbers must be contiguous from ``start_seq`` (a gap names the missing seq;
       ``None`` accepts whatever the first event has, for an exported range).
    2. Each ``prev_hash`` must equal the previous event's ``hash`` (``start_prev_hash`` for the
       first; ``None`` trusts the first event's own, for a range that starts mid-chain).
    3. Each stored ``hash`` must equal the hash recomputed from the event's fields.
    4. If ``expected_head`` is given, the walk must end exactly there (a truncated tail names
       the first missing seq).
    """
    count = 0
    prev_hash = start_prev_hash
    expected_seq = start_seq
    last_seq: int | None = None
    last_hash = ""
    for event in events:
        seq = int(event["seq"])
        if expected_seq is not None and seq != expected_seq:
            if seq > expected_seq:
                problem = f"event #{expected_seq} is missing (the next event is #{seq})"
            else:
                problem = f"event #{seq} is out of order (expected #{expected_seq})"
            return VerifyResult(False, count, last_seq, last_hash, expected_seq, problem)
        if prev_hash is not None and event["prev_hash"] != prev_hash:
            problem = (
                f"prev_hash {str(event['prev_hash'])[:12]}… does not match the hash of the "
                f"event before it ({prev_hash[:12]}…): an event was inserted, removed or reordered"
            )
            return VerifyResult(False, count, last_seq, last_hash, seq, problem)
        recomputed = compute_hash(event)
        if recomputed != event["hash"]:
            problem = "stored hash does not match the event's contents: the event was modified"
            return VerifyResult(False, count, last_seq, last_hash, seq, problem)
        count += 1
        prev_hash = str(event["hash"])
        last_seq, last_hash = seq, prev_hash
        expected_seq = seq + 1
    if expected_head is not None:
        head_seq, head_hash = expected_head
        if (last_seq or 0) < head_seq:
            missing = (last_seq or 0) + 1
            problem = (
                f"the chain ends at #{last_seq or 0} but the head records #{head_seq}: "
                f"events #{missing}–#{head_seq} are missing (tail truncated)"
            )
            return VerifyResult(False, count, last_seq, last_hash, missing, problem)
        if (last_seq or 0) > head_seq or (head_seq and last_hash != head_hash):
            problem = f"the chain's last event #{last_seq} does not match the recorded head"
            return VerifyResult(False, count, last_seq, last_hash, last_seq, problem)
    return VerifyResult(True, count, last_seq, last_hash)
