"""Fixtures shared by the real-broker tests of the registry (polling, observed contract)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from tests.conftest import broker_required

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
STOMP_URL = "stomp://127.0.0.1:61613"


@pytest.fixture
def amqp() -> Iterator[Any]:
    """A pika channel on the loopback RabbitMQ; the queues a test appends to ``.created`` are
    deleted afterwards."""
    try:
        connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    except Exception as exc:
        broker_required("RabbitMQ", exc)
    channel = connection.channel()
    created: list[str] = []
    channel.created = created  # type: ignore[attr-defined]
    yield channel
    for name in created:
        with contextlib.suppress(Exception):
            channel.queue_delete(name)
    with contextlib.suppress(Exception):
        connection.close()


@pytest.fixture
def amq(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A STOMP application client (``tests.brokers.test_activemq.App``) on the loopback
    ActiveMQ, and ``DLO_BROKER_TEST_STOMP_URL`` pointing at it. STOMP cannot delete queues:
    the broker collects the empty ones (tests/activemq/activemq.xml), so a test drains what
    it leaves behind."""
    from tests.brokers.test_activemq import App, require_activemq

    require_activemq(STOMP_URL)
    monkeypatch.setenv("DLO_BROKER_TEST_STOMP_URL", STOMP_URL)
    client = App()
    try:
        yield client
    finally:
        client.close()
