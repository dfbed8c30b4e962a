"""Issue 14, items 1, 2, 3, 7 and 10 (pending past the budget), observed on the real brokers:
competing consumers on a per-key channel, a declared DLQ the broker does not have, the ack
timeout and in-flight messages older than it, prefetch and retention against the declaration."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import pika
import pytest
import redis
from django.test import Client
from nats.js.api import AckPolicy, ConsumerConfig

from alerts.evaluate import do_evaluate_alerts
from alerts.models import Alert, AlertState, RuleKey
from brokers.activemq import ActiveMQAdapter
from brokers.base import Address
from brokers.nats_jetstream import NatsJetStreamAdapter
from brokers.rabbitmq import RabbitMQAdapter
from channels_registry import observed
from channels_registry.actions import do_poll_broker
from channels_registry.health import HealthState
from channels_registry.models import BrokerKind, ChannelHealth
from tests.conftest import broker_required, make_broker, make_channel, make_user

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
MANAGEMENT_URL = "http://127.0.0.1:15672"
NATS_URL = "nats://127.0.0.1:4222"

pytestmark = [pytest.mark.broker, pytest.mark.django_db]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _queue(amqp: Any, **arguments: Any) -> str:
    name = _name("dlo-contract")
    amqp.queue_declare(name, arguments={"x-queue-type": "classic", **arguments})
    amqp.created.append(name)
    return name


@pytest.fixture
def rabbit(monkeypatch: pytest.MonkeyPatch, amqp: Any) -> Any:
    monkeypatch.setenv("DLO_BROKER_TEST_RABBIT_URL", RABBIT_URL)
    return make_broker(
        name="rabbit", kind=BrokerKind.RABBITMQ, url_env="DLO_BROKER_TEST_RABBIT_URL"
    )


# --- item 2: a declared dead-letter address the broker does not have -----------------------


def test_missing_dlq_is_an_error_finding_on_the_page_and_fires_an_alert(
    amqp: Any, rabbit: Any, client: Client
) -> None:
    queue, poison = _queue(amqp), _queue(amqp)
    missing = _name("dlo-never-created")
    channel = make_channel(rabbit, address=queue, dlq_address=missing, poison_address=poison)

    assert do_poll_broker(rabbit.pk).status == "ok"

    health = ChannelHealth.objects.get(channel=channel)
    finding = next(
        f for f in health.observed_findings if f["code"] == "observed.dead-letter-missing"
    )
    assert finding["severity"] == "error" and finding["addresses"] == [missing]
    client.force_login(make_user("viewer", "viewer"))
    page = client.get(channel.get_absolute_url()).content.decode()
    assert f"The declared dead-letter address {missing} does not exist on the broker" in page

    do_evaluate_alerts()
    alert = Alert.objects.get(channel=channel, rule=RuleKey.DEAD_LETTER_MISSING)
    assert alert.state == AlertState.FIRING
    assert missing in alert.summary


def test_existing_dead_letter_addresses_raise_nothing(amqp: Any, rabbit: Any) -> None:
    channel = make_channel(
        rabbit, address=_queue(amqp), dlq_address=_queue(amqp), poison_address=_queue(amqp)
    )
    do_poll_broker(rabbit.pk)
    codes = {f["code"] for f in ChannelHealth.objects.get(channel=channel).observed_findings}
    assert "observed.dead-letter-missing" not in codes
    do_evaluate_alerts()
    assert not Alert.objects.filter(channel=channel, rule=RuleKey.DEAD_LETTER_MISSING).exists()


# --- item 1: competing consumers on a per-key channel ------------------------------------


@pytest.mark.parametrize(
    ("pinned", "flagged"), [({}, True), ({"partition_mechanism": "consistent-hash"}, False)]
)
def test_two_active_consumers_on_a_per_key_queue_are_a_finding(
    amqp: Any, rabbit: Any, pinned: dict[str, Any], flagged: bool
) -> None:
    queue = _queue(amqp)
    channel = make_channel(
        rabbit,
        address=queue,
        dlq_address=_queue(amqp),
        poison_address=_queue(amqp),
        **pinned,
    )
    workers = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    try:
        for _ in range(2):  # two workers on one queue: the shared subscription
            workers.channel().basic_consume(queue, lambda *a: None, auto_ack=False)
        do_poll_broker(rabbit.pk)
    finally:
        workers.close()
    codes = {f["code"] for f in ChannelHealth.objects.get(channel=channel).observed_findings}
    assert ("observed.competing-consumers" in codes) is flagged


# --- items 1 and 2 on ActiveMQ ---------------------------------------------------------------
# A declared DLQ.<queue> the broker does not have yet is not "missing" on ActiveMQ: it creates a
# dead-letter queue with its first dead letter, so the RabbitMQ case above has no counterpart
# (the test below checks that it raises nothing).


@pytest.mark.parametrize(
    ("pinned", "flagged"), [({}, True), ({"partition_mechanism": "consistent-hash"}, False)]
)
def test_two_stomp_consumers_on_a_per_key_activemq_queue_are_a_finding(
    amq: Any, pinned: dict[str, Any], flagged: bool
) -> None:
    queue = f"indiv.dlo-contract.{uuid.uuid4().hex[:10]}"
    amq.send(queue, b"x")
    broker = make_broker(
        name="activemq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_STOMP_URL"
    )
    channel = make_channel(
        broker, address=queue, dlq_address=f"DLQ.{queue}", poison_address="", **pinned
    )
    for n in range(2):  # two workers on one queue: the shared subscription
        amq.conn.subscribe(f"/queue/{queue}", f"w{n}", ack="client-individual")
    amq.wait(1)
    try:
        for _ in range(40):  # bounded: the broker registers consumers asynchronously
            assert do_poll_broker(broker.pk, force=True).status == "ok"
            health = ChannelHealth.objects.get(channel=channel)
            if health.consumers == 2:
                break
            time.sleep(0.25)
    finally:
        for n in range(2):
            amq.conn.unsubscribe(f"w{n}")
    assert health.consumers == 2
    codes = {f["code"] for f in health.observed_findings}
    assert ("observed.competing-consumers" in codes) is flagged
    assert "observed.dead-letter-missing" not in codes  # DLQ.<queue> holds none yet
    do_evaluate_alerts()
    assert not Alert.objects.filter(channel=channel, rule=RuleKey.DEAD_LETTER_MISSING).exists()
    with ActiveMQAdapter("stomp://127.0.0.1:61613").drain(Address(queue)) as session:
        session.ack(session.fetch(1, wait_s=3.0))


# --- items 3 and 7 on RabbitMQ: consumer timeout, prefetch, retention ---------------------


def _inspect_until(adapter: RabbitMQAdapter, queue: str, done: Any) -> dict[str, Any]:
    """The management API learns of new consumers asynchronously: read again, a bounded
    number of times, until ``done(topology)``."""
    topology: dict[str, Any] = {}
    for _ in range(40):
        found = adapter.inspect([Address(queue)])[Address(queue)]
        topology = dataclasses.asdict(found)
        if done(topology):
            break
        time.sleep(0.25)
    return topology


def test_rabbitmq_consumer_timeout_prefetch_and_retention_against_the_declaration(
    amqp: Any,
) -> None:
    queue = _queue(
        amqp, **{"x-consumer-timeout": 60000, "x-message-ttl": 60000, "x-max-length": 1000}
    )
    adapter = RabbitMQAdapter(RABBIT_URL, management_url=MANAGEMENT_URL, timeout=5.0)
    worker = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    try:
        ch = worker.channel()  # no basic_qos: prefetch 0, unbounded
        ch.basic_consume(queue, lambda *a: None, auto_ack=False)
        topology = _inspect_until(adapter, queue, lambda t: t["prefetch"] is not None)
    finally:
        worker.close()
    assert topology["ack_timeout_s"] == 60.0
    assert topology["prefetch"] == 0
    assert topology["retention_s"] == 60.0 and topology["retention_count"] == 1000

    class Declared:
        address_display = queue
        address = queue
        semantic = "at-least-once"
        dlq_address = ""
        retry_max_attempts = None
        max_in_flight = 50
        ack_timeout_s = 30
        retention_s = 604800

    findings = {f["code"]: f for f in observed.compare(Declared(), topology)}
    assert (
        "60s; the declared ack timeout is 30s"
        in findings["observed.ack-timeout-mismatch"]["message"]
    )
    assert findings["observed.unbounded-in-flight"]["principle"] == "P6"
    assert "keeps messages for 60s" in findings["observed.retention-shorter"]["message"]
    assert "at most 1,000 messages" in findings["observed.retention-by-count"]["message"]


def test_rabbitmq_prefetch_above_the_declared_bound(amqp: Any) -> None:
    queue = _queue(amqp)
    adapter = RabbitMQAdapter(RABBIT_URL, management_url=MANAGEMENT_URL, timeout=5.0)
    worker = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    try:
        ch = worker.channel()
        ch.basic_qos(prefetch_count=200)
        ch.basic_consume(queue, lambda *a: None, auto_ack=False)
        topology = _inspect_until(adapter, queue, lambda t: t["prefetch"] is not None)
    finally:
        worker.close()
    assert topology["prefetch"] == 200
    declared = type("D", (), {"max_in_flight": 50, "ack_timeout_s": None, "retention_s": None})
    assert [f["code"] for f in observed._in_flight(declared, topology)] == [
        "observed.in-flight-above-declared"
    ]


# --- items 3 and 7 on NATS: ack_wait and max_age ------------------------------------------


@pytest.fixture
def nats_stream() -> Iterator[str]:
    name = f"DLOC_{uuid.uuid4().hex[:12]}"

    async def run(work: Any) -> Any:
        nc = await nats.connect(NATS_URL, connect_timeout=2, allow_reconnect=False)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()

    async def create(js: Any) -> None:
        await js.add_stream(name=name, subjects=[f"dloc.{name}.>"], max_age=60)
        await js.add_consumer(
            name,
            ConsumerConfig(
                durable_name="workers", ack_policy=AckPolicy.EXPLICIT, ack_wait=10, max_deliver=5
            ),
        )

    try:
        asyncio.run(run(create))
    except Exception as exc:
        broker_required("NATS JetStream", exc)
    yield name
    asyncio.run(run(lambda js: js.delete_stream(name)))


def test_nats_ack_wait_and_max_age_against_the_declaration(nats_stream: str) -> None:
    adapter = NatsJetStreamAdapter(NATS_URL, timeout=2.0)
    address = Address(nats_stream, "workers")
    topology = dataclasses.asdict(adapter.inspect([address])[address])
    assert topology["ack_timeout_s"] == 10.0
    assert topology["retention_s"] == 60.0
    declared = type("D", (), {"ack_timeout_s": 30, "retention_s": 3600, "max_in_flight": None})
    codes = {f["code"]: f["message"] for f in observed._ack_timeout(declared, topology)}
    assert (
        "ack_wait is 10s; the declared ack timeout is 30s" in codes["observed.ack-timeout-mismatch"]
    )
    assert [f["code"] for f in observed._retention(declared, topology)] == [
        "observed.retention-shorter"
    ]


# --- items 3 and 10 on Redis: in flight past the ack timeout, pending past the budget -------


@pytest.fixture
def redis_stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[redis.Redis, str, Any]]:
    import os

    url = os.environ.get("DLO_TEST_LAYER_REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.ping()
    except Exception as exc:
        broker_required("Redis", exc)
    stream = _name("dlo-contract-stream")
    monkeypatch.setenv("DLO_BROKER_TEST_REDIS_URL", url)
    broker = make_broker(name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_REDIS_URL")
    yield client, stream, broker
    client.delete(stream, f"{stream}.dlq", f"{stream}.poison")
    client.close()


def test_redis_pending_past_budget_is_poisoned_and_old_in_flight_is_evidence(
    redis_stream: tuple[redis.Redis, str, Any],
) -> None:
    client, stream, broker = redis_stream
    client.xgroup_create(stream, "workers", id="0", mkstream=True)
    client.xgroup_create(f"{stream}.dlq", "x", id="0", mkstream=True)
    client.xgroup_create(f"{stream}.poison", "x", id="0", mkstream=True)
    entry = client.xadd(stream, {"order_id": "o-1"})
    client.xreadgroup("workers", "w1", {stream: ">"}, count=1)
    # The worker keeps failing it: 9 deliveries, idle for two minutes (XCLAIM sets both).
    client.xclaim(stream, "workers", "w1", 0, [entry], idle=120_000, retrycount=9)
    channel = make_channel(
        broker,
        address=stream,
        address_group="workers",
        dlq_address=f"{stream}.dlq",
        poison_address=f"{stream}.poison",
        retry_max_attempts=5,
        ack_timeout_s=30,
    )

    do_poll_broker(broker.pk)

    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.POISONED
    text = " ".join(health.evidence)
    assert "delivered 9 times, past the declared retry budget of 5" in text
    assert "past the declared 30 s ack timeout" in text
    codes = {f["code"]: f["severity"] for f in health.observed_findings}
    assert codes["observed.pending-past-budget"] == "error"
