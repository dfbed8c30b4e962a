"""Safe rendering of hostile message bodies and headers as plain text.

Everything here returns *text* that templates then autoescape; nothing is marked safe. On top
of escaping, characters that could mislead the reader are made visible (``dashboard.text``): C0/C1
controls (ANSI escapes, NUL), bidirectional overrides (U+202E) and invisible characters become
printable markers, so a body cannot reorder or hide what the page shows. JSON is parsed with a
recursion guard: 100,000-deep nesting shows as text, never as a crash.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from channels_registry.models import Channel
from dashboard.text import visible
from dlq.text import redaction

DISPLAY_LIMIT = 64 * 1024  # characters of text / JSON shown inline
HEX_LIMIT = 16 * 1024  # bytes shown as a hex dump inline
PARSE_LIMIT = 4 * 1024 * 1024  # larger bodies are never parsed as JSON
HEADER_ROWS = 500  # header rows shown; the page says how many more there are
HEADER_VALUE_LIMIT = 2000
TIMELINE_ROWS = 100

_NOT_PARSED = object()


def parse_json(body: bytes) -> Any:
    """The parsed document, or ``_NOT_PARSED`` (not JSON, too big, or nested too deep)."""
    if len(body) > PARSE_LIMIT or not body.strip():
        return _NOT_PARSED
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return _NOT_PARSED


def is_parsed(document: Any) -> bool:
    return document is not _NOT_PARSED


def looks_binary(text: str) -> bool:
    """NUL bytes, or more than 10% control characters other than whitespace and ESC."""
    if "\x00" in text:
        return True
    sample = text[:4096]
    controls = sum(1 for ch in sample if ord(ch) < 0x20 and ch not in "\t\n\r\x1b")
    return controls > len(sample) // 10


def hexdump(data: bytes) -> str:
    """Classic dump: offset, 16 bytes in hex, and the printable ASCII ones."""
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hex_part = " ".join(f"{b:02x}" for b in chunk[:8])
        if len(chunk) > 8:
            hex_part += "  " + " ".join(f"{b:02x}" for b in chunk[8:])
        ascii_part = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in chunk)
        lines.append(f"{offset:08x}  {hex_part:<49}  |{ascii_part}|")
    return "\n".join(lines)


@dataclasses.dataclass
class RenderedBody:
    kind: str  # "json" | "text" | "hex" | "hidden" | "purged" | "empty"
    text: str = ""
    truncated: bool = False
    note: str = ""


def _pretty(document: Any) -> str | None:
    try:
        return json.dumps(document, indent=2, ensure_ascii=False, sort_keys=False)
    except (RecursionError, ValueError):
        return None


def render_body(body: bytes | None, channel: Channel, *, redact: bool) -> RenderedBody:
    """How the detail page shows a body. ``redact``: apply the channel's rules (the viewer
    lacks the reveal permission)."""
    if body is None:
        return RenderedBody("purged", note="The payload was purged by the retention policy.")
    if not body:
        return RenderedBody("empty", note="The body is empty.")
    document = parse_json(body)
    if is_parsed(document) and not isinstance(document, str | int | float | bool | type(None)):
        if redact:
            document = redaction.redact_document(document, channel)
        pretty = _pretty(document)
        if pretty is not None:
            return _limited("json", visible(pretty))
    if redact and channel.redact_json_paths:
        return RenderedBody(
            "hidden",
            note="This channel redacts body fields, and this body is not JSON the rules can be "
            "applied to, so it is hidden. Someone with the reveal permission can show it.",
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not looks_binary(text):
        return _limited("text", visible(text))
    return RenderedBody(
        "hex",
        hexdump(body[:HEX_LIMIT]),
        truncated=len(body) > HEX_LIMIT,
        note="Not UTF-8 text: shown as a hex dump.",
    )


def _limited(kind: str, text: str) -> RenderedBody:
    if len(text) > DISPLAY_LIMIT:
        return RenderedBody(kind, text[:DISPLAY_LIMIT], truncated=True)
    return RenderedBody(kind, text)


def redacted_body_bytes(body: bytes | None, channel: Channel) -> bytes | None:
    """The body as a viewer without reveal permission may receive it (API, download): the raw
    bytes when the channel has no body rules, a re-serialized redacted document when it does,
    and ``None`` when the rules cannot be applied."""
    if body is None or not channel.redact_json_paths:
        return body
    document = parse_json(body)
    if not is_parsed(document):
        return None
    try:
        return json.dumps(redaction.redact_document(document, channel)).encode()
    except (RecursionError, ValueError):
        return None


def header_value_text(value: Any) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (RecursionError, ValueError, TypeError):
            text = repr(value)
    if len(text) > HEADER_VALUE_LIMIT:
        text = text[:HEADER_VALUE_LIMIT] + f"… ({len(text) - HEADER_VALUE_LIMIT} more characters)"
    return visible(text)


def header_rows(
    headers: dict[str, Any], *, limit: int = HEADER_ROWS
) -> tuple[list[tuple[str, str]], int]:
    """(name, value) rows for the table, and how many were left out. ``x-death`` is shown as
    the timeline instead."""
    items = [(k, v) for k, v in headers.items() if k != "x-death"]
    rows = [(visible(str(k))[:300], header_value_text(v)) for k, v in items[:limit]]
    return rows, max(0, len(items) - limit)


#: AMQP properties holding times (epoch seconds): shown as UTC times, the epoch kept after.
TIME_PROPERTIES = ("timestamp",)
#: Stored for replay only (the original Redis fields are the body already).
HIDDEN_PROPERTIES = ("redis_fields",)


def property_rows(properties: dict[str, Any], *, limit: int = 50) -> list[tuple[str, str]]:
    """(name, value) rows for the properties table; AMQP timestamps as times."""
    rows = []
    for key, value in properties.items():
        if key in HIDDEN_PROPERTIES:
            continue
        when = _epoch(value) if key in TIME_PROPERTIES else None
        if when is not None:
            rows.append((key, f"{when:%Y-%m-%d %H:%M:%S} UTC ({value})"))
        else:
            rows.append((key, header_value_text(value)))
    return rows[:limit]


@dataclasses.dataclass
class Death:
    time: dt.datetime | None
    reason: str
    queue: str
    exchange: str
    count: str
    routing_keys: str


def _epoch(value: Any) -> dt.datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return dt.datetime.fromtimestamp(float(value), tz=dt.UTC)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def timeline(death_history: list[Any]) -> list[Death]:
    """The ``x-death`` records, oldest first (RabbitMQ lists the most recent first)."""
    deaths = []
    for record in reversed(death_history[:TIMELINE_ROWS]):
        if not isinstance(record, dict):
            continue
        keys = record.get("routing-keys")
        deaths.append(
            Death(
                time=_epoch(record.get("time")),
                reason=header_value_text(record.get("reason", "")),
                queue=header_value_text(record.get("queue", "")),
                exchange=header_value_text(record.get("exchange", "")),
                count=header_value_text(record.get("count", "")),
                routing_keys=header_value_text(keys) if keys else "",
            )
        )
    return deaths
