"""Hashing and verification of the audit log, shared by the database walk, the checkpoints and
the offline verification of an export. ``docs/audit.md`` specifies every byte; the standard-
library ``audit/verify_export.py`` re-implements it without importing this module.

Format 2 (every event recorded since the re-anchor):

* An event is two canonical JSON texts, stored verbatim in text columns and hashed as stored
  (so no database normalisation of numbers or strings can change what was hashed):
  ``index_json`` holds the fields exports filter on (``INDEX_FIELDS``) and ``detail_json`` the
  rest (``DETAIL_FIELDS``). Canonical: sorted keys, no white space, UTF-8, no NaN/Infinity.
* ``leaf = SHA-256(0x00 || SHA-256(index_json) || SHA-256(detail_json))`` (an RFC 9162 leaf
  hash over 64 bytes of leaf data), so a non-matching event can be proven by showing its
  index text and the hash of its detail, without revealing the detail.
* ``hash = SHA-256(prev_hash || leaf)`` (raw bytes; ``prev_hash`` of event #1 is ``GENESIS``):
  the chain that names the first bad seq inside the database.
* The Merkle tree over all leaves in seq order is RFC 9162's (``node = SHA-256(0x01 || l ||
  r)``); signed checkpoints commit to its root.

Format 1 (events before the re-anchor, kept and verified as they were written):
``hash = SHA-256(canonical JSON of HASHED_FIELDS)``, ``prev_hash`` inside the hashed fields,
and the event's Merkle leaf is ``SHA-256(0x00 || hash)``.
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
# Format 2: the stored key of each field (the model's column in brackets when it differs).
INDEX_FIELDS = (
    "action",
    "actor",  # actor_username
    "channel",  # channel_slug
    "created_at",
    "outcome",
    "plan",  # plan_id
    "target_id",
    "target_type",
)
DETAIL_FIELDS = (
    "actor_id",
    "after",
    "before",
    "changes",
    "reason",
    "source_ip",
    "target_repr",
)
INDEX_COLUMNS = {"actor": "actor_username", "channel": "channel_slug", "plan": "plan_id"}


class UnrecordableValue(ValueError):
    """A value the audit log refuses (NaN, Infinity, nesting too deep for JSON)."""


def canonical_time(value: dt.datetime) -> str:
    """UTC, microsecond precision: what both SQLite and PostgreSQL store without loss."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical_json(value: Any) -> str:
    """The one serialisation that is hashed and stored: sorted keys, no insignificant white
    space, non-ASCII as UTF-8. NaN and Infinity have no JSON form and are refused."""
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except ValueError as exc:
        raise UnrecordableValue(f"not recordable: {exc} (NaN and Infinity are refused)") from None
    except RecursionError:
        raise UnrecordableValue("not recordable: the value is nested too deeply") from None


_sha = hashlib.sha256


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def leaf_hash(index_json: str, detail_json: str) -> bytes:
    return sha256(
        b"\x00" + sha256(index_json.encode("utf-8")) + sha256(detail_json.encode("utf-8"))
    )


def leaf_hash_from_detail_hash(index_json: str, detail_hash: bytes) -> bytes:
    return sha256(b"\x00" + sha256(index_json.encode("utf-8")) + detail_hash)


def legacy_leaf(hash_hex: str) -> bytes:
    return sha256(b"\x00" + bytes.fromhex(hash_hex))


def chain_hash(prev_hash: str, leaf: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(prev_hash) + leaf).hexdigest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return sha256(b"\x01" + left + right)


def compute_hash(fields: Mapping[str, Any]) -> str:
    """Format 1's event hash (events recorded before the re-anchor)."""
    payload = {name: fields.get(name) for name in HASHED_FIELDS}
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


class MerkleFrontier:
    """The right edge of an RFC 9162 Merkle tree: the roots of its perfect subtrees, largest
    first. Appending a leaf is O(log n) amortised and the root of the tree so far is a fold of
    at most log2(n) hashes, so the sealer keeps the tree current without re-reading it."""

    def __init__(self, size: int = 0, stack: list[tuple[int, bytes]] | None = None) -> None:
        self.size = size
        self.stack: list[tuple[int, bytes]] = stack or []

    def append(self, leaf: bytes) -> None:
        stack = self.stack
        height, value = 0, leaf
        while stack and stack[-1][0] == height:
            value = sha256(b"\x01" + stack.pop()[1] + value)
            height += 1
        stack.append((height, value))
        self.size += 1

    def root(self) -> str:
        if not self.stack:
            return hashlib.sha256(b"").hexdigest()  # RFC 9162: MTH of the empty tree
        value = self.stack[-1][1]
        for _, left in reversed(self.stack[:-1]):
            value = node_hash(left, value)
        return value.hex()

    def dumps(self) -> str:
        return json.dumps({"size": self.size, "stack": [[h, v.hex()] for h, v in self.stack]})

    @classmethod
    def loads(cls, text: str) -> MerkleFrontier:
        if not text:
            return cls()
        data = json.loads(text)
        return cls(int(data["size"]), [(int(h), bytes.fromhex(v)) for h, v in data["stack"]])


