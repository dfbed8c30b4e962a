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
