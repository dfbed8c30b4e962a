"""Issue #27 item 4: "visible" is the default. Every template variable the project's engine
prints, and every value the Python-built lists interpolate, shows invisible, control and
direction-changing characters as markers, without a filter anyone must remember; the set covers
every format (Cf) character, the controls and the blank-looking fillers."""

from __future__ import annotations

import sys
import unicodedata

import pytest
from django.contrib.auth.models import User
from django.template import Context, Engine, engines
from django.utils.safestring import mark_safe

from audit.actions import Actor, record
from dashboard.html import escape
from dashboard.text import is_marked, visible
from tests.conftest import client_for, make_broker, make_channel
from tests.dlq.conftest import letter, store

#: The characters issue #27 named, one of each kind the set covers, and the old ones.
NAMED = [
    "\u2060", "\u00ad", "\u180e", "\u206a", "\u206f", "\u034f", "\u3164", "\U000e0041",
    "\U000e0001", "\U000e007f", "\u200b", "\u200d", "\u202e", "\u2066", "\u061c", "\ufeff",
    "\u2028", "\x00", "\x1b", "\x7f", "\x85", "\x9b", "\u115f", "\uffa0", "\ufe00",
    "\U000e0100", "\u2800", "\u17b4",
]  # fmt: skip
HOSTILE = "".join(NAMED)
#: What a text column can hold (PostgreSQL refuses NUL): BEL in its place.
STORED = HOSTILE.replace("\x00", "\x07")


def test_every_format_character_is_marked() -> None:
    missing = [
        f"U+{code:04X}"
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) == "Cf" and not is_marked(code)
    ]
    assert missing == []


@pytest.mark.parametrize("char", NAMED)
def test_each_named_character_becomes_a_printable_marker(char: str) -> None:
    shown = visible(f"a{char}b")
    assert char not in shown and shown.startswith("a") and shown.endswith("b")
    assert all(c.isprintable() for c in shown)


def test_text_tab_newline_emoji_and_accents_stay_as_they_are() -> None:
    text = "Zürich\tok\nläuft ❤️ 👍🏽 עברית 中文 e\u0301 \U00020000"
    assert visible(text) == text
    plain = "Zürich\tläuft\n"
    assert visible(plain) is plain  # nothing to replace: not even a copy


def test_markers_are_stable() -> None:
    assert visible("a\x1b[31mb\u202ec\x00\x85\U000e0041") == "a␛[31mb⟨U+202E⟩c␀\\x85⟨U+E0041⟩"
    assert visible(visible(HOSTILE)) == visible(HOSTILE)


def test_the_engine_marks_every_variable_without_a_filter() -> None:
    template = engines["django"].from_string("<p title='{{ v }}'>{{ v }}</p>{{ safe }}")
    html = template.render({"v": f"x{HOSTILE}<", "safe": mark_safe("<b>\u200b</b>")})
    for char in NAMED:
        assert html.count(char) == (1 if char == "\u200b" else 0), repr(char)
    assert html.count(f"{visible(HOSTILE)}&lt;") == 2  # marked, then escaped, text and attribute
    assert html.endswith("<b>\u200b</b>")  # HTML the code built and marked safe is kept
    # Engine.get_default() (what ``Template(...)`` users get) is the same engine.
    default = Engine.get_default().from_string("{{ v }}")
    assert default.render(Context({"v": "\u202e"})) == "⟨U+202E⟩"


def test_the_python_built_lists_escape_visibly() -> None:
    assert escape(f"<{HOSTILE}>") == f"&lt;{visible(HOSTILE)}&gt;"
    assert not any(char in escape(HOSTILE) for char in NAMED)


@pytest.mark.django_db
def test_pages_named_in_the_issue_show_markers(viewer: User) -> None:
    """The failure-group header, the entry's history table, channel names and descriptions
    on the board, the channel list and the channel page."""
    broker = make_broker(name=f"b{STORED}")
    channel = make_channel(broker, name=f"Orders{STORED}", description=f"About{STORED}")
    [entry] = store(channel, letter(b"{}", reason=f"rej{STORED}"[:100]))
    record(
        "dlq.note",
        actor=Actor(None, f"eve{STORED}", "10.0.0.9"),
        target=entry,
        reason=f"because{STORED}",
    )
    client = client_for(viewer)
    pages = [
        "/",
        "/?all=1",
        "/channels/",
        f"/channels/{channel.slug}/",
        f"/dead-letters/list/?group={entry.group_id}",
        f"/dead-letters/{entry.pk}/",
        "/dead-letters/",
    ]
    for url in pages:
        for htmx in ({}, {"HTTP_HX_REQUEST": "true"}):  # the page, and its partial for htmx
            response = client.get(url, **htmx)
            assert response.status_code == 200, url
            html = response.content.decode()
            raw = [f"U+{ord(c):04X}" for c in STORED if c in html and c != "\n"]
            assert raw == [], (url, htmx)
    partial = client.get(f"/dead-letters/list/?group={entry.group_id}", HTTP_HX_REQUEST="true")
    assert "<html" not in partial.content.decode() and "rej⟨U+2060⟩" in partial.content.decode()
    detail = client.get(f"/dead-letters/{entry.pk}/").content.decode()
    assert "eve⟨U+2060⟩" in detail and "because⟨U+2060⟩" in detail
    listing = client.get(f"/dead-letters/list/?group={entry.group_id}").content.decode()
    assert "rej⟨U+2060⟩" in listing
    channel_page = client.get(f"/channels/{channel.slug}/").content.decode()
    assert "Orders⟨U+2060⟩" in channel_page and "About⟨U+2060⟩" in channel_page


@pytest.mark.django_db
def test_admin_change_lists_mark_channel_and_broker_names(registry_admin: User) -> None:
    broker = make_broker(name=f"b{STORED}")
    make_channel(broker, name=f"Orders{STORED}")
    client = client_for(registry_admin)
    for url in ("/admin/channels_registry/channel/", "/admin/channels_registry/broker/"):
        html = client.get(url).content.decode()
        assert [f"U+{ord(c):04X}" for c in STORED if c in html and c != "\n"] == [], url
        assert "⟨U+2060⟩" in html, url


@pytest.mark.django_db
def test_form_fields_keep_the_value_as_stored(registry_admin: User) -> None:
    """What an admin edits is the stored value: saving the form must not write markers back
    (widgets render through the form renderer's engine, not the project's)."""
    channel = make_channel(name="Orders\u200bX", description="About\u202eY")
    url = f"/admin/channels_registry/channel/{channel.pk}/change/"
    html = client_for(registry_admin).get(url).content.decode()
    assert 'value="Orders\u200bX"' in html and "About\u202eY</textarea>" in html
    assert "Orders⟨U+200B⟩X" in html  # the page's title and breadcrumbs mark it
