from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from channels_registry.models import Channel
from dlq.text import render
from tests.conftest import client_for, make_channel
from tests.dlq.conftest import letter, store
from tests.dlq.hostile import BODIES, HOSTILE_HEADERS

FORBIDDEN = [
    "<script>alert",
    "<img src=x",
    "<img",
    "<div hx-",
    'hx-get="/admin/"',
    'hx-trigger="load"',
    'href="javascript:',
    "\u202e",
    "\x1b",
    "\x00",
]


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(BODIES))
def test_hostile_bodies_render_as_escaped_text(viewer: User, name: str) -> None:
    channel = make_channel(redact_json_paths=[], redact_headers=[])
    [entry] = store(channel, letter(BODIES[name], headers=HOSTILE_HEADERS))
    response = client_for(viewer).get(f"/dead-letters/{entry.pk}/")
    html = response.content.decode()
    assert response.status_code == 200
    for needle in FORBIDDEN:
        assert needle not in html, (name, needle)
    # Exactly the page's own scripts: htmx from static, nothing inline.
    scripts = re.findall(r"<script[^>]*>", html)
    assert all('src="/static/' in s for s in scripts), scripts
    assert html.count("<pre") == html.count("</pre>")
    assert html.rstrip().endswith("</html>")
    if name == "deep_json":
        assert "[[[[" in html  # shown as text, not a crash
    if name in ("invalid_utf8", "nul", "binary_1mib"):
        assert "00000000  " in html  # hex dump
    if name == "binary_1mib":
        assert "Truncated for display" in html
    assert "more headers not shown" in html  # 10,000 headers are capped, visibly


def test_visible_marks_controls_and_direction_overrides() -> None:
    assert render.visible("a\x1b[31mb\u202ec\x00") == "a␛[31mb⟨U+202E⟩c␀"
    assert render.visible("line\nnext\ttab") == "line\nnext\ttab"


def test_hexdump_has_offset_hex_and_ascii_columns() -> None:
    dump = render.hexdump(b"ABCDEFGHIJKLMNOPQ\x00")
    lines = dump.splitlines()
    assert lines[0].startswith("00000000  41 42 43 44 45 46 47 48  49 4a")
    assert lines[0].endswith("|ABCDEFGHIJKLMNOP|")
    assert lines[1].startswith("00000010  51 00") and lines[1].endswith("|Q.|")


def test_deep_json_is_not_parsed() -> None:
    assert not render.is_parsed(render.parse_json(b"[" * 100_000 + b"]" * 100_000))
    # Deep enough to parse but too deep to pretty-print recursively: text, not a crash.
    body = b"[" * 5000 + b"]" * 5000
    channel = Channel(redact_json_paths=[], redact_headers=[])
    shown = render.render_body(body, channel, redact=False)
    assert shown.kind in ("text", "json")
