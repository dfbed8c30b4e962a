"""Hostile dead letters in a real browser: nothing executes, nothing changes the page."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from tests.conftest import make_channel, make_user
from tests.dlq.conftest import letter, store
from tests.dlq.hostile import BODIES, HOSTILE_HEADERS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM = "/usr/bin/chromium"


def test_hostile_entries_do_not_execute_or_break_the_page(live_server: Any) -> None:
    viewer = make_user("vera", "viewer")
    channel = make_channel(redact_json_paths=[], redact_headers=[])
    names = ["script", "text", "json", "invalid_utf8", "nul", "deep_json", "rtl_ansi"]
    entries = {n: store(channel, letter(BODIES[n], headers=HOSTILE_HEADERS))[0].pk for n in names}
    client = Client()
    client.force_login(viewer)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    # Django's ORM must not run once Playwright's event loop is up in this thread.
    _drive_browser(live_server.url, session, entries)


def _drive_browser(base: str, session: str, entries: dict[str, int]) -> None:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"]
        )
        context = browser.new_context()
        host = base.split("//", 1)[1].split(":")[0]
        context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": session, "domain": host, "path": "/"}]
        )
        page = context.new_page()
        dialogs: list[str] = []
        requests: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("request", lambda r: requests.append(r.url))
        try:
            for name, pk in entries.items():
                page.goto(f"{base}/dead-letters/{pk}/", wait_until="load")
                page.wait_for_timeout(300)  # let htmx process the DOM
                assert page.locator("header.topbar nav").count() == 1, name
                assert page.locator("main h2", has_text="Audit history").count() == 1, name
                assert page.locator("main section.card").count() == 6, name  # + replays / lineage
                # Only the page's own scripts (htmx, theme, ui), each from /static/, none inline:
                # a hostile body or header adds no script of its own.
                sources = page.locator("script").evaluate_all(
                    "els => els.map(e => [e.getAttribute('src') || '', e.textContent])"
                )
                assert len(sources) == 3, (name, sources)
                assert all(src.startswith("/static/") and not text for src, text in sources), name
                injected = "main img, main [hx-get], main a[href^='javascript']"
                assert page.locator(injected).count() == 0, name
                body_text = page.locator("pre.dlq-body").inner_text()
                if name == "script":
                    assert body_text == "<script>alert(1)</script>"
                if name == "text":
                    assert 'hx-get="/admin/"' in body_text and "⟨U+202E⟩" in body_text
                if name == "deep_json":
                    assert body_text.startswith("[[[[")
                if name == "script":
                    page.screenshot(path="/tmp/h4-dead-letter-detail.png", full_page=False)
            page.goto(f"{base}/dead-letters/list/", wait_until="load")
            page.wait_for_timeout(300)
            assert page.locator("table.dlq-entries tbody tr").count() == len(entries)
        finally:
            context.close()
            browser.close()
    assert dialogs == []
    assert not [u for u in requests if "/admin/" in u], requests


def test_invisible_and_bidi_characters_never_reach_a_page_raw(live_server: Any) -> None:
    """Issue #27 item 4: the hostile corpus with the invisible, format, filler and control
    characters in channel names and descriptions, broker names, reasons, error classes, header
    names and values, bodies and audit history, swept in Chromium over the viewer's pages and
    the registry admin's Django admin pages: no raw character in what the page shows, no
    script, no dialog."""
    from audit.actions import Actor, record
    from dlq.models import FailureGroup
    from tests.conftest import make_broker
    from tests.dlq.hostile import HOSTILE_NAME, INVISIBLE

    viewer = make_user("vic", "viewer")
    admin_user = make_user("reggie", "registry_admin", staff=True)
    broker = make_broker(name=f"broker {HOSTILE_NAME}")
    channel = make_channel(
        broker,
        name=f"Orders {HOSTILE_NAME}",
        description=f"About {HOSTILE_NAME}",
        redact_headers=["authorization"],
        redact_json_paths=[],
    )
    headers = {f"x-{INVISIBLE}": HOSTILE_NAME, "x-rtl": "\u202eevil", "authorization": "t0k"}
    entries = [
        store(channel, letter(body, headers=headers, reason=f"r{INVISIBLE}"[:100]))[0]
        for body in (
            f"text {HOSTILE_NAME}".encode(),
            json.dumps({f"k{INVISIBLE}": INVISIBLE}, ensure_ascii=False).encode(),
            BODIES["rtl_ansi"],
        )
    ]
    for entry in entries:
        record(
            "dlq.note",
            actor=Actor(None, f"eve{INVISIBLE}", "10.0.0.9"),
            target=entry,
            reason=f"because {HOSTILE_NAME}",
        )
    group = FailureGroup.objects.filter(channel=channel).first()
    assert group is not None
    viewer_pages = [
        "/",
        "/?all=1",
        "/channels/",
        f"/channels/{channel.slug}/",
        "/dead-letters/",
        f"/dead-letters/list/?group={group.pk}",
        *(f"/dead-letters/{e.pk}/" for e in entries),
    ]
    admin_pages = [
        "/admin/dlq/deadletter/",
        *(f"/admin/dlq/deadletter/{e.pk}/change/" for e in entries),
        "/admin/dlq/failuregroup/",
        f"/admin/dlq/failuregroup/{group.pk}/change/",
        "/admin/channels_registry/channel/",
        "/admin/channels_registry/broker/",
    ]
    sessions = {}
    for user in (viewer, admin_user):
        client = Client()
        client.force_login(user)
        sessions[user.username] = client.cookies[settings.SESSION_COOKIE_NAME].value
    _sweep(
        live_server.url,
        [(sessions["vic"], viewer_pages), (sessions["reggie"], admin_pages)],
    )


def _sweep(base: str, visits: list[tuple[str, list[str]]]) -> None:
    from playwright.sync_api import sync_playwright

    from dashboard.text import is_marked

    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed")
    dialogs: list[str] = []
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"]
        )
        host = base.split("//", 1)[1].split(":")[0]
        try:
            for session, pages in visits:
                context = browser.new_context()
                context.add_cookies(
                    [
                        {
                            "name": settings.SESSION_COOKIE_NAME,
                            "value": session,
                            "domain": host,
                            "path": "/",
                        }
                    ]
                )
                page = context.new_page()
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
                for path in pages:
                    response = page.goto(f"{base}{path}", wait_until="load")
                    assert response is not None and response.status == 200, path
                    page.wait_for_timeout(200)  # let htmx process the DOM
                    # What the reader sees: the rendered text and the attributes a browser
                    # shows or reads out.
                    shown = page.evaluate(
                        """() => [document.title, document.body.innerText,
                            ...[...document.querySelectorAll('[title],[aria-label],[alt]')]
                              .map(e => [e.title, e.getAttribute('aria-label'),
                                         e.getAttribute('alt')].join(' '))].join('\\n')"""
                    )
                    raw = sorted(f"U+{ord(c):04X}" for c in set(shown) if is_marked(ord(c)))
                    if raw:
                        problems.append(f"{path}: {raw}")
                    if "⟨U+2060⟩" not in shown:
                        problems.append(f"{path}: no marker shown")
                    inline = page.locator("script").evaluate_all(
                        "els => els.filter(e => (e.textContent || '').includes('alert(')).length"
                    )
                    if inline or page.locator("img[src='x'], [onerror]").count():
                        problems.append(f"{path}: injected markup")
                context.close()
        finally:
            browser.close()
    assert dialogs == []
    assert problems == []
