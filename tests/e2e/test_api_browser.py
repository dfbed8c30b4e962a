"""The API in a real browser: the Swagger docs page renders under the strict CSP, and a
same-site page on another port cannot use the session to create a plan (issue 12, item 3)."""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dlq.models import ReplayPlan
from tests.conftest import PASSWORD, make_channel
from tests.dlq.conftest import letter, store
from tests.e2e.conftest import browser_user, off_loop

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_api_docs_render_with_no_csp_violation(journey: Any) -> None:
    off_loop(browser_user, "vera", "viewer")
    tab = journey("api-docs")
    tab.sign_in("vera", PASSWORD)
    response = tab.go("/api/docs/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    # Swagger UI fetched the schema (with the session) and drew every operation.
    tab.page.wait_for_selector(".opblock-summary-path", timeout=20_000)
    paths = {el.inner_text().strip() for el in tab.page.query_selector_all(".opblock-summary-path")}
    assert {"/api/dead-letters/", "/api/replay-plans/", "/api/audit-events/"} <= paths
    tab.shot("docs")
    tab.check_clean()  # a CSP violation is a console error


def _attacker_page(target: str) -> bytes:
    # text/plain sends "name=value": the name carries a JSON object, the value closes it.
    name = json.dumps({"kind": "discard", "channel": "orders", "reason": "csrf", "pad": ""})[:-2]
    return (
        "<!doctype html><title>cute cats</title>"
        f'<form method="post" enctype="text/plain" action="{html.escape(target)}">'
        f'<input type="hidden" name="{html.escape(name)}" value="&quot;}}"></form>'
        "<script>document.forms[0].submit()</script>"
    ).encode()


@pytest.fixture
def attacker_site(asgi_server: str) -> Iterator[str]:
    """Another port on the same host: same-site, so the browser sends the SameSite=Lax
    session cookie along with a top-level form POST."""
    page = _attacker_page(f"{asgi_server}/api/replay-plans/")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _setup() -> None:
    browser_user("otto", "oncall")
    store(make_channel(), letter(), letter())


def test_a_same_site_page_cannot_create_a_plan_with_the_session(
    journey: Any, attacker_site: str
) -> None:
    off_loop(_setup)
    tab = journey("api-csrf")
    tab.sign_in("otto", PASSWORD)
    with tab.page.expect_response(lambda r: "/api/replay-plans/" in r.url) as info:
        tab.page.goto(attacker_site)
    response = info.value
    assert response.request.method == "POST"
    assert "sessionid=" in (response.request.header_value("cookie") or "")
    assert response.status == 403, response.text()
    assert "CSRF" in response.json()["error"]
    assert off_loop(ReplayPlan.objects.count) == 0
