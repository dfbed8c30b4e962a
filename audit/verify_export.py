"""Verify an audit export (JSON Lines) offline: Python 3 standard library only, no Django.

    python3 verify_export.py export.jsonl [--hashes-only]

Recomputes each event's SHA-256 exactly as audit/chain.py does and, unless --hashes-only
(for a filtered export, which has gaps), checks that each event links to the one before it.
Exit status 0 when the file verifies, 1 naming the first bad event.
"""

import hashlib
import json
import sys

FIELDS = ("seq", "created_at", "actor_id", "actor_username", "source_ip", "action",
          "target_type", "target_id", "target_repr", "channel_slug", "reason", "before",
          "after", "changes", "outcome", "prev_hash")  # fmt: skip


def event_hash(event):
    payload = {name: event.get(name) for name in FIELDS}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def verify(lines, links=True):
    prev, count = None, 0
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
        if event_hash(event) != event["hash"]:
            return f"BROKEN at #{seq}: the hash does not match the contents (modified)"
        prev, count = event, count + 1
    last = f"#{prev['seq']} {prev['hash']}" if prev else "none"
    return f"OK: {count} events; last {last}"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as export:
        summary = verify(export, links="--hashes-only" not in sys.argv[2:])
    print(summary)
    sys.exit(0 if summary.startswith("OK") else 1)
