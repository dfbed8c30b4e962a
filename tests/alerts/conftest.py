"""Helpers for the alert tests: health rows as a poll would leave them, a webhook receiver."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from alerts.models import Destination, DestinationKind
from channels_registry.models import Broker, BrokerPollState, Channel, ChannelHealth

SECRET = "s3cret-for-tests"


def polled(broker: Broker, now: dt.datetime) -> BrokerPollState:
    """The broker's poller succeeded at ``now``."""
    state, _ = BrokerPollState.objects.get_or_create(broker=broker)
    state.last_success_at = now
    state.consecutive_failures = 0
    state.save()
    return state


def set_health(channel: Channel, now: dt.datetime, **fields: Any) -> ChannelHealth:
    """A health row sampled at ``now``: OK, consumers attached, empty queues unless given."""
    values: dict[str, Any] = {
        "state": "ok",
        "backlog": 0,
        "in_flight": 0,
        "consumers": 1,
        "active_consumers": 1,
        "dlq_depth": 0,
        "poison_depth": 0,
        "last_sample_at": now,
        "updated_at": now,
        "evidence": ["backlog 0, steady"],
        "window": [],
    }
    values.update(fields)
    health, _ = ChannelHealth.objects.update_or_create(channel=channel, defaults=values)
    polled(channel.broker, now)
    return health


class Receiver:
    """A tiny HTTP server on loopback recording every POST; answers ``status``."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.status = 200
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                receiver.requests.append((dict(self.headers.items()), body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _headers, body in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def loopback_webhooks(settings: Any) -> None:
    """Webhooks refuse loopback addresses unless the operator allows them: these tests'
    receivers listen on 127.0.0.1, so they allow it, as an operator would."""
    settings.DLO_WEBHOOK_ALLOW = ["127.0.0.1/32"]


@pytest.fixture
def receiver(loopback_webhooks: None) -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def webhook(url: str, **overrides: Any) -> Destination:
    fields: dict[str, Any] = {
        "name": "ops-webhook",
        "kind": DestinationKind.WEBHOOK,
        "url": url,
        "secret": SECRET,
    }
    fields.update(overrides)
    dest = Destination(**fields)
    dest.full_clean()
    dest.save()
    return dest


def closed_port_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/hook"
