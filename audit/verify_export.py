"""Verify an audit export (JSON Lines) offline: Python 3 standard library only, no Django.

    python3 verify_export.py export.jsonl [--hashes-only]
                             [--checkpoints DIR --public-key KEY [--public-key OLDKEY ...]]
    python3 verify_export.py proof.jsonl --public-key KEY
                             [--expect NAME=VALUE ... | --expect-all] [--from-seq N]
                             [--min-checkpoint N] [--witness STATE.jsonl]

A plain export: recomputes each event's hash (format 1 or 2, docs/audit.md) and, unless
--hashes-only (a filtered export, which has gaps), checks that each event links to the one
before it. With --checkpoints and --public-key, also checks the checkpoint files (signatures,
numbering, links) and, for an export that starts at event #1, that the Merkle root of its
events matches every signed checkpoint it reaches.

A proof export (first line "dlo-audit-proof/1", from `audit export --proof`): checks the
signed checkpoint in it, rebuilds the checkpoint's Merkle root from the export, and checks that
every event of the range that matches the filters is in the export in full and every withheld
one does not match. Exit status 0 when the file verifies, 1 naming the first bad event or
checkpoint.

A proof proves what its header says; these bind it to what the reader asked for (any of them
also requires the range to start at #1 unless --from-seq says otherwise): --expect NAME=VALUE
(repeat; exactly these filters, --expect-all for none), --min-checkpoint N (a checkpoint at
least that new) and --witness STATE (at least the last head a witness saw, and the same
checkpoint where the numbers are equal). A mismatch prints "MISMATCH: ..." and exits 1.
"""

import base64
import collections
import datetime as dt
import hashlib
import json
import os
import sys
from pathlib import Path

FIELDS = ("seq", "created_at", "actor_id", "actor_username", "source_ip", "action",
          "target_type", "target_id", "target_repr", "channel_slug", "reason", "before",
          "after", "changes", "outcome", "prev_hash")  # fmt: skip
INDEX_NAMES = {"actor": "actor_username", "channel": "channel_slug", "plan": "plan_id"}
GENESIS = "0" * 64


def sha256(data):
    return hashlib.sha256(data).digest()


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# -- Ed25519 signature verification, RFC 8032 section 5.1.7 (the reference arithmetic) -------

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = -121665 * pow(121666, P - 2, P) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)


def _recover_x(y, sign):
    if y >= P:
        return None
    x2 = (y * y - 1) * pow(D * y * y + 1, P - 2, P)
    if x2 % P == 0:
        return None if sign else 0
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P:
        return None
    return P - x if (x & 1) != sign else x


def _add(a, b):
    e1 = (a[1] - a[0]) * (b[1] - b[0]) % P
    e2 = (a[1] + a[0]) * (b[1] + b[0]) % P
    c = 2 * a[3] * b[3] * D % P
    d = 2 * a[2] * b[2] % P
    e, f, g, h = e2 - e1, d - c, d + c, e2 + e1
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _mul(scalar, point):
    result = (0, 1, 1, 0)
    while scalar:
        if scalar & 1:
            result = _add(result, point)
        point, scalar = _add(point, point), scalar >> 1
    return result


def _point(data):
    if len(data) != 32:
        return None
    y = int.from_bytes(data, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    x = _recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % P)


_BY = 4 * pow(5, P - 2, P) % P
BASE = (_recover_x(_BY, 0), _BY, 1, _recover_x(_BY, 0) * _BY % P)


