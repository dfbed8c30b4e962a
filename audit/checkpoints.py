"""Signed checkpoints: the audit log's anchor outside the database.

A checkpoint commits to the whole log at one moment: its tree size (= the head seq), the RFC
9162 Merkle root over every event's leaf, the head's chain hash, the time, and the hash of the
checkpoint before it, signed with an Ed25519 key that is read from a file
(``DLO_AUDIT_SIGNING_KEY``) and never stored in the database. Checkpoints are files in a
directory (``DLO_AUDIT_CHECKPOINT_DIR``, e.g. a mounted volume with object lock), one per
checkpoint, and optionally POSTed to a webhook (``DLO_AUDIT_CHECKPOINT_WEBHOOK``). The format
is specified in ``docs/audit.md`` so that a third party can verify them without our code;
``audit/verify_export.py`` does, with the standard library only.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit import tree
from audit.chain import GENESIS, MerkleFrontier, canonical_json
from audit.history import only_own_record_since, record_checkpoint
from audit.models import AuditHead
from dashboard.egress import EgressRefused, pinned_target, shown_url

FORMAT = "dlo-audit-checkpoint/1"
WEBHOOK_TIMEOUT_S = 5.0


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (no key, sink down): recording carries on."""


# -- keys ------------------------------------------------------------------------------------


def key_id(public: Ed25519PublicKey) -> str:
    """The first 16 hex digits of SHA-256 over the raw 32-byte public key."""
    return hashlib.sha256(raw_public(public)).hexdigest()[:16]


def raw_public(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_text(public: Ed25519PublicKey) -> str:
    """The public key file's one line: ``ed25519 <base64 of the raw 32 bytes>``."""
    return "ed25519 " + base64.b64encode(raw_public(public)).decode("ascii")


def keygen(path: Path) -> Ed25519PublicKey:
    """Write a new private key (PKCS#8 PEM, mode 0600, refusing to overwrite) and its public
    key next to it as ``PATH.pub``."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    Path(f"{path}.pub").write_text(public_text(key.public_key()) + "\n", encoding="ascii")
    return key.public_key()


def load_private_key(path: str) -> Ed25519PrivateKey:
    if not path:
        raise CheckpointError("no signing key: set DLO_AUDIT_SIGNING_KEY to a key file")
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise CheckpointError(f"signing key {path}: {exc.strerror}") from None
    except ValueError:
        raise CheckpointError(f"signing key {path}: not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CheckpointError(f"signing key {path}: not an Ed25519 key")
    return key


def load_public_key(path: str) -> Ed25519PublicKey:
    """A ``.pub`` file (``ed25519 <base64>``), a PEM public key, or a private key file."""
    data = Path(path).read_bytes()
    if data.startswith(b"ed25519 "):
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(data.split()[1]))
    if b"PRIVATE KEY" in data:
        return load_private_key(path).public_key()
    key = serialization.load_pem_public_key(data)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def trusted_keys(extra: list[str] | None = None) -> dict[str, Ed25519PublicKey]:
    """The public keys ``audit verify`` trusts: ``extra`` (``--public-key``) if given, else
    the configured signing key's own and ``DLO_AUDIT_PUBLIC_KEYS`` (older, rotated keys)."""
    paths = list(extra or [])
    if not paths:
        if settings.DLO_AUDIT_SIGNING_KEY and Path(settings.DLO_AUDIT_SIGNING_KEY).exists():
            paths.append(settings.DLO_AUDIT_SIGNING_KEY)
        paths += [p for p in settings.DLO_AUDIT_PUBLIC_KEYS.split(os.pathsep) if p]
    keys = {}
    for path in paths:
        key = load_public_key(path)
        keys[key_id(key)] = key
    return keys


# -- the checkpoint files --------------------------------------------------------------------


@dataclasses.dataclass
class Checkpoint:
    body: dict[str, Any]
    signature: str
    path: Path | None = None
    segment: str = ""  # the day segment it was read from, if any
    conflict: str = ""  # its copies (segment line, file) differ

    @property
    def number(self) -> int:
        return int(self.body["number"])

    @property
    def tree_size(self) -> int:
        return int(self.body["tree_size"])

    def signed_bytes(self) -> bytes:
        return canonical_json(self.body).encode("utf-8")

    def digest(self) -> str:
        return hashlib.sha256(self.signed_bytes()).hexdigest()

    def to_json(self) -> str:
        return json.dumps({"checkpoint": self.body, "signature": self.signature}, indent=1) + "\n"


def filename(number: int) -> str:
    return f"checkpoint-{number:012d}.json"


SEGMENT_PREFIX = "checkpoints-"
SEGMENT_SUFFIX = ".jsonl"


def segment_name(cp: Checkpoint) -> str:
    """The day segment (UTC, from the signed time) a checkpoint's line is appended to."""
    return f"{SEGMENT_PREFIX}{str(cp.body['time'])[:10].replace('-', '')}{SEGMENT_SUFFIX}"


def segment_line(cp: Checkpoint) -> bytes:
    """The checkpoint file's JSON object on one line."""
    obj = {"checkpoint": cp.body, "signature": cp.signature}
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")


def _read_segments(base: str, names: list[str]) -> tuple[dict[int, Checkpoint], dict[int, str]]:
    """Every parseable line of the day segments by number, and the numbers whose lines
    disagree. A line that does not parse (a crash mid-append cuts the last one short) is
    skipped: its number is then read from the file, or missing like a deleted file."""
    found: dict[int, Checkpoint] = {}
    conflicts: dict[int, str] = {}
    for name in names:
        try:
            with open(os.path.join(base, name), "rb") as segment:
                data = segment.read()
        except OSError:
            continue
        for line in data.split(b"\n"):
            try:
                obj = json.loads(line)
                cp = Checkpoint(obj["checkpoint"], obj["signature"], segment=name)
                number = int(cp.body["number"])
            except (ValueError, KeyError, TypeError):
                continue
            seen = found.setdefault(number, cp)
            if seen is not cp and (seen.body, seen.signature) != (cp.body, cp.signature):
                conflicts[number] = (
                    f"checkpoint #{number} differs between {seen.segment} and {name}: "
                    "a copy was altered"
                )
    return found, conflicts


def _read_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, MAX_CHECKPOINT_BYTES)
    finally:
        os.close(fd)


