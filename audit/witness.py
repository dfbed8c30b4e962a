"""A witness of the audit log: Python 3 standard library only, run by compliance on another
host (copy this file and ``verify_export.py`` beside it; docs/audit.md, "Witnessing").

    python3 witness.py --url https://dlo.example --token TOKEN --public-key log.pub
                       --state witness-state.jsonl [--cosign-key witness.pem --name NAME]

Each run (a poll; run it every minute from cron or a systemd timer):

1. fetches the log's newest signed checkpoint (``GET /api/audit/checkpoints/latest/``) and
   checks its Ed25519 signature against the pinned public key (never one the server names);
2. compares it with the last head in the state file (JSON Lines, one head a line, read from
   the end: O(1) per poll however long the file): a smaller tree or number is a **rollback**;
   the same size with another root, or a successor that does not link to it, a **fork**; a
   larger tree must come with an RFC 9162 consistency proof
   (``GET /api/audit/consistency/?first=OLD&second=NEW``) that rebuilds both roots, or the
   history was **rewritten** (or cut and regrown) — even when re-signed with the real key;
3. appends the new head to the state file and, with ``--cosign-key``, posts a C2SP
   tlog-cosignature/v1 of it back (``POST /api/audit/cosignatures/``).

Exit status: 0 consistent; 1 the log is inconsistent with what this witness saw (an alarm:
the message says which and the state file is left unchanged); 2 cannot check (unreachable,
bad arguments, a state file that is not ours).
"""

import argparse
import base64
import datetime as dt
import hashlib
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

try:  # run as a script beside verify_export.py, or imported as audit.witness
    import verify_export as vx
except ImportError:  # pragma: no cover - the package import
    from audit import verify_export as vx

TIMEOUT_S = 10.0
TAIL_BYTES = 65536  # enough for the last line of the state file


class Inconsistent(Exception):
    """The log contradicts a head this witness saw before (exit 1)."""


class CannotCheck(Exception):
    """The check could not be done (exit 2)."""


# -- hashing (RFC 9162) ------------------------------------------------------------------------


def node(left, right):
    return hashlib.sha256(b"\x01" + left + right).digest()


