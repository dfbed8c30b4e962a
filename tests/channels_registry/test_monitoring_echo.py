"""Issue #27 item 6: a monitoring or metrics URL pointed at another service never shows that
service's answer: the error is classified (HTTP status, not JSON, not Prometheus text, timeout,
refused), on the adapter and on the board and channel pages every viewer reads."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from brokers.base import Address, BrokerError
from brokers.nats_jetstream import NatsJetStreamAdapter
from brokers.rabbitmq import RabbitMQAdapter
from channels_registry.models import BrokerKind
from channels_registry.polling import do_poll_broker
from tests.conftest import client_for, make_broker, make_channel

MARKER = "INTERNAL-ONLY-7f3a"
#: What each path of the fake service answers: (status, content type, body).
ANSWERS = {
    "/bad-request/jsz": (400, "text/plain", f"{MARKER} admin panel: user=root"),
    "/html/jsz": (200, "text/html", f"<h1>{MARKER}</h1>"),
    "/json/jsz": (200, "application/json", f'{{"secret": "{MARKER}"}}'),
    "/oops/jsz": (500, "text/plain", f"stack trace {MARKER}"),
    "/metrics/detailed": (200, "text/plain", f"{MARKER} is {{not prometheus\n"),
    "/api/queues/%2F": (200, "text/html", f"<p>{MARKER}</p>"),
}


class _Service(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        status, kind, body = ANSWERS.get(self.path.split("?")[0], (404, "text/plain", MARKER))
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def service() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reported(adapter: NatsJetStreamAdapter | RabbitMQAdapter, address: Address) -> str:
    """What a poll says about a monitoring URL that answered wrongly: a refusal that will not
    change (another service's answer) is raised; one that may pass (refused, timeout) falls
    back to the JetStream API or AMQP and is named among the poll's errors and limits."""
    try:
        result = adapter.poll([address])
    except BrokerError as exc:
        return str(exc)
    return " ".join([*result.errors, *result.limits])


def _nats_error(monitor: str) -> str:
    adapter = NatsJetStreamAdapter("nats://127.0.0.1:4222", management_url=monitor, timeout=2.0)
    return _reported(adapter, Address("S", "c"))


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/bad-request", "HTTP 400 (the monitoring port refused the request"),
        ("/html", "not JSON"),
        ("/json", "not a NATS /jsz answer"),
        ("/oops", "HTTP 500"),
    ],
)
def test_a_nats_monitoring_url_at_another_service_shows_no_answer(
    service: str, path: str, expected: str
) -> None:
    error = _nats_error(f"{service}{path}")
    assert expected in error and MARKER not in error


def test_a_refused_monitoring_port_is_classified() -> None:
    error = _nats_error(f"http://127.0.0.1:{_closed_port()}")
    assert "connection refused or host unreachable" in error


def test_a_silent_monitoring_port_is_a_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        adapter = NatsJetStreamAdapter(
            "nats://127.0.0.1:4222", management_url=f"http://127.0.0.1:{port}", timeout=1.0
        )
        assert "no answer in time (timeout)" in _reported(adapter, Address("S", "c"))


def test_rabbitmq_metrics_or_api_at_another_service_shows_no_answer(service: str) -> None:
    url = "amqp://guest:guest@127.0.0.1:5672/%2F"
    cases = ((f"{service}/metrics", "not Prometheus text"), (service, "not JSON"))
    for management, expected in cases:
        adapter = RabbitMQAdapter(url, management_url=management, timeout=2.0)
        reported = _reported(adapter, Address("q"))
        assert expected in reported and MARKER not in reported


@pytest.mark.django_db
def test_the_board_and_channel_page_show_the_classified_error_not_the_answer(
    service: str, monkeypatch: pytest.MonkeyPatch, viewer: User
) -> None:
    monkeypatch.setenv("DLO_BROKER_TEST_ECHO_NATS", "nats://127.0.0.1:4222")
    broker = make_broker(
        name="echo",
        kind=BrokerKind.NATS,
        url_env="DLO_BROKER_TEST_ECHO_NATS",
        management_url=f"{service}/bad-request",
    )
    channel = make_channel(broker, address="ECHO", address_group="c")
    do_poll_broker(broker.pk)
    client = client_for(viewer)
    for url in ("/", f"/channels/{channel.slug}/"):
        html = client.get(url).content.decode()
        assert MARKER not in html, url
        assert "HTTP 400" in html, url
