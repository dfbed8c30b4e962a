"""Issue #12 item 2: webhooks refuse loopback, link-local (cloud metadata) and private
addresses unless allowlisted, checked at connect time on the resolved address, and never follow
a redirect elsewhere."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings

from alerts.actions import do_evaluate_alerts
from alerts.models import Notification
from alerts.notify import do_deliver_notifications
from dashboard.egress import EgressRefused, pinned_target
from tests.alerts.conftest import Receiver, webhook
from tests.alerts.test_notify import at, stopped_channels

pytestmark = pytest.mark.django_db


@pytest.fixture
def bare_receiver() -> Iterator[Receiver]:
    """A loopback receiver *without* the allowlist."""
    r = Receiver()
    yield r
    r.close()


def _deliver_one(url: str) -> Notification:
    stopped_channels(1)
    webhook(url)
    do_evaluate_alerts(at(0))
    do_deliver_notifications(at(30))
    return Notification.objects.get()


def test_a_loopback_receiver_gets_nothing_without_the_allowlist(bare_receiver: Receiver) -> None:
    n = _deliver_one(bare_receiver.url)
    assert bare_receiver.requests == []
    assert n.status == "failed" and n.attempts == 1
    assert "loopback, link-local or private" in n.last_error
    assert "DLO_WEBHOOK_ALLOW" in n.last_error


def test_the_same_receiver_gets_the_post_once_allowlisted(bare_receiver: Receiver) -> None:
    with override_settings(DLO_WEBHOOK_ALLOW=["127.0.0.0/8"]):
        n = _deliver_one(bare_receiver.url)
    assert n.status == "sent" and len(bare_receiver.requests) == 1


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://[fe80::1]/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.10:8080/hook",
        "http://172.16.5.5/hook",
        "http://100.64.0.1/hook",  # carrier-grade NAT: not global either
        "http://localhost:8000/hook",  # a name: checked on what it resolves to
        "http://[::1]:8000/hook",
        "http://[::ffff:127.0.0.1]:8000/hook",
        "http://0.0.0.0:8000/hook",
        "http://2130706433/hook",  # 127.0.0.1 as one decimal number
    ],
)
def test_private_link_local_and_loopback_targets_are_refused(url: str) -> None:
    with pytest.raises(EgressRefused, match="loopback, link-local or private|cannot resolve"):
        pinned_target(url)


def test_a_public_address_is_pinned_and_the_host_kept() -> None:
    pinned, host = pinned_target("https://93.184.215.14:8443/hook?x=1")
    assert pinned == "https://93.184.215.14:8443/hook?x=1" and host == "93.184.215.14:8443"


def test_an_allowlisted_name_is_sent_to_the_address_it_resolved_to(
    bare_receiver: Receiver,
) -> None:
    port = bare_receiver.url.split(":")[2].split("/")[0]
    with override_settings(DLO_WEBHOOK_ALLOW=["localhost"]):
        n = _deliver_one(f"http://localhost:{port}/hook")
    assert n.status == "sent"
    headers = bare_receiver.requests[0][0]
    assert headers["Host"] == f"localhost:{port}"


class _Redirect(http.server.BaseHTTPRequestHandler):
    target = ""
    seen: list[str]

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.seen.append(self.path)
        self.send_response(307)
        self.send_header("Location", self.target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_redirect_to_an_internal_host_is_not_followed(bare_receiver: Receiver) -> None:
    seen: list[str] = []
    handler = type("H", (_Redirect,), {"target": bare_receiver.url, "seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with override_settings(DLO_WEBHOOK_ALLOW=["127.0.0.2/32"]):
            n = _deliver_one(f"http://127.0.0.2:{server.server_address[1]}/hook")
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["/hook"]
    assert bare_receiver.requests == []  # 127.0.0.1 is not allowed: the 307 went nowhere
    assert n.status != "sent" and "HTTP 307" in n.last_error


@pytest.mark.parametrize(
    "url",
    [
        "http://[64:ff9b::7f00:1]/hook",  # NAT64 of 127.0.0.1
        "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of the cloud metadata address
        "http://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
        "http://[2002:c0a8:10a::1]/hook",  # 6to4 of 192.168.1.10
        "http://[::127.0.0.1]/hook",  # IPv4-compatible
        "http://[::10.0.0.1]/hook",
        "http://[::ffff:10.0.0.1]/hook",  # IPv4-mapped
        "http://[::ffff:0:7f00:1]/hook",  # IPv4-translated (SIIT)
        "http://[64:ff9b:1::808:808]/hook",  # local-use NAT64: the operator's own network
    ],
)
def test_ipv6_forms_carrying_a_private_ipv4_address_are_refused(url: str) -> None:
    """Issue #27 item 9: the IPv4 address inside the IPv6 one is judged by the same rules."""
    with pytest.raises(EgressRefused, match="loopback, link-local or private"):
        pinned_target(url)


@pytest.mark.parametrize(
    "address", ["64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8", "2606:4700::1111"]
)
def test_ipv6_forms_carrying_a_public_ipv4_address_pass(address: str) -> None:
    pinned, _host = pinned_target(f"https://[{address}]/hook")
    assert pinned.startswith("https://[")