def verify_consistency(first, second, first_root, second_root, proof):
    """RFC 9162 §2.1.4.2."""
    if first > second or first < 0:
        return False
    if first == second:
        return not proof and first_root == second_root
    if first == 0:
        return not proof
    path = list(proof)
    if first & (first - 1) == 0:
        path.insert(0, first_root)
    if not path:
        return False
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node(c, fr), node(c, sr)
            if not fn & 1:
                while True:
                    fn, sn = fn >> 1, sn >> 1
                    if fn & 1 or fn == 0:
                        break
        else:
            sr = node(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_root and sr == second_root and sn == 0


# -- Ed25519 signing for the cosignature (RFC 8032 §5.1.6, the reference arithmetic) -----------


def _encode(point):
    z_inv = pow(point[2], vx.P - 2, vx.P)
    x, y = point[0] * z_inv % vx.P, point[1] * z_inv % vx.P
    return (y | (x & 1) << 255).to_bytes(32, "little")


def read_private_seed(path):
    """The 32-byte seed of a PKCS#8 PEM Ed25519 key (what ``manage.py audit keygen`` writes)."""
    text = Path(path).read_text(encoding="ascii")
    body = "".join(ln for ln in text.splitlines() if ln and not ln.startswith("-----"))
    der = base64.b64decode(body)
    prefix = bytes.fromhex("302e020100300506032b657004220420")
    if len(der) != 48 or der[:16] != prefix:
        raise CannotCheck(f"{path}: not an Ed25519 private key (PKCS#8 PEM)")
    return der[16:]


def ed25519_public(seed):
    digest = hashlib.sha512(seed).digest()
    a = int.from_bytes(digest[:32], "little") & ((1 << 254) - 8) | (1 << 254)
    return _encode(vx._mul(a, vx.BASE))


def ed25519_sign(seed, message):
    digest = hashlib.sha512(seed).digest()
    a = int.from_bytes(digest[:32], "little") & ((1 << 254) - 8) | (1 << 254)
    public = _encode(vx._mul(a, vx.BASE))
    r = int.from_bytes(hashlib.sha512(digest[32:] + message).digest(), "little") % vx.L
    big_r = _encode(vx._mul(r, vx.BASE))
    k = int.from_bytes(hashlib.sha512(big_r + public + message).digest(), "little") % vx.L
    return big_r + ((r + k * a) % vx.L).to_bytes(32, "little")


def checkpoint_note(body):
    """C2SP tlog-checkpoint text of a checkpoint (what a cosignature covers)."""
    root = base64.b64encode(bytes.fromhex(body["root_hash"])).decode("ascii")
    return f"dlo-audit/{body['key_id']}\n{int(body['tree_size'])}\n{root}\n"


# -- the state file ------------------------------------------------------------------------------


def last_head(path):
    """The last line of the state file (read from its end), or None for a new witness."""
    try:
        with open(path, "rb") as state:
            state.seek(0, os.SEEK_END)
            size = state.tell()
            state.seek(max(0, size - TAIL_BYTES))
            lines = [ln for ln in state.read().splitlines() if ln.strip()]
    except FileNotFoundError:
        return None
    if not lines:
        return None
    try:
        head = json.loads(lines[-1])
        head["checkpoint"]["tree_size"], head["checkpoint"]["root_hash"]  # noqa: B018
    except (ValueError, KeyError, TypeError):
        raise CannotCheck(f"{path}: the last line is not a witnessed head") from None
    return head


def append_head(path, checkpoint, signature):
    line = {
        "checkpoint": checkpoint,
        "signature": signature,
        "witnessed_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    with open(path, "a", encoding="utf-8") as state:
        state.write(vx.canonical(line) + "\n")
        state.flush()
        os.fsync(state.fileno())


# -- talking to the log --------------------------------------------------------------------------


class Log:
    """The log's HTTP API (``get`` and ``post`` take a path and return parsed JSON)."""

    def __init__(self, url, token, timeout=TIMEOUT_S):
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def _call(self, path, body=None):
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise CannotCheck(f"{self.url}{path}: HTTP {exc.code} {detail}") from None
        except (OSError, ValueError) as exc:
            raise CannotCheck(f"{self.url}{path}: {exc}") from None

    def get(self, path):
        return self._call(path)

    def post(self, path, body):
        return self._call(path, body)


# -- one poll ------------------------------------------------------------------------------------


def check(log, key, state_path):
    """Steps 1–2 of a poll: the new (checkpoint, signature) once it is shown consistent with
    the last witnessed head; raises ``Inconsistent`` or ``CannotCheck``."""
    key_id, raw_key = key
    latest = log.get("/api/audit/checkpoints/latest/")
    try:
        cp, signature = latest["checkpoint"], latest["signature"]
        number, size = int(cp["number"]), int(cp["tree_size"])
        new_root = bytes.fromhex(cp["root_hash"])
    except (KeyError, TypeError, ValueError):
        raise CannotCheck("the log's answer is not a checkpoint") from None
    if cp.get("key_id") != key_id or not vx.check_signature(cp, signature, {key_id: raw_key}):
        raise Inconsistent(
            f"checkpoint #{number} is not signed by the pinned key {key_id} (signed by "
            f"{cp.get('key_id')}): forged, or the log's key was replaced"
        )
    previous = last_head(state_path)
    if previous is None:
        return cp, signature
    old = previous["checkpoint"]
    old_number, old_size = int(old["number"]), int(old["tree_size"])
    old_root = bytes.fromhex(old["root_hash"])
    if size < old_size or number < old_number:
        raise Inconsistent(
            f"rollback: the log shows checkpoint #{number} of {size} events, but this witness "
            f"saw checkpoint #{old_number} of {old_size} events (the log was cut or rolled back)"
        )
    if number == old_number and vx.canonical(cp) != vx.canonical(old):
        raise Inconsistent(
            f"fork: checkpoint #{number} differs from the checkpoint #{number} this witness "
            "saw (re-signed with other contents)"
        )
    if number == old_number + 1:
        old_digest = hashlib.sha256(vx.canonical(old).encode("utf-8")).hexdigest()
        if cp.get("prev_checkpoint") != old_digest:
            raise Inconsistent(
                f"fork: checkpoint #{number} does not follow the checkpoint #{old_number} this "
                "witness saw (prev_checkpoint differs)"
            )
    if size == old_size:
        if new_root != old_root:
            raise Inconsistent(
                f"fork: the log shows another tree of {size} events than this witness saw "
                f"(root {new_root.hex()[:16]}… instead of {old_root.hex()[:16]}…): rewritten"
            )
        return cp, signature
    query = urllib.parse.urlencode({"first": old_size, "second": size})
    answer = log.get(f"/api/audit/consistency/?{query}")
    try:
        proof = [bytes.fromhex(h) for h in answer["proof"]]
    except (KeyError, TypeError, ValueError):
        raise CannotCheck("the log's consistency answer is not a proof") from None
    if not verify_consistency(old_size, size, old_root, new_root, proof):
        raise Inconsistent(
            f"inconsistent: the tree of {size} events (checkpoint #{number}) does not extend "
            f"the tree of {old_size} events this witness saw (checkpoint #{old_number}): "
            "history was rewritten, or cut and regrown"
        )
    return cp, signature


def cosign(log, cp, seed, name):
    timestamp = int(dt.datetime.now(dt.UTC).timestamp())
    message = f"cosignature/v1\ntime {timestamp}\n{checkpoint_note(cp)}".encode()
    body = {
        "witness": name,
        "public_key": base64.b64encode(ed25519_public(seed)).decode("ascii"),
        "checkpoint_number": int(cp["number"]),
        "tree_size": int(cp["tree_size"]),
        "root_hash": cp["root_hash"],
        "key_id": cp["key_id"],
        "timestamp": timestamp,
        "signature": base64.b64encode(ed25519_sign(seed, message)).decode("ascii"),
    }
    return log.post("/api/audit/cosignatures/", body)


def poll(log, key, state_path, seed=None, name=""):
    """One poll: returns the summary line; raises ``Inconsistent`` or ``CannotCheck``."""
    previous = last_head(state_path)
    cp, signature = check(log, key, state_path)
    if previous is None or vx.canonical(previous["checkpoint"]) != vx.canonical(cp):
        append_head(state_path, cp, signature)
    since = (
        f" (extends #{previous['checkpoint']['number']}, "
        f"{previous['checkpoint']['tree_size']} events)"
        if previous
        else " (first head: trusted on first use)"
    )
    summary = f"OK: checkpoint #{cp['number']}, {cp['tree_size']} events, root {cp['root_hash']}"
    summary += since
    if seed is not None:
        try:
            cosign(log, cp, seed, name)
            summary += "; cosigned"
        except CannotCheck as exc:
            summary += f"; cosignature not posted ({exc})"
    return summary


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="The dashboard's base URL.")
    parser.add_argument(
        "--token",
        default=os.environ.get("DLO_WITNESS_TOKEN", ""),
        help="An API token (audit_witness or compliance); or DLO_WITNESS_TOKEN.",
    )
    parser.add_argument("--public-key", required=True, help="The log's pinned public key.")
    parser.add_argument("--state", required=True, help="This witness's state (JSON Lines).")
    parser.add_argument("--cosign-key", help="This witness's Ed25519 key: post a cosignature.")
    parser.add_argument("--name", default=socket.gethostname(), help="This witness's name.")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S)
    args = parser.parse_args(argv)
    try:
        key = vx.read_public_key(args.public_key)
        seed = read_private_seed(args.cosign_key) if args.cosign_key else None
        log = Log(args.url, args.token, args.timeout)
        print(poll(log, key, args.state, seed, args.name[:100]))
    except Inconsistent as exc:
        print(f"INCONSISTENT: {exc}", file=sys.stderr)
        return 1
    except (CannotCheck, OSError, ValueError) as exc:
        print(f"CANNOT CHECK: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
