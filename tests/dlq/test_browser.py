"""Hostile dead letters in a real browser: nothing executes, nothing changes the page."""

from __future__ import annotations

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