def subtree_hashes_before(leaves: Iterable[bytes], first: int, size: int) -> list[str]:
    """The range proof for a range of leaves ``[first, size)`` of a tree of ``size`` leaves:
    the hashes of the subtrees that RFC 9162's recursion meets entirely left of ``first``, in
    the order a verifier consumes them (see ``root_from_range``). ``leaves`` are the leaves
    ``[0, first)`` in order."""
    frontier = MerkleFrontier()
    for leaf in leaves:
        frontier.append(leaf)
    if frontier.size != first or first > size:
        raise ValueError("the leaves before the range are not all there")
    # The subtrees of [0, first) that the recursion of MTH(D[0:size]) takes whole are exactly
    # the perfect subtrees of the frontier at ``first`` (aligned powers of two, largest first).
    return [value.hex() for _, value in frontier.stack]


def root_from_range(proof: list[bytes], first: int, leaves: list[bytes], size: int) -> bytes:
    """RFC 9162's MTH over ``size`` leaves, given the subtree hashes left of ``first`` (the
    frontier at ``first``, largest first) and the leaves ``[first, size)``."""
    known = list(leaves)
    heights = _frontier_heights(first)
    if len(heights) != len(proof) or len(known) != size - first:
        raise ValueError("the proof does not fit the range")
    subtrees = {}
    start = 0
    for height, value in zip(heights, proof, strict=True):
        subtrees[(start, start + (1 << height))] = value
        start += 1 << height

    def mth(lo: int, hi: int) -> bytes:
        if (lo, hi) in subtrees:
            return subtrees[(lo, hi)]
        if hi - lo == 1:
            if lo < first:
                raise ValueError("the proof does not cover the leaves before the range")
            return known[lo - first]
        k = 1
        while k * 2 < hi - lo:
            k *= 2
        return node_hash(mth(lo, lo + k), mth(lo + k, hi))

    if size == 0:
        return hashlib.sha256(b"").digest()
    return mth(0, size)


def _frontier_heights(size: int) -> list[int]:
    return [h for h in range(size.bit_length() - 1, -1, -1) if size >> h & 1]


def readable_matches(event: Mapping[str, Any]) -> bool:
    """An exported format-2 line's readable fields equal its hashed texts."""
    try:
        index, detail = json.loads(event["index_json"]), json.loads(event["detail_json"])
    except (TypeError, ValueError):
        return False
    expected = {INDEX_COLUMNS.get(k, k): v for k, v in index.items()}
    expected.update(detail)
    return all(event.get(name) == value for name, value in expected.items())


@dataclasses.dataclass
class VerifyResult:
    ok: bool
    events: int
    head_seq: int | None
    head_hash: str
    first_bad_seq: int | None = None
    problem: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)
    bad_checkpoint: int | None = None
    checkpoints_matched: int = 0

    def summary(self) -> str:
        if self.ok:
            return f"OK: {self.events} events verified; head #{self.head_seq} {self.head_hash}"
        if self.first_bad_seq is None and self.bad_checkpoint is not None:
            return f"BROKEN at checkpoint #{self.bad_checkpoint}: {self.problem}"
        if self.first_bad_seq is None:
            return f"BROKEN: {self.problem}"
        return f"BROKEN at seq {self.first_bad_seq}: {self.problem}"


def verify_events(
    events: Iterable[Mapping[str, Any]],
    *,
    start_prev_hash: str | None = GENESIS,
    start_seq: int | None = 1,
    expected_head: tuple[int, str] | None = None,
) -> VerifyResult:
    """Walk format-1 or format-2 events (dicts with the stored fields) in the order given and
    report the first that breaks the chain.

    1. Sequence numbers must be contiguous from ``start_seq`` (``None`` accepts whatever the
       first event has, for an exported range).
    2. Each ``prev_hash`` must equal the previous event's ``hash`` (``start_prev_hash`` for the
       first; ``None`` trusts the first event's own, for a range that starts mid-chain).
    3. Each stored ``hash`` must equal the hash recomputed from what is stored.
    4. If ``expected_head`` is given, the walk must end exactly there.
    """
    walk = ChainWalk(start_prev_hash=start_prev_hash, start_seq=start_seq)
    for event in events:
        if not walk.add(event):
            break
    else:
        if expected_head is not None:
            walk.end_at(*expected_head)
    return walk.result()


