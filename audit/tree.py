"""The audit log's RFC 9162 Merkle tree, kept as stored complete subtrees, and its
consistency proofs (RFC 9162 §2.1.4).

Every signed checkpoint is a tree head: ``tree_size`` and ``root_hash`` of the tree whose leaf
``i`` is the leaf hash of event ``seq = i + 1`` (``audit.chain``: ``0x00`` leaves, ``0x01``
nodes). When a checkpoint is written, the events sealed since the last one are read once and
each complete subtree they finish is stored (``AuditTreeNode``), so:

* a consistency proof between any two tree sizes is at most ~2·log2(n) subtree lookups in one
  query (``consistency_proof``), never a re-read of the log;
* the root at any stored size is a fold of at most log2(n) stored subtrees (``root_at``).

The pure functions below (``proof_ranges``, ``verify_consistency``) have no Django and no
database; ``audit/witness.py`` carries its own standard-library copy of the verification.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from django.db.models import Max, Q

from audit.chain import MerkleFrontier, leaf_hash, legacy_leaf, node_hash
from audit.models import AuditEvent, AuditTreeNode

EMPTY_ROOT = hashlib.sha256(b"").digest()
READ_CHUNK = 5000  # events read per round trip while extending the tree
WRITE_BATCH = 5000  # nodes per INSERT


class TreeError(RuntimeError):
    """The stored tree cannot answer (a size beyond it, a missing node, events changed since
    they were sealed)."""


# -- pure: which subtrees a proof names, and checking one -----------------------------------


def _largest_power_below(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (n ≥ 2): RFC 9162's ``k``."""
    return 1 << ((n - 1).bit_length() - 1)


def proof_ranges(first: int, second: int) -> list[tuple[int, int]]:
    """The leaf ranges ``[lo, hi)`` whose Merkle tree hashes make RFC 9162's consistency proof
    ``PROOF(first, D[second])``, in order (§2.1.4.1, ``SUBPROOF`` with offsets)."""
    if not 0 < first <= second:
        raise ValueError("a consistency proof needs 0 < first <= second")
    ranges: list[tuple[int, int]] = []
    tail: list[tuple[int, int]] = []
    m, lo, hi, whole = first, 0, second, True
    # SUBPROOF(m, D[lo:hi], b), unrolled: each step appends one range after the sub-proof.
    while True:
        n = hi - lo
        if m == n:
            if not whole:
                ranges.append((lo, hi))
            break
        k = _largest_power_below(n)
        if m <= k:
            tail.append((lo + k, hi))
            hi = lo + k
        else:
            tail.append((lo, lo + k))
            m, lo, whole = m - k, lo + k, False
    return ranges + tail[::-1]


def subtrees(lo: int, hi: int) -> list[tuple[int, int]]:
    """The complete subtrees ``(level, index)`` whose fold (right to left) is MTH(D[lo:hi]),
    for a range that is a node of RFC 9162's tree (``lo`` aligned), largest first."""
    out = []
    while lo < hi:
        level = (hi - lo).bit_length() - 1
        if lo % (1 << level):
            raise ValueError(f"[{lo}, {hi}) is not a subtree of the log's Merkle tree")
        out.append((level, lo >> level))
        lo += 1 << level
    return out


def fold(hashes: list[bytes]) -> bytes:
    """MTH of a range from its complete subtrees (largest first)."""
    if not hashes:
        return EMPTY_ROOT
    value = hashes[-1]
    for left in reversed(hashes[:-1]):
        value = node_hash(left, value)
    return value


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: list[bytes]
) -> bool:
    """RFC 9162 §2.1.4.2: does ``proof`` show the tree of ``second`` leaves with
    ``second_root`` extends the tree of ``first`` leaves with ``first_root``?"""
    if first > second or first < 0:
        return False
    if first == second:
        return not proof and first_root == second_root
    if first == 0:
        return not proof
    path = list(proof)
    if first & (first - 1) == 0:  # 1. a power of two: the old root is the first node
        path.insert(0, first_root)
    if not path:
        return False
    fn, sn = first - 1, second - 1  # 2.
    while fn & 1:  # 3.
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]  # 4.
    for c in path[1:]:  # 5.
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while True:
                    fn, sn = fn >> 1, sn >> 1
                    if fn & 1 or fn == 0:
                        break
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_root and sr == second_root and sn == 0  # 6.


