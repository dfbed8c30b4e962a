"""Events written by the application: each row carries a MAC made with a key the database does
not hold (``DLO_AUDIT_MAC_KEY``, a file), so a database superuser alone cannot add an event
that the sealer accepts or ``audit verify`` believes.

``mac = nonce || HMAC-SHA256(key, "dlo-audit-mac/1" 0x00 || nonce || SHA-256(index_json) ||
SHA-256(detail_json))`` in hex (16 random bytes of nonce, then the 32-byte tag: 96 hex
digits). The nonce makes every event's MAC distinct, so a copy of a genuine row (a replay of
it) is refused by the unique index on ``mac`` and reported by ``audit verify``.

The key file holds 32 random bytes as 64 hex digits. In development a missing key file is
created on first use (like ``.secret_key``); in production it must exist (``firstrun`` creates
it, ``docker-compose.yml`` mounts it).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from django.conf import settings

PREFIX = b"dlo-audit-mac/1\x00"
NONCE_BYTES = 16
MAC_HEX = 2 * (NONCE_BYTES + 32)

_cache: dict[str, bytes] = {}


class MacKeyError(RuntimeError):
    """The MAC key is not configured or cannot be read."""


def keygen(path: Path) -> None:
    """Write a new MAC key (mode 0600, refusing to overwrite one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(secrets.token_hex(32) + "\n")


def load_key(path: str | None = None) -> bytes:
    """The configured key (cached per path). A missing file is created outside production."""
    path = path if path is not None else settings.DLO_AUDIT_MAC_KEY
    if not path:
        raise MacKeyError("no audit MAC key: set DLO_AUDIT_MAC_KEY to a key file")
    cached = _cache.get(path)
    if cached is not None:
        return cached
    if not settings.PRODUCTION and not Path(path).exists():
        with contextlib.suppress(FileExistsError):  # another process created it first
            keygen(Path(path))
    try:
        text = Path(path).read_text(encoding="ascii").strip()
        key = bytes.fromhex(text)
    except OSError as exc:
        raise MacKeyError(f"audit MAC key {path}: {exc.strerror}") from None
    except ValueError:
        raise MacKeyError(f"audit MAC key {path}: not 64 hex digits") from None
    if len(key) < 32:
        raise MacKeyError(f"audit MAC key {path}: shorter than 32 bytes")
    _cache[path] = key
    return key


def _tag(key: bytes, nonce: bytes, index_json: bytes, detail_json: bytes) -> bytes:
    message = (
        PREFIX + nonce + hashlib.sha256(index_json).digest() + hashlib.sha256(detail_json).digest()
    )
    return hmac.new(key, message, hashlib.sha256).digest()


def event_mac(index_json: str, detail_json: str, key: bytes | None = None) -> str:
    """A fresh MAC for an event's two canonical texts."""
    key = key if key is not None else load_key()
    nonce = secrets.token_bytes(NONCE_BYTES)
    return (nonce + _tag(key, nonce, index_json.encode("utf-8"), detail_json.encode("utf-8"))).hex()


def mac_ok(mac: str | None, index_json: bytes, detail_json: bytes, key: bytes) -> bool:
    """Whether ``mac`` is a valid MAC of these texts (as stored, UTF-8 bytes)."""
    return MacChecker(key)(mac, index_json, detail_json)


class MacChecker:
    """``mac_ok`` for many rows with one key: the keyed HMAC state is built once and copied
    per row (the verifier's walk checks a million)."""

    def __init__(self, key: bytes) -> None:
        self._keyed = hmac.new(key, PREFIX, hashlib.sha256)

    def __call__(self, mac: str | None, index_json: bytes, detail_json: bytes) -> bool:
        if not mac or len(mac) != MAC_HEX:
            return False
        try:
            raw = bytes.fromhex(mac)
        except ValueError:
            return False
        state = self._keyed.copy()
        state.update(
            raw[:NONCE_BYTES]
            + hashlib.sha256(index_json).digest()
            + hashlib.sha256(detail_json).digest()
        )
        return hmac.compare_digest(raw[NONCE_BYTES:], state.digest())