class ChainWalk:
    """The verifier's state, one event at a time (constant memory): the chain, the Merkle
    frontier, and the first problem found. ``on_size`` is called with the frontier after each
    event, so checkpoints can be compared at their tree size during the same walk."""

    def __init__(self, *, start_prev_hash: str | None = GENESIS, start_seq: int | None = 1) -> None:
        self.prev_hash = start_prev_hash
        self.expected_seq = start_seq
        self.count = 0
        self.last_seq: int | None = None
        self.last_hash = ""
        self.frontier = MerkleFrontier()
        self.failure: VerifyResult | None = None
        self.tolerated: set[int] = set()
        self.notes: list[str] = []
        self.pending_hash = ""

    def fail(self, seq: int | None, problem: str) -> bool:
        self.failure = VerifyResult(
            False, self.count, self.last_seq, self.last_hash, seq, problem, self.notes
        )
        return False

    def add(self, event: Mapping[str, Any]) -> bool:
        """One event as a dict of its stored (or exported) fields, format 1 or 2."""
        seq = int(event["seq"])
        if event.get("index_json"):
            if "actor_username" in event and not readable_matches(event):
                return self.fail(
                    seq, "the readable fields differ from the hashed texts: the line was modified"
                )
            return self.add_texts(
                seq,
                str(event["prev_hash"]),
                str(event["hash"]),
                str(event["index_json"]).encode("utf-8"),
                str(event["detail_json"]).encode("utf-8"),
            )
        if not self._order(seq, str(event["prev_hash"])):
            return False
        stored = str(event["hash"])
        if compute_hash(event) != stored:
            if seq not in self.tolerated:
                return self.fail(
                    seq, "stored hash does not match the event's contents: the event was modified"
                )
            self.notes.append(
                f"event #{seq} did not verify when the log was re-anchored (listed in the "
                "audit.reanchor event); the events after it are checked against its stored hash"
            )
        try:
            leaf = legacy_leaf(stored)
        except ValueError:
            return self.fail(seq, "the stored hash is not a SHA-256: the event was modified")
        self._accept(seq, stored, leaf)
        return True

    def add_texts(
        self, seq: int, prev: str, stored: str, index_json: bytes, detail_json: bytes
    ) -> bool:
        """A format-2 event (the hot path of a million-event walk: kept lean)."""
        if (seq != self.expected_seq or prev != self.prev_hash) and not self._order(seq, prev):
            return False
        leaf = _sha(b"\x00" + _sha(index_json).digest() + _sha(detail_json).digest()).digest()
        try:
            recomputed = _sha(bytes.fromhex(prev) + leaf).hexdigest()
        except ValueError:
            recomputed = ""
        if recomputed != stored:
            return self.fail(
                seq, "stored hash does not match the event's contents: the event was modified"
            )
        self._accept(seq, stored, leaf)
        return True

    def _order(self, seq: int, prev: str) -> bool:
        if self.expected_seq is not None and seq != self.expected_seq:
            if seq > self.expected_seq:
                problem = f"event #{self.expected_seq} is missing (the next event is #{seq})"
            else:
                problem = f"event #{seq} is out of order (expected #{self.expected_seq})"
            return self.fail(self.expected_seq, problem)
        if self.prev_hash is not None and prev != self.prev_hash:
            return self.fail(
                seq,
                f"prev_hash {prev[:12]}… does not match the hash of the event before it "
                f"({self.prev_hash[:12]}…): an event was inserted, removed or reordered",
            )
        return True

    def _accept(self, seq: int, stored: str, leaf: bytes) -> None:
        self.pending_hash = stored
        self.frontier.append(leaf)
        self.count += 1
        self.prev_hash = stored
        self.last_seq, self.last_hash = seq, stored
        self.expected_seq = seq + 1

    def end_at(self, head_seq: int, head_hash: str) -> bool:
        last = self.last_seq or 0
        if last < head_seq:
            return self.fail(
                last + 1,
                f"the chain ends at #{last} but the head records #{head_seq}: "
                f"events #{last + 1}–#{head_seq} are missing (tail truncated)",
            )
        if last > head_seq or (head_seq and self.last_hash != head_hash):
            return self.fail(last, f"the chain's last event #{last} does not match the head")
        return True

    def result(self) -> VerifyResult:
        if self.failure is not None:
            return self.failure
        return VerifyResult(True, self.count, self.last_seq, self.last_hash, notes=self.notes)