def _parse_file(path: str) -> Checkpoint:
    try:
        data = json.loads(_read_file(path))
        return Checkpoint(data["checkpoint"], data["signature"], Path(path))
    except (OSError, ValueError, KeyError, TypeError):
        return Checkpoint({"number": _number_in(Path(path)), "unreadable": True}, "", Path(path))


def read_dir(directory: str | Path) -> list[Checkpoint]:
    """Every checkpoint in the directory, in number order: the day segments
    (``checkpoints-YYYYMMDD.jsonl``, one line per checkpoint) first, then the
    ``checkpoint-*.json`` files for the numbers no segment holds (written before segments
    existed, or a line a crash cut short). A file whose number a segment holds is not opened:
    both are copies in the same directory, so whoever can alter one can alter the other, and
    what is read is checked the same way (signature, number, link to the one before). Two
    segments disagreeing about one number is a conflict ``verify_chain_of_checkpoints``
    reports. A year of minutely checkpoints is 365 segments, not 525,600 files."""
    base = os.fspath(directory)
    try:
        listed = os.listdir(base)
    except FileNotFoundError:
        return []
    segments = sorted(
        n for n in listed if n.startswith(SEGMENT_PREFIX) and n.endswith(SEGMENT_SUFFIX)
    )
    by_number, conflicts = _read_segments(base, segments)
    extra: list[Checkpoint] = []
    for name in listed:
        if not (name.startswith("checkpoint-") and name.endswith(".json")):
            continue
        digits = name[len("checkpoint-") : -len(".json")]
        if not (digits.isdigit() and int(digits) in by_number):
            extra.append(_parse_file(os.path.join(base, name)))
    # A segment's checkpoint keeps no file path (building 525,600 ``Path`` objects was a third
    # of the read): its number is its body's, and errors name the segment.
    numbered = []
    for number, cp in by_number.items():
        cp.conflict = conflicts.get(number, "")
        numbered.append((number, cp))
    numbered += [(_number_in(cp.path) if cp.path else cp.number, cp) for cp in extra]
    numbered.sort(key=lambda pair: pair[0])
    return [cp for _, cp in numbered]