def ed25519_verify(public, message, signature):
    if len(public) != 32 or len(signature) != 64:
        return False
    a, r = _point(public), _point(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= L:
        return False
    h = int.from_bytes(hashlib.sha512(signature[:32] + public + message).digest(), "little")
    left, right = _mul(s, BASE), _add(r, _mul(h % L, a))
    return (left[0] * right[2] - right[0] * left[2]) % P == 0 and (
        left[1] * right[2] - right[1] * left[2]
    ) % P == 0


def read_public_key(path):
    """``ed25519 <base64 raw key>`` (what `audit keygen` writes) or a PEM public key."""
    text = Path(path).read_text(encoding="ascii").strip()
    if text.startswith("ed25519 "):
        raw = base64.b64decode(text.split()[1])
    else:
        body = "".join(line for line in text.splitlines() if not line.startswith("-----"))
        der = base64.b64decode(body)
        if len(der) != 44 or der[:12] != bytes.fromhex("302a300506032b6570032100"):
            raise ValueError(f"{path}: not an Ed25519 public key")
        raw = der[12:]
    return hashlib.sha256(raw).hexdigest()[:16], raw


# -- hashes and the Merkle tree (RFC 9162) ----------------------------------------------------


def event_hash(event):
    """Format 1: the hash of the canonical JSON of FIELDS."""
    return hashlib.sha256(canonical({n: event.get(n) for n in FIELDS}).encode()).hexdigest()


def leaf_of(event):
    """(recomputed chain hash or None, Merkle leaf) of an exported event."""
    if "index_json" in event:
        data = sha256(event["index_json"].encode()) + sha256(event["detail_json"].encode())
        leaf = sha256(b"\x00" + data)
        return hashlib.sha256(bytes.fromhex(event["prev_hash"]) + leaf).hexdigest(), leaf
    return event_hash(event), sha256(b"\x00" + bytes.fromhex(event["hash"]))


def readable_ok(event):
    if "index_json" not in event:
        return True
    fields = {INDEX_NAMES.get(k, k): v for k, v in json.loads(event["index_json"]).items()}
    fields.update(json.loads(event["detail_json"]))
    return all(event.get(name) == value for name, value in fields.items())


class Frontier:
    def __init__(self):
        self.stack, self.size = [], 0

    def append(self, leaf):
        height = 0
        while self.stack and self.stack[-1][0] == height:
            leaf = sha256(b"\x01" + self.stack.pop()[1] + leaf)
            height += 1
        self.stack.append((height, leaf))
        self.size += 1

    def root(self):
        if not self.stack:
            return hashlib.sha256(b"").hexdigest()
        value = self.stack[-1][1]
        for _, left in reversed(self.stack[:-1]):
            value = sha256(b"\x01" + left + value)
        return value.hex()


# -- checkpoints --------------------------------------------------------------------------------


def check_signature(checkpoint, signature, keys):
    key = keys.get(checkpoint.get("key_id"))
    signed = canonical(checkpoint).encode("utf-8")
    return key is not None and ed25519_verify(key, signed, base64.b64decode(signature))


def _raw(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _checkpoint_files(directory):
    """(number, path, checkpoint, signature, conflict) per checkpoint in number order: the
    day segments (checkpoints-YYYYMMDD.jsonl, one file's JSON object a line) first, then the
    checkpoint-N.json files for numbers no segment holds (a file a segment covers is not
    opened: the same directory's copy, checked the same way). Two segments disagreeing about
    a number is a conflict; a line that does not parse (cut short by a crash) is skipped, so
    that number's file is read instead."""
    names = os.listdir(directory)
    lines: dict[int, tuple[str, tuple[dict, str]]] = {}
    conflicts: dict[int, str] = {}
    for name in sorted(n for n in names if n.startswith("checkpoints-") and n.endswith(".jsonl")):
        try:
            data = Path(directory, name).read_bytes()
        except OSError:
            continue
        for line in data.split(b"\n"):
            try:
                obj = json.loads(line)
                number, value = (
                    int(obj["checkpoint"]["number"]),
                    (obj["checkpoint"], obj["signature"]),
                )
            except (ValueError, KeyError, TypeError):
                continue
            if lines.setdefault(number, (name, value))[1] != value:
                conflicts[number] = f"{lines[number][0]} and {name} differ"
    files = {}
    for name in names:
        if name.startswith("checkpoint-") and name.endswith(".json"):
            digits = name[len("checkpoint-") : -len(".json")]
            named = int(digits) if digits.isdigit() else -1
            if named in lines:
                continue
            path = Path(directory, name)
            on_file: tuple[dict, str] | None
            try:
                data = json.loads(_raw(path))
                on_file = (data["checkpoint"], data["signature"])
            except (OSError, ValueError, KeyError, TypeError):
                on_file = None
            files[named] = (path, on_file)
    entries = {n: (Path(directory, lines[n][0]), *lines[n][1]) for n in lines}
    entries.update({n: (path, *(value or (None, None))) for n, (path, value) in files.items()})
    for number in sorted(entries):
        path, cp, signature = entries[number]
        yield number, path, cp, signature, conflicts.get(number)


def read_checkpoints(directory, keys):
    """The checkpoint files in order, or stops at the first that is missing, misnamed,
    unsigned, unlinked or shrinking. Returns (checkpoints, problem or None).

    Each checkpoint names the hash of the one before it, so one valid signature vouches for
    every earlier body: only the last checkpoint signed by each key is verified (pure-Python
    Ed25519 takes milliseconds), and a broken link is traced to the forged checkpoint."""
    good: list = []
    prev_digest, prev_signature = GENESIS, None
    files = _checkpoint_files(directory)
    following = next(files, None)
    while following is not None:
        named, path, cp, signature, conflict = following
        following = next(files, None)
        if conflict:
            return good, f"BROKEN at checkpoint #{named}: {conflict} (a copy was altered)"
        if cp is None:
            return good, f"BROKEN at checkpoint #{named}: {path.name} is not a checkpoint"
        expected = len(good) + 1
        if cp.get("number") != named:
            return good, f"BROKEN at checkpoint #{named}: the file holds #{cp.get('number')}"
        if named != expected:
            return good, f"BROKEN at checkpoint #{expected}: missing (next is #{named})"
        if cp.get("key_id") not in keys:
            return good, f"BROKEN at checkpoint #{named}: signature does not verify"
        last_of_key = following is None or (following[2] or {}).get("key_id") != cp["key_id"]
        if last_of_key and not check_signature(cp, signature, keys):
            return good, f"BROKEN at checkpoint #{named}: signature does not verify"
        if cp.get("prev_checkpoint") != prev_digest:
            if good and not check_signature(good[-1], prev_signature, keys):
                return good[:-1], f"BROKEN at checkpoint #{named - 1}: signature does not verify"
            return good, f"BROKEN at checkpoint #{named}: does not follow #{named - 1}"
        if good and cp["tree_size"] < good[-1]["tree_size"]:
            return good, f"BROKEN at checkpoint #{named}: the tree shrank"
        good.append(cp)
        prev_digest = hashlib.sha256(canonical(cp).encode("utf-8")).hexdigest()
        prev_signature = signature
    return good, None


# -- plain exports ------------------------------------------------------------------------------


def verify(lines, links=True, checkpoints=()):
    prev, count, frontier = None, 0, Frontier()
    pending = collections.deque(checkpoints)
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        seq = event["seq"]
        if prev and seq <= prev["seq"]:
            return f"BROKEN at #{seq}: out of order or repeated (after #{prev['seq']})"
        if links and prev and seq != prev["seq"] + 1:
            return f"BROKEN at #{prev['seq'] + 1}: missing (a filtered export? --hashes-only)"
        if links and prev and event["prev_hash"] != prev["hash"]:
            return f"BROKEN at #{seq}: prev_hash does not match the hash of #{prev['seq']}"
        try:
            recomputed, leaf = leaf_of(event)
        except (KeyError, ValueError):
            recomputed, leaf = None, b""
        if recomputed != event["hash"] or not readable_ok(event):
            return f"BROKEN at #{seq}: the hash does not match the contents (modified)"
        if frontier.size == seq - 1:  # a contiguous run from #1: the Merkle tree is known
            frontier.append(leaf)
            while pending and pending[0]["tree_size"] == frontier.size:
                cp = pending.popleft()
                if cp["root_hash"] != frontier.root():
                    return (
                        f"BROKEN at checkpoint #{cp['number']}: events up to #{seq} do not "
                        "match its signed Merkle root (rewritten after it was signed)"
                    )
        prev, count = event, count + 1
    last = f"#{prev['seq']} {prev['hash']}" if prev else "none"
    matched = len(checkpoints) - len(pending)
    return f"OK: {count} events; last {last}" + (
        f"; {matched} signed checkpoints matched" if checkpoints else ""
    )


# -- proof exports -------------------------------------------------------------------------------


def matches(filters, event, index):
    """The filter of `audit export` (docs/audit.md), applied to an event's index."""
    for name, wanted in filters.items():
        if name == "since":
            if index["created_at"] < wanted:
                return False
        elif name == "until":
            if index["created_at"] >= wanted:
                return False
        elif name == "action" and wanted.endswith("*"):
            if not index["action"].startswith(wanted[:-1]):
                return False
        elif index.get(name) != wanted:
            return False
    return True


def legacy_index(event):
    after = event.get("after")
    plan = ""
    if event.get("target_type") == "dlq.replayplan":
        plan = event.get("target_id")
    elif isinstance(after, dict) and isinstance(after.get("plan"), (int, str)):
        plan = str(after["plan"])
    names = ("action", "actor", "channel", "created_at", "outcome", "target_id", "target_type")
    index = {k: event.get(INDEX_NAMES.get(k, k)) for k in names}
    index["plan"] = plan
    return index


def root_from_range(prefix, first, leaves, size):
    heights = [h for h in range(first.bit_length() - 1, -1, -1) if first >> h & 1]
    if len(heights) != len(prefix) or len(leaves) != size - first:
        raise ValueError("the proof does not fit the range")
    known, start = {}, 0
    for height, value in zip(heights, prefix):  # noqa: B905 (lengths checked above)
        known[(start, start + (1 << height))] = value
        start += 1 << height

    def mth(lo, hi):
        if (lo, hi) in known:
            return known[(lo, hi)]
        if hi - lo == 1:
            return leaves[lo - first]
        k = 1
        while k * 2 < hi - lo:
            k *= 2
        return sha256(b"\x01" + mth(lo, lo + k) + mth(lo + k, hi))

    return mth(0, size) if size else sha256(b"")


def verify_proof(header, lines, keys, checkpoints):
    cp, filters = header["checkpoint"], header["filters"]
    if not check_signature(cp, header["signature"], keys):
        return f"BROKEN at checkpoint #{cp.get('number')}: signature does not verify"
    if checkpoints is not None and cp not in checkpoints:
        return f"BROKEN at checkpoint #{cp.get('number')}: not in the checkpoint directory"
    first, size = header["first_seq"] - 1, cp["tree_size"]
    leaves: list = []
    members = 0
    for line in lines:
        if not line.strip():
            continue
        item = json.loads(line)
        seq = item["seq"]
        if seq != first + len(leaves) + 1:
            return f"BROKEN at #{first + len(leaves) + 1}: missing from the proof"
        if item.get("withheld"):
            index = json.loads(item["index_json"])
            leaf = sha256(b"\x00" + sha256(item["index_json"].encode())
                          + bytes.fromhex(item["detail_sha256"]))  # fmt: skip
            if matches(filters, item, index):
                return f"BROKEN at #{seq}: matches the filters but was withheld"
        else:
            try:
                recomputed, leaf = leaf_of(item)
            except (KeyError, ValueError):
                recomputed, leaf = None, b""
            if recomputed != item["hash"] or not readable_ok(item):
                return f"BROKEN at #{seq}: the hash does not match the contents (modified)"
            index = json.loads(item["index_json"]) if "index_json" in item else legacy_index(item)
            members += matches(filters, item, index)
        leaves.append(leaf)
    try:
        root = root_from_range([bytes.fromhex(h) for h in header["prefix"]], first, leaves, size)
    except ValueError as exc:
        return f"BROKEN at checkpoint #{cp['number']}: {exc}"
    if root.hex() != cp["root_hash"]:
        return (
            f"BROKEN at checkpoint #{cp['number']}: the events do not rebuild its signed "
            "Merkle root (an event was changed, added or left out)"
        )
    return (
        f"OK: {members} events match {canonical(filters)} among #{first + 1}–#{size}, all of "
        f"them included; complete up to signed checkpoint #{cp['number']} ({cp['time']})"
    )


# -- what the reader asked for (issue 23, item 7) --------------------------------------------


def canonical_filter(name, value):
    """A filter as the proof header states it: times as UTC with microseconds, no offset
    meaning UTC (like `audit export`)."""
    if name in ("since", "until"):
        moment = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


def last_witnessed(path):
    """The last head in a witness's state file (``audit/witness.py``), read from its end."""
    with open(path, "rb") as state:
        state.seek(0, 2)
        state.seek(max(0, state.tell() - 65536))
        lines = [ln for ln in state.read().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{path}: no witnessed head")
    return json.loads(lines[-1])["checkpoint"]


def check_binding(header, expect):
    """None when the proof is for what was asked; else what differs. ``expect``: filters
    (name -> value), first_seq, min_checkpoint, witnessed (a checkpoint body), each only
    when given."""
    cp = header["checkpoint"]
    if expect["filters"] is not None:
        wanted = {k: canonical_filter(k, v) for k, v in expect["filters"].items()}
        if header["filters"] != wanted:
            return (
                f"MISMATCH: the proof is for the filters {canonical(header['filters'])}, not the "
                f"expected {canonical(wanted)} (an added filter can leave events out)"
            )
    if expect["first_seq"] is not None and header["first_seq"] != expect["first_seq"]:
        return (
            f"MISMATCH: the proof starts at #{header['first_seq']}, not at the expected "
            f"#{expect['first_seq']} (the events before it are not proven)"
        )
    floor = expect["min_checkpoint"]
    if floor is not None and cp["number"] < floor:
        return (
            f"MISMATCH: the proof ends at checkpoint #{cp['number']}, older than the expected "
            f"#{floor} (the events after it are not proven)"
        )
    seen = expect["witnessed"]
    if seen is not None:
        if cp["number"] < seen["number"] or cp["tree_size"] < seen["tree_size"]:
            return (
                f"MISMATCH: the proof ends at checkpoint #{cp['number']} ({cp['tree_size']} "
                f"events), older than the witnessed #{seen['number']} ({seen['tree_size']} "
                "events): the events after it are not proven"
            )
        if cp["number"] == seen["number"] and canonical(cp) != canonical(seen):
            return f"MISMATCH: checkpoint #{cp['number']} is not the one the witness saw (fork)"
    return None


def main(argv):
    args, keys, directory = [], {}, None
    expect: dict = {"filters": None, "first_seq": None, "min_checkpoint": None, "witnessed": None}
    it = iter(argv)
    for arg in it:
        if arg == "--public-key":
            key_id, raw = read_public_key(next(it))
            keys[key_id] = raw
        elif arg == "--checkpoints":
            directory = next(it)
        elif arg == "--expect":
            name, sep, value = next(it).partition("=")
            if not sep or not value:
                return "--expect takes NAME=VALUE (actor=bob, since=2026-01-01T00:00:00)"
            expect["filters"] = {**(expect["filters"] or {}), name: value}
        elif arg == "--expect-all":
            expect["filters"] = {}
        elif arg == "--from-seq":
            expect["first_seq"] = int(next(it))
        elif arg == "--min-checkpoint":
            expect["min_checkpoint"] = int(next(it))
        elif arg == "--witness":
            expect["witnessed"] = last_witnessed(next(it))
        else:
            args.append(arg)
    asked = any(v is not None for v in expect.values())
    if asked and expect["first_seq"] is None:
        expect["first_seq"] = 1  # asked for a range: from the start unless told otherwise
    checkpoints = None
    if directory is not None:
        if not keys:
            return "--checkpoints needs --public-key KEY (the trusted public key)"
        checkpoints, problem = read_checkpoints(directory, keys)
        if problem:
            return problem
    with open(args[0], encoding="utf-8") as export:
        first = export.readline()
        header = json.loads(first) if first.strip() else {}
        if header.get("format") == "dlo-audit-proof/1":
            if not keys:
                return "a proof export needs --public-key KEY"
            if asked:
                try:
                    mismatch = check_binding(header, expect)
                except (KeyError, TypeError, ValueError) as exc:
                    return f"MISMATCH: cannot compare with what was asked ({exc})"
                if mismatch:
                    return mismatch
            return verify_proof(header, export, keys, checkpoints)
        if asked:
            return "--expect, --from-seq, --min-checkpoint and --witness need a proof export"
        lines = [first] if first else []
        return verify(
            _chain(lines, export), links="--hashes-only" not in args[1:],
            checkpoints=checkpoints or (),
        )  # fmt: skip


def _chain(*iterables):
    for iterable in iterables:
        yield from iterable


if __name__ == "__main__":
    summary = main(sys.argv[1:])
    print(summary)
    sys.exit(0 if summary.startswith("OK") else 1)