def proof_from(first: int, second: int, get: Callable[[int, int], bytes]) -> list[bytes]:
    """The proof's hashes, with ``get(level, index)`` giving a stored subtree."""
    return [
        fold([get(level, index) for level, index in subtrees(lo, hi)])
        for lo, hi in proof_ranges(first, second)
    ]


# -- the stored tree ------------------------------------------------------------------------


def stored_size() -> int:
    """How many leaves the stored tree has (its last level-0 node + 1)."""
    last = AuditTreeNode.objects.filter(level=0).aggregate(last=Max("index"))["last"]
    return 0 if last is None else int(last) + 1


def _fetch(keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
    wanted = set(keys)
    if not wanted:
        return {}
    query = Q()
    for level, index in wanted:
        query |= Q(level=level, index=index)
    found = {
        (level, index): bytes(value)
        for level, index, value in AuditTreeNode.objects.filter(query).values_list(
            "level", "index", "hash"
        )
    }
    missing = wanted - set(found)
    if missing:
        level, index = min(missing)
        raise TreeError(
            f"the stored Merkle tree lacks subtree {level}/{index}: it was deleted or the "
            "tree is not built that far (run `manage.py audit checkpoint`)"
        )
    return found


def consistency_proof(first: int, second: int) -> list[bytes]:
    """RFC 9162's consistency proof between the stored tree's sizes ``first`` and ``second``,
    from at most ~2·log2(second) stored subtrees read in one query."""
    if first == second or first == 0:
        return []
    ranges = proof_ranges(first, second)
    keys = [key for lo, hi in ranges for key in subtrees(lo, hi)]
    found = _fetch(keys)
    return proof_from(first, second, lambda level, index: found[(level, index)])


def root_at(size: int) -> bytes:
    """MTH of the first ``size`` leaves, from at most log2(size) stored subtrees."""
    keys = subtrees(0, size)
    found = _fetch(keys)
    return fold([found[key] for key in keys])


def _frontier_at(size: int) -> MerkleFrontier:
    keys = subtrees(0, size)
    found = _fetch(keys)
    return MerkleFrontier(size, [(level, found[(level, index)]) for level, index in keys])


def extend(upto: int, expected_root: str) -> int:
    """Store the complete subtrees of events ``#stored_size()+1``–``#upto`` (call under the
    head row's lock, in its transaction), then check the root at ``upto`` is ``expected_root``
    (the sealer's own). Returns how many leaves were added. The first call on a log that
    predates the stored tree reads it once from #1 (a one-time upgrade)."""
    size = stored_size()
    if size > upto:
        raise TreeError(
            f"the stored Merkle tree has {size} leaves but the log ends at #{upto}: the log "
            "was cut after it was checkpointed"
        )
    frontier = _frontier_at(size)
    stack = frontier.stack
    start = size
    nodes: list[AuditTreeNode] = []
    rows = (
        AuditEvent.objects.filter(seq__gt=size, seq__lte=upto)
        .order_by("seq")
        .values_list("seq", "index_json", "detail_json", "hash")
    )
    for seq, index_json, detail_json, stored in rows.iterator(chunk_size=READ_CHUNK):
        position = frontier.size
        if seq != position + 1:
            raise TreeError(f"event #{position + 1} is missing from the sealed log")
        if not index_json and not stored:
            raise TreeError(f"event #{seq} has neither texts nor a hash: it was modified")
        leaf = leaf_hash(index_json, detail_json) if index_json else legacy_leaf(str(stored))
        # RFC 9162's tree grows on its right edge: each merge finishes one complete subtree.
        nodes.append(AuditTreeNode(level=0, index=position, hash=leaf))
        height, value = 0, leaf
        while stack and stack[-1][0] == height:
            value = node_hash(stack.pop()[1], value)
            height += 1
            nodes.append(AuditTreeNode(level=height, index=position >> height, hash=value))
        stack.append((height, value))
        frontier.size += 1
        if len(nodes) >= WRITE_BATCH:
            AuditTreeNode.objects.bulk_create(nodes)
            nodes = []
    if frontier.size != upto:
        raise TreeError(f"event #{frontier.size + 1} is missing from the sealed log")
    if nodes:
        AuditTreeNode.objects.bulk_create(nodes)
    if frontier.root() != expected_root:
        raise TreeError(
            f"events #{start + 1}–#{upto} no longer hash to the Merkle root the sealer "
            "computed: they were modified after sealing (run `manage.py audit verify`)"
        )
    return upto - start