MAX_CHECKPOINT_BYTES = 65536  # a checkpoint file is ~500 bytes; a larger one is not ours


def read_one(directory: str | Path, number: int) -> Checkpoint | None:
    """Checkpoint ``number``'s file, or ``None`` when there is none."""
    path = Path(directory) / filename(number)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Checkpoint(data["checkpoint"], data["signature"], path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return Checkpoint({"number": number, "unreadable": True}, "", path)


LATEST_PROBES = 1000  # files looked for past the head's number before listing the directory


def latest(directory: str | Path, hint: int) -> Checkpoint | None:
    """The newest checkpoint, in O(1) file reads: from ``hint`` (the number the head row
    records) up while the next file exists. A hint beyond the files (a deleted newest file)
    or far behind them falls back to one listing of the directory (item 8 of issue 23: the
    page, ``/metrics`` and each write no longer read every file)."""
    number = max(hint, 1)
    found = read_one(directory, number)
    if found is None and hint > 0:
        names = sorted(Path(directory).glob("checkpoint-*.json"))
        return read_one(directory, _number_in(names[-1])) if names else None
    for _ in range(LATEST_PROBES):
        following = read_one(directory, number + 1)
        if following is None:
            return found
        found, number = following, number + 1
    names = sorted(Path(directory).glob("checkpoint-*.json"))
    return read_one(directory, _number_in(names[-1])) if names else None


def _number_in(path: Path) -> int:
    digits = path.stem.rsplit("-", 1)[-1]
    return int(digits) if digits.isdigit() else -1


@dataclasses.dataclass
class CheckpointCheck:
    checkpoints: list[Checkpoint]
    problem: str = ""
    bad_number: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problem


def verify_chain_of_checkpoints(
    checkpoints: list[Checkpoint],
    keys: dict[str, Ed25519PublicKey],
    *,
    expected_last: int = 0,
) -> CheckpointCheck:
    """Each checkpoint: readable, named by its number, numbered one after the previous, signed
    by a trusted key, linked to the previous one's hash, and not shrinking the tree. Then none
    missing at the end (``expected_last``: the number the database records as last written)."""
    previous: Checkpoint | None = None
    good: list[Checkpoint] = []

    def bad(number: int, problem: str) -> CheckpointCheck:
        return CheckpointCheck(good, problem, number)

    def signed(cp: Checkpoint) -> bool:
        key = keys.get(str(cp.body.get("key_id")))
        if key is None:
            return False
        try:
            key.verify(base64.b64decode(cp.signature), cp.signed_bytes())
        except (InvalidSignature, ValueError):
            return False
        return True

    for position, cp in enumerate(checkpoints):
        number = int(cp.body.get("number", -1))
        if cp.conflict:
            return bad(number, cp.conflict)
        if cp.body.get("unreadable"):
            return bad(number, f"checkpoint #{number} ({cp.path}) is not a readable checkpoint")
        if cp.path is not None and _number_in(cp.path) != number:
            return bad(
                _number_in(cp.path),
                f"file {cp.path.name} holds checkpoint #{number}: checkpoints were reordered",
            )
        expected = previous.number + 1 if previous else 1
        if number != expected:
            return bad(
                expected,
                f"checkpoint #{expected} is missing (the next one is #{number}): deleted",
            )
        key = keys.get(str(cp.body.get("key_id")))
        if key is None:
            return bad(
                number,
                f"checkpoint #{number} is signed by key {cp.body.get('key_id')}, which is not "
                "a trusted public key (forged, or pass the rotated key with --public-key)",
            )
        # Each checkpoint commits to the one before it (prev_checkpoint), so one valid
        # signature authenticates every earlier body: only the last checkpoint of each key is
        # verified (~0.1 ms each, 50 s for a year of minutely checkpoints otherwise), and a
        # broken link is then traced to the forged one.
        following = checkpoints[position + 1] if position + 1 < len(checkpoints) else None
        last_of_key = following is None or following.body.get("key_id") != cp.body.get("key_id")
        if last_of_key and not signed(cp):
            return bad(number, f"checkpoint #{number}: the signature does not verify (forged)")
        prev_hash = previous.digest() if previous else GENESIS
        if cp.body.get("prev_checkpoint") != prev_hash:
            if previous is not None and not signed(previous):
                good.pop()
                return bad(
                    previous.number,
                    f"checkpoint #{previous.number}: the signature does not verify (forged)",
                )
            return bad(
                number,
                f"checkpoint #{number} does not follow checkpoint #{number - 1} "
                "(prev_checkpoint differs): checkpoints were reordered or replaced",
            )
        if previous and cp.tree_size < previous.tree_size:
            return bad(number, f"checkpoint #{number} has a smaller tree than #{number - 1}")
        good.append(cp)
        previous = cp
    last = previous.number if previous else 0
    if expected_last > last:
        return bad(
            last + 1,
            f"checkpoint #{last + 1} is missing: the database records checkpoints up to "
            f"#{expected_last} written (deleted from the sink)",
        )
    return CheckpointCheck(good)


# -- writing -----------------------------------------------------------------------------------


def checkpoint_dir() -> Path | None:
    return Path(settings.DLO_AUDIT_CHECKPOINT_DIR) if settings.DLO_AUDIT_CHECKPOINT_DIR else None


def write_checkpoint(*, force: bool = False) -> Checkpoint | None:
    """Sign and write a checkpoint of the sealed log now; ``None`` when nothing changed since
    the last one (unless ``force``). Raises ``CheckpointError`` when it cannot (the failure is
    also kept on the head row for the audit page, ``/metrics`` and the alert)."""
    if not force and only_own_record_since(AuditHead.objects.filter(pk=1).first()):
        return None
    try:
        return _write(force)
    except CheckpointError as exc:
        AuditHead.objects.filter(pk=1).update(
            checkpoint_error=str(exc)[:1000], checkpoint_error_at=timezone.now()
        )
        raise


def _write(force: bool) -> Checkpoint | None:
    key = load_private_key(settings.DLO_AUDIT_SIGNING_KEY)
    directory = checkpoint_dir()
    if directory is None:
        raise CheckpointError("no checkpoint sink: set DLO_AUDIT_CHECKPOINT_DIR")
    with transaction.atomic():
        # FOR UPDATE: one writer at a time, and a head consistent with its Merkle frontier.
        head = AuditHead.objects.select_for_update().filter(pk=1).first()
        if head is None or head.seq == 0:
            return None
        if head.seq == head.checkpoint_tree_size and not force:
            return None
        frontier = MerkleFrontier.loads(head.frontier)
        try:
            # The complete subtrees up to this head, for consistency proofs (audit.tree).
            tree.extend(head.seq, frontier.root())
        except tree.TreeError as exc:
            raise CheckpointError(f"not signed: {exc}") from None
        newest = latest(directory, head.checkpoint_number) if directory.exists() else None
        previous = [newest] if newest is not None else []
        prev_hash = previous[0].digest() if previous else GENESIS
        # A checkpoint deleted from the sink leaves a gap the verifier reports, never a reuse.
        number = max(head.checkpoint_number, previous[0].number if previous else 0) + 1
        body = {
            "format": FORMAT,
            "number": number,
            "tree_size": head.seq,
            "root_hash": frontier.root(),
            "head_hash": head.hash,
            "time": timezone.now().astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "prev_checkpoint": prev_hash,
            "key_id": key_id(key.public_key()),
        }
        signature = base64.b64encode(key.sign(canonical_json(body).encode("utf-8")))
        cp = Checkpoint(body, signature.decode("ascii"))
        cp.path = _write_file(directory, cp)
        AuditHead.objects.filter(pk=1).update(
            checkpoint_number=number,
            checkpoint_tree_size=head.seq,
            checkpoint_root=body["root_hash"],
            checkpoint_at=timezone.now(),
            checkpoint_error="",
            checkpoint_error_at=None,
        )
    _post_webhook(cp)
    return cp


def _write_file(directory: Path, cp: Checkpoint, *, sync: bool = True) -> Path:
    """The checkpoint's own file, then its line appended to the day segment (readers open
    one segment a day instead of 1,440 files; the file stays the unit sinks store)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / filename(cp.number)
        temporary = directory / f".{filename(cp.number)}.tmp"
        temporary.write_text(cp.to_json(), encoding="utf-8")
        os.link(temporary, path)  # fails if the checkpoint exists: never overwrite one
        temporary.unlink()
        _append_segment(directory, cp, sync=sync)
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint sink {directory}: {exc.strerror or exc} (recording continues; "
            "checkpoints resume when the sink is back)"
        ) from None
    return path


def _append_segment(directory: Path, cp: Checkpoint, *, sync: bool) -> None:
    """O(1): one append (and fsync). A line left cut short by a crash is ended first so the
    new line stands alone; readers skip the broken one and read that number's file."""
    fd = os.open(directory / segment_name(cp), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        line = segment_line(cp)
        end = os.lseek(fd, 0, os.SEEK_END)
        if end and os.pread(fd, 1, end - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _post_webhook(cp: Checkpoint) -> None:
    """The optional second sink: POST the checkpoint file's JSON. A failure is kept for the
    page; the directory copy was written, so nothing is lost.

    1. The URL passes the alert webhooks' egress guard (public addresses unless allowlisted in
       ``DLO_WEBHOOK_ALLOW``) and the request goes to the checked address.
    2. User info in the URL becomes HTTP basic auth; redirects are never followed, so neither
       it nor the checkpoint goes anywhere else.
    3. The error kept for the page names the URL without user info or query, and classifies the
       failure (refused, timed out, HTTP status), never quoting an answer."""
    url = settings.DLO_AUDIT_CHECKPOINT_WEBHOOK
    if not url:
        return
    error = _webhook_error(url, cp.to_json().encode("utf-8"))
    if error:
        AuditHead.objects.filter(pk=1).update(
            checkpoint_error=f"checkpoint webhook {shown_url(url)}: {error}"[:1000],
            checkpoint_error_at=timezone.now(),
        )


def _webhook_error(url: str, body: bytes) -> str:
    """POST ``body`` to ``url``; "" on a 2xx answer, else what went wrong (no secrets)."""
    try:
        pinned, host = pinned_target(url)
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except EgressRefused as exc:
        return f"refused: {exc}"
    except ValueError:
        return "refused: not a valid URL"
    auth = (unquote(user), unquote(password or "")) if user is not None else None
    try:
        with httpx.Client(
            timeout=WEBHOOK_TIMEOUT_S, follow_redirects=False, trust_env=False, auth=auth
        ) as client:
            response = client.post(
                pinned,
                content=body,
                headers={"Content-Type": "application/json", "Host": host},
                extensions={"sni_hostname": parts.hostname or ""},
            )
    except httpx.TimeoutException:
        return f"no answer within {WEBHOOK_TIMEOUT_S:g} s"
    except httpx.ConnectError:
        return "connection refused or host unreachable"
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return f"request failed ({type(exc).__name__})"
    if response.is_redirect:
        return f"HTTP {response.status_code} redirect, not followed (give the final URL)"
    if response.status_code >= 300:
        return f"HTTP {response.status_code}"
    return ""


def write_recorded_checkpoint(*, force: bool = False) -> Any:
    """Write a checkpoint (``write_checkpoint``) and record it in the log:
    what the periodic job and ``audit checkpoint`` do. (Checkpoints written on other paths,
    after a burst or for a proof export, are covered by the next recorded one: the record is
    a lower bound on the history, never more.)"""
    cp = write_checkpoint(force=force)
    if cp is not None:
        record_checkpoint(cp)
    return cp
