# ruff: noqa: F811 - fixtures imported from the neighbouring modules
"""Messages waiting to retry (issue 22, item 5), read from the real brokers on loopback: the
channel page's section, with and without htmx, hostile text escaped, unknown with a reason."""

from __future__ import annotations

import asyncio
from typing import Any

import pika
import pytest
import redis
from django.contrib.auth.models import User
from nats.js.api import AckPolicy, ConsumerConfig

from channels_registry.actions import do_poll_broker
from channels_registry.models import BrokerKind, ChannelHealth
from tests.channels_registry.test_poll import (  # noqa: F401 - fixtures
    NATS_URL,
    _name,
    _nats,
    nats_stream,
    rabbit_broker,
    redis_client,
)
from tests.conftest import client_for, make_broker, make_channel

pytestmark = [pytest.mark.broker, pytest.mark.django_db]


def _board_cell(viewer: User, slug: str) -> str:
    """The "Retrying" cell of the channel's board row."""
    board = client_for(viewer).get("/").content.decode()
    row = board.split(f'href="/channels/{slug}/"')[1].split("</tr>")[0]
    return row.split('data-label="Retrying">')[1].split("</td>")[0]


def _section(viewer: User, slug: str, *, htmx: bool) -> str:
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = client_for(viewer).get(f"/channels/{slug}/retries/", **headers)
    assert response.status_code == 200
    return response.content.decode()


