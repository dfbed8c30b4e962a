"""Failure fingerprints: entries that failed the same way share one.

fingerprint = sha256(channel id, reason, normalized error class, normalized error message[,
message type]),
where normalizing strips what differs between occurrences of one failure: UUIDs, hex strings,
quoted values and numbers, then collapses whitespace. ``OrderNotFound: order 4711 missing``
and ``OrderNotFound: order 4712 missing`` fall into one group.
"""

from __future__ import annotations

import functools
import hashlib
import re

_UUID = re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b(?:0x)?[0-9a-fA-F]*\d[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*\b|\b0x[0-9a-fA-F]+\b")
_QUOTED = re.compile(r"'[^'\n]{0,200}'|\"[^\"\n]{0,200}\"|`[^`\n]{0,200}`")
_NUMBER = re.compile(r"[-+]?\d+(?:[.,:]\d+)*")
_SPACE = re.compile(r"\s+")

MAX_INPUT = 2000  # only the head of a long message decides its group


def normalize_error(text: str) -> str:
    """The error text with its variable parts replaced by placeholders."""
    return _normalize(text[:MAX_INPUT])


@functools.lru_cache(maxsize=1024)
def _normalize(text: str) -> str:
    """Cached: a batch repeats its error classes (and often its messages)."""
    text = _UUID.sub("<uuid>", text)
    text = _QUOTED.sub("<str>", text)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()[:500]


def fingerprint(
    channel_id: int,
    reason: str,
    error_class: str,
    error_message: str,
    message_type: str = "",
    *,
    rerouted: str = "",
) -> str:
    """The group of one failure. The message type (job name) is part of it, so one task
    failing does not hide among another's; entries without a type hash as before.
    ``rerouted`` names the source an entry was classified into although found elsewhere (a
    DLQ entry that is poison): such entries form their own groups, so a group is of one
    source; the others hash as before."""
    parts = [str(channel_id), reason.strip().lower(), normalize_error(error_class)]
    parts.append(normalize_error(error_message))
    if message_type:
        parts.append(message_type.strip())
    if rerouted:
        parts.append(f"\x1erouted:{rerouted}")
    return hashlib.sha256("\x1f".join(parts).encode("utf-8", "replace")).hexdigest()
