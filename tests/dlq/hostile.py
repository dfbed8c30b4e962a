"""Hostile bodies and headers shared by the HTML and the browser tests."""

from __future__ import annotations

import json
import os

SCRIPT = b"<script>alert(1)</script>"
HOSTILE_TEXT = (
    "<script>alert(1)</script> <img src=x onerror=alert(1)> </pre><script>alert(2)</script>"
    ' <div hx-get="/admin/" hx-trigger="load">htmx</div> <a href="javascript:alert(1)">x</a>'
    " \u202eevil\u202c \x1b[31mred\x1b[0m"
)

BODIES: dict[str, bytes] = {
    "script": SCRIPT,
    "text": HOSTILE_TEXT.encode(),
    "json": json.dumps(
        {"html": HOSTILE_TEXT, "</pre><script>alert(3)</script>": "k"}, ensure_ascii=False
    ).encode(),
    "invalid_utf8": b"\xff\xfe<script>alert(1)</script>\xc3\x28",
    "nul": b"abc\x00<script>alert(1)</script>\x00",
    "binary_1mib": os.urandom(1024 * 1024),
    "deep_json": b"[" * 100_000 + b"]" * 100_000,
    "rtl_ansi": "file\u202egpj.exe \x1b[2J\x1b[31mALERT\x1b[0m".encode(),
}

HOSTILE_HEADERS = {
    "<script>alert(1)</script>": "<img src=x onerror=alert(1)>",
    "x-htmx": '<div hx-get="/admin/" hx-trigger="load">',
    "x-link": "javascript:alert(1)",
    "x-rtl": "\u202eevil",
    **{f"x-h{i}": f"<b>v{i}</b>" for i in range(10_000)},
}

#: Invisible, format, filler and control characters (issue #27): each must reach a page only as
#: a printable marker. No NUL: PostgreSQL text columns refuse it (bodies carry it above).
INVISIBLE = (
    "\u2060\u00ad\u180e\u206a\u206f\u034f\u3164\U000e0041\U000e0042\U000e007f\u200b\u200d"
    "\u202e\u2066\u2069\u061c\ufeff\u2028\x07\x1b\x7f\x85\x9b\u115f\uffa0\ufe00\U000e0100"
    "\u2800\u17b4\u0600\U0001d173"
)
#: Text for names, reasons and headers: markup that must stay text, plus every character above.
HOSTILE_NAME = f"<b>x</b><img src=x onerror=alert(1)>{INVISIBLE}"