def test_redis_pending_entries_are_listed_with_their_delivery_counts(
    redis_client: redis.Redis, viewer: User
) -> None:
    stream = _name("dlo-retry")
    redis_client.created.append(stream)  # type: ignore[attr-defined]
    ids = [redis_client.xadd(stream, {"n": i}) for i in range(3)]
    redis_client.xgroup_create(stream, "workers", id="0")
    hostile = "c<script>alert(1)</script>"
    redis_client.xreadgroup("workers", hostile, {stream: ">"}, count=3)
    redis_client.xack(stream, "workers", ids[0])
    for _ in range(2):  # the second entry failed twice more: claimed again by its consumer
        redis_client.xclaim(stream, "workers", hostile, min_idle_time=0, message_ids=[ids[1]])
    broker = make_broker(name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_REDIS_URL")
    make_channel(broker, address=stream, address_group="workers", ack_timeout_s=30)

    partial = _section(viewer, "orders", htmx=True)
    page = _section(viewer, "orders", htmx=False)

    assert "<html" not in partial and "<html" in page
    assert '<dd id="retry-count">2</dd>' in partial
    rows = partial.split("<tbody>")[1]
    assert rows.index(ids[1].decode()) < rows.index(ids[2].decode())  # oldest first
    assert "<td>3</td>" in rows and "<td>1</td>" in rows  # delivery counts
    assert "estimated: last delivery + the declared ack timeout of 30 s" in partial
    assert hostile not in partial and "c&lt;script&gt;alert(1)&lt;/script&gt;" in partial

    # The board row: the same count, from the poll's own sample (no read of its own).
    assert do_poll_broker(broker.pk).status == "ok"
    health = ChannelHealth.objects.get(channel__slug="orders")
    assert (health.retry_waiting, health.retry_unknown) == (2, "")
    assert _board_cell(viewer, "orders") == "2"


def test_rabbitmq_ttl_retry_queue_is_counted_and_said_unlistable(
    amqp: Any, rabbit_broker: Any, viewer: User
) -> None:
    work, retry = _name("dlo-work"), _name("dlo-retry")
    amqp.queue_declare(work)
    amqp.queue_declare(retry, arguments={"x-dead-letter-exchange": "",
                                         "x-dead-letter-routing-key": work})  # fmt: skip
    amqp.created.extend([work, retry])
    for i in range(4):
        amqp.basic_publish("", retry, f"m{i}".encode(), pika.BasicProperties(expiration="600000"))
    make_channel(rabbit_broker, address=work, retry_address=retry, dlq_address="")
    make_channel(rabbit_broker, slug="no-retry", address=work + "-2", dlq_address="")

    partial = _section(viewer, "orders", htmx=True)
    undeclared = _section(viewer, "no-retry", htmx=True)

    assert '<dd id="retry-count">4</dd>' in partial
    assert '<dd id="retry-next">unknown</dd>' in partial
    assert "cannot show the messages of a queue" in partial
    assert '<dd id="retry-count">unknown</dd>' in undeclared
    assert "No retry queue is declared" in undeclared

    # The board rows: the retry queue sampled with the poll's other queues; undeclared is
    # unknown with the reason.
    assert do_poll_broker(rabbit_broker.pk).status == "ok"
    assert ChannelHealth.objects.get(channel__slug="orders").retry_waiting == 4
    assert _board_cell(viewer, "orders") == "4"
    cell = _board_cell(viewer, "no-retry")
    assert cell == 'unknown<div class="sub why">no retry queue declared</div>'


def test_nats_naked_with_delay_is_bounded_by_ack_pending_and_not_listed(
    nats_stream: str, viewer: User
) -> None:
    subject = f"{nats_stream.lower()}.orders"

    async def traffic(js: Any) -> None:
        await js.add_stream(name=nats_stream, subjects=[f"{nats_stream.lower()}.>"])
        await js.add_consumer(
            nats_stream, ConsumerConfig(durable_name="workers", ack_policy=AckPolicy.EXPLICIT)
        )
        for i in range(3):
            await js.publish(subject, f"m{i}".encode())
        sub = await js.pull_subscribe_bind("workers", nats_stream)
        msgs = await sub.fetch(3, timeout=2)
        await msgs[0].ack_sync()
        for msg in msgs[1:]:
            await msg.nak(delay=300)  # retry in five minutes, as the discipline asks
        await asyncio.sleep(0.2)

    _nats(traffic)
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_NATS_URL")
    make_channel(broker, address=nats_stream, address_group="workers", dlq_address="")

    partial = _section(viewer, "orders", htmx=True)

    assert '<dd id="retry-count">unknown (at most 2)</dd>' in partial
    assert "cannot list pending messages or their redelivery times" in partial
    assert "<table" not in partial

    assert do_poll_broker(broker.pk).status == "ok"
    health = ChannelHealth.objects.get(channel__slug="orders")
    assert health.retry_waiting is None
    assert "at most 2 (awaiting ack)" in health.retry_unknown
    assert _board_cell(viewer, "orders").startswith('unknown<div class="sub why">NATS counts a nak')


def test_activemq_redelivery_is_client_side_unknown_and_never_read_by_consuming(
    amq: Any, viewer: User
) -> None:
    """ActiveMQ redelivers from the JMS client's session: nothing on the broker lists what
    waits for a retry. Two messages given back by a consumer (redelivered) stay unknown, with
    the reason, and reading the section consumes nothing."""
    import uuid

    from brokers.activemq import ActiveMQAdapter
    from brokers.base import Address

    queue = f"dlo-retry.{uuid.uuid4().hex[:10]}"
    for i in range(2):
        amq.send(queue, b"m%d" % i)
    amq.conn.subscribe(f"/queue/{queue}", "fail", ack="client-individual")
    amq.wait(2)
    amq.conn.unsubscribe("fail")  # processing failed: given back, to be redelivered
    broker = make_broker(
        name="activemq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_STOMP_URL"
    )
    make_channel(broker, address=queue, dlq_address="", poison_address="")

    partial = _section(viewer, "orders", htmx=True)

    assert '<dd id="retry-count">unknown</dd>' in partial
    assert "the broker cannot list what waits for a retry" in partial
    assert "<table" not in partial

    assert do_poll_broker(broker.pk).status == "ok"
    health = ChannelHealth.objects.get(channel__slug="orders")
    assert health.retry_waiting is None
    assert health.retry_unknown == (
        "ActiveMQ retries from the client (a JMS RedeliveryPolicy, or a re-send the broker's"
        " scheduler holds): no queue statistic counts them"
    )
    assert _board_cell(viewer, "orders").startswith(
        'unknown<div class="sub why">ActiveMQ retries from the client'
    )
    with ActiveMQAdapter("stomp://127.0.0.1:61613").drain(Address(queue)) as session:
        left = session.fetch(2, wait_s=3.0)  # both still on the broker
        left += session.fetch(2 - len(left), wait_s=1.0) if len(left) < 2 else []
        session.ack(left)
    assert sorted(x.body for x in left) == [b"m0", b"m1"]


def test_an_unreachable_broker_makes_every_retry_number_unknown(
    viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("DLO_BROKER_TEST_DOWN_URL", f"redis://127.0.0.1:{port}/0")
    broker = make_broker(name="down", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_DOWN_URL")
    make_channel(broker, address="s", address_group="g")

    partial = _section(viewer, "orders", htmx=True)

    assert "Unknown: the broker could not be read" in partial
    assert "retry-count" not in partial


def test_the_channel_page_loads_the_section_with_a_plain_link_too(viewer: User) -> None:
    make_channel()
    page = client_for(viewer).get("/channels/orders/").content.decode()
    assert 'href="/channels/orders/retries/" hx-get="/channels/orders/retries/"' in page


_ = NATS_URL
