"""Issue #27 item 6: the checkpoint webhook passes the alert webhooks' egress guard, follows no
redirect, and its URL's secrets (user info, query) never reach the audit page."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from audit.checkpoints import write_checkpoint
from audit.models import AuditHead
from tests.audit.test_anchoring import signing, write_events  # noqa: F401 - the fixture
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

PASSWORD = "hunter2-cp-secret"
TOKEN = "q-token-7d1c"


class _Hook(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]]
    redirect_to: str = ""

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.seen.append({k.lower(): v for k, v in self.headers.items()} | {"path": self.path})
        if self.redirect_to:
            self.send_response(307)
            self.send_header("Location", self.redirect_to)
        else:
            self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _listen(host: str, redirect_to: str = "") -> Iterator[tuple[int, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Hook,), {"seen": seen, "redirect_to": redirect_to})
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def elsewhere() -> Iterator[tuple[int, list[dict[str, str]]]]:
    """Another host's listener (127.0.0.2) a redirect points at."""
    yield from _listen("127.0.0.2")


def _hook_url(port: int) -> str:
    return f"http://cp-user:{PASSWORD}@127.0.0.1:{port}/sink?token={TOKEN}"


def test_a_redirect_is_not_followed_and_the_page_shows_no_secret(
    signing: Path,  # noqa: F811
    settings: Any,
    compliance: User,
    elsewhere: tuple[int, list[dict[str, str]]],
) -> None:
    other_port, other_seen = elsewhere
    settings.DLO_WEBHOOK_ALLOW = ["127.0.0.0/8"]
    for port, seen in _listen("127.0.0.1", redirect_to=f"http://127.0.0.2:{other_port}/x"):
        settings.DLO_AUDIT_CHECKPOINT_WEBHOOK = _hook_url(port)
        write_events(2)
        assert write_checkpoint() is not None
        assert len(seen) == 1 and seen[0]["authorization"].startswith("Basic ")
        assert seen[0]["path"] == f"/sink?token={TOKEN}"
    assert other_seen == []
    error = AuditHead.objects.get(pk=1).checkpoint_error
    assert "307 redirect, not followed" in error
    assert PASSWORD not in error and TOKEN not in error
    html = client_for(compliance).get("/audit/").content.decode()
    assert "Checkpoints are failing" in html and "127.0.0.1" in html
    assert PASSWORD not in html and TOKEN not in html and "cp-user" not in html


def test_a_loopback_webhook_is_refused_by_the_egress_guard(
    signing: Path,  # noqa: F811
    settings: Any,
) -> None:
    for port, seen in _listen("127.0.0.1"):
        settings.DLO_AUDIT_CHECKPOINT_WEBHOOK = _hook_url(port)
        write_events(1)
        assert write_checkpoint() is not None  # the directory copy is written all the same
        assert seen == []
    error = AuditHead.objects.get(pk=1).checkpoint_error
    assert "loopback, link-local or private" in error and "DLO_WEBHOOK_ALLOW" in error
    assert PASSWORD not in error and TOKEN not in error


def test_an_error_stored_with_the_full_url_is_shown_without_its_secrets(
    signing: Path,  # noqa: F811
    settings: Any,
    compliance: User,
) -> None:
    """An error kept by an older version quoted the URL whole: the page strips it on display."""
    url = _hook_url(9)
    settings.DLO_AUDIT_CHECKPOINT_WEBHOOK = url
    write_events(1)
    AuditHead.objects.filter(pk=1).update(checkpoint_error=f"checkpoint webhook {url}: boom")
    html = client_for(compliance).get("/audit/").content.decode()
    assert "checkpoint webhook http://127.0.0.1:9/sink?…: boom" in html
    assert PASSWORD not in html and TOKEN not in html
