"""Identity is one death (docs/identity.md), on the real brokers.

Each test dead-letters 20 messages through the application's own consumer, ingests them,
replays them, lets the consumer reject them again, and ingests twice: the first ingest of the
second deaths commits and then fails to ack (the crash-before-ack window), the second re-reads
the same deaths. Expected: 20 new child entries linked to their parents, then 20 duplicates.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
import redis
from django.contrib.auth.models import User

from brokers.activemq import ActiveMQDrainSession
from brokers.base import Address, BrokerError
from brokers.nats_jetstream import ADVISORY_STREAM, NatsDrainSession
from brokers.rabbitmq import RabbitMQDrainSession
from brokers.redis_streams import RedisDrainSession
from channels_registry.models import BrokerKind, Channel
from dlq.capture import ingest
from dlq.models import DeadLetter, PlanStatus
from dlq.plans import relay, relay_outcomes
from dlq.plans.relay_states import canary_recurrences
from tests.conftest import broker_required, make_broker, make_channel
from tests.dlq.replay_helpers import plan_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.broker,
    pytest.mark.django_db,
    pytest.mark.timeout(180),
]

AMQP_URL = os.environ.get("DLO_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_URL = os.environ.get("DLO_TEST_LAYER_REDIS_URL", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("DLO_TEST_NATS_URL", "nats://127.0.0.1:4222")
STOMP_URL = os.environ.get("DLO_TEST_ACTIVEMQ_URL", "stomp://127.0.0.1:61613")
COUNT = 20


class Rig:
    """One broker's application: a work address and a consumer that dead-letters everything."""

    channel: Channel

    def publish(self, n: int) -> None:
        raise NotImplementedError

    def reject_all(self, expected: int) -> None:
        raise NotImplementedError


# -- RabbitMQ: a work queue with a dead-letter exchange, a consumer that rejects ------------


class RabbitRig(Rig):
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        try:
            self.conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        except pika.exceptions.AMQPError as exc:
            broker_required("RabbitMQ", exc)
        self.queue = f"dlo-death-{uuid.uuid4().hex[:8]}"
        ch = self.conn.channel()
        ch.queue_declare(f"{self.queue}.dlq", durable=True)
        ch.queue_declare(
            self.queue,
            durable=True,
            arguments={
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": f"{self.queue}.dlq",
            },
        )
        monkeypatch.setenv("DLO_BROKER_TEST_DEATH_AMQP", AMQP_URL)
        broker = make_broker(name="rabbit", url_env="DLO_BROKER_TEST_DEATH_AMQP")
        self.channel = make_channel(
            broker,
            slug="orders",
            address=self.queue,
            dlq_address=f"{self.queue}.dlq",
            poison_address="",
        )

    def publish(self, n: int) -> None:
        ch = self.conn.channel()
        for i in range(n):
            props = pika.BasicProperties(
                delivery_mode=2, message_id=f"order-{i}", headers={"Idempotency-Key": f"k{i}"}
            )
            ch.basic_publish("", self.queue, b'{"order": %d}' % i, props)

    def reject_all(self, expected: int) -> None:
        ch = self.conn.channel()
        rejected = 0
        for _ in range(expected * 50):
            method, _props, _body = ch.basic_get(self.queue, auto_ack=False)
            if method is None:
                self.conn.sleep(0.05)
                continue
            ch.basic_reject(method.delivery_tag, requeue=False)
            rejected += 1
            if rejected == expected:
                return
        raise AssertionError(f"only {rejected} of {expected} messages reached the consumer")

    def close(self) -> None:
        ch = self.conn.channel()
        ch.queue_delete(self.queue)
        ch.queue_delete(f"{self.queue}.dlq")
        self.conn.close()


# -- Redis: a worker group that copies a failed entry's fields to the DLQ stream ---------


class RedisRig(Rig):
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.client = redis.Redis.from_url(REDIS_URL)
        try:
            self.client.ping()
        except redis.RedisError as exc:
            broker_required("Redis", exc)
        self.stream = f"dlo-death-{uuid.uuid4().hex[:8]}"
        self.client.xgroup_create(self.stream, "workers", id="0", mkstream=True)
        monkeypatch.setenv("DLO_BROKER_TEST_DEATH_REDIS", REDIS_URL)
        broker = make_broker(
            name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_DEATH_REDIS"
        )
        self.channel = make_channel(
            broker,
            slug="orders",
            address=self.stream,
            address_group="workers",
            dlq_address=f"{self.stream}.dlq",
            poison_address="",
        )

    def publish(self, n: int) -> None:
        for i in range(n):
            self.client.xadd(
                self.stream, {"body": b'{"order": %d}' % i, "Idempotency-Key": f"k{i}"}
            )

    def reject_all(self, expected: int) -> None:
        got = self.client.xreadgroup("workers", "w1", {self.stream: ">"}, count=expected * 2)
        entries = got[0][1] if got else []
        assert len(entries) == expected
        for entry_id, fields in entries:
            self.client.xadd(f"{self.stream}.dlq", {**fields, b"reason": b"failed"})
            self.client.xack(self.stream, "workers", entry_id)

    def close(self) -> None:
        self.client.delete(self.stream, f"{self.stream}.dlq")
        self.client.close()


# -- NATS: a stream, a durable consumer that terminates every message ------------------------


def _nats(work: Callable[[Any], Any]) -> Any:
    import nats

    async def run() -> Any:
        nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
        try:
            return await work(nc)
        finally:
            await nc.close()

    return asyncio.run(run())


class NatsRig(Rig):
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig

        self.stream = f"DLO_DEATH_{uuid.uuid4().hex[:8]}"
        self.subject = f"{self.stream.lower()}.orders"

        async def setup(nc: Any) -> None:
            js = nc.jetstream()
            await js.add_stream(name=self.stream, subjects=[f"{self.stream.lower()}.>"])
            await js.add_consumer(
                self.stream,
                ConsumerConfig(durable_name="app", ack_policy=AckPolicy.EXPLICIT, max_deliver=3),
            )

        try:
            _nats(setup)
        except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
            broker_required("NATS", exc)
        monkeypatch.setenv("DLO_BROKER_TEST_DEATH_NATS", NATS_URL)
        broker = make_broker(
            name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_DEATH_NATS"
        )
        self.channel = make_channel(
            broker,
            slug="orders",
            address=self.stream,
            address_group="app",
            nats_advisory_capture=True,
        )
        ingest.adapter_for(self.channel).prepare_drain(Address(self.stream, "app"))

    def publish(self, n: int) -> None:
        async def work(nc: Any) -> None:
            js = nc.jetstream()
            for i in range(n):
                await js.publish(
                    self.subject, b'{"order": %d}' % i, headers={"Idempotency-Key": f"k{i}"}
                )

        _nats(work)

    def reject_all(self, expected: int) -> None:
        async def work(nc: Any) -> int:
            sub = await nc.jetstream().pull_subscribe_bind("app", self.stream)
            done = 0
            for _ in range(expected * 5):
                try:
                    msgs = await sub.fetch(expected - done, timeout=1)
                except TimeoutError:
                    continue
                for msg in msgs:
                    await msg.term()
                    done += 1
                if done == expected:
                    break
            await nc.flush()
            return done

        assert _nats(work) == expected

    def close(self) -> None:
        async def work(nc: Any) -> None:
            js = nc.jetstream()
            await js.delete_stream(self.stream)
            for info in await js.consumers_info(ADVISORY_STREAM):  # our drain consumers
                if self.stream in info.name:
                    await js.delete_consumer(ADVISORY_STREAM, info.name)

        _nats(work)


# -- ActiveMQ: a queue with its own DLQ.<queue>, a STOMP consumer that NACKs everything -----


class ActiveMQRig(Rig):
    """``indiv.>`` queues dead-letter into ``DLQ.<queue>`` (tests/activemq/activemq.xml); a
    NACKed message is dead-lettered at once, as a JMS client past its redelivery policy does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from tests.brokers.test_activemq import App, require_activemq

        require_activemq(STOMP_URL)
        self.app = App()
        self.queue = f"indiv.dlo-death.{uuid.uuid4().hex[:8]}"
        self.rejections = 0
        monkeypatch.setenv("DLO_BROKER_TEST_DEATH_STOMP", STOMP_URL)
        broker = make_broker(
            name="activemq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_DEATH_STOMP"
        )
        self.channel = make_channel(
            broker,
            slug="orders",
            address=self.queue,
            dlq_address=f"DLQ.{self.queue}",
            poison_address="",
        )

    def publish(self, n: int) -> None:
        for i in range(n):
            self.app.send(self.queue, b'{"order": %d}' % i, **{"Idempotency-Key": f"k{i}"})

    def reject_all(self, expected: int) -> None:
        self.rejections += 1
        sub = f"reject-{self.rejections}"
        self.app.conn.subscribe(f"/queue/{self.queue}", sub, ack="client-individual")
        for frame in self.app.wait(expected):
            self.app.conn.nack(frame.headers["ack"])
        self.app.conn.unsubscribe(sub)

    def close(self) -> None:
        # STOMP cannot delete a queue: the broker collects the empty ones (activemq.xml).
        self.app.close()


RIGS: dict[str, tuple[type[Rig], type[Any]]] = {
    "rabbitmq": (RabbitRig, RabbitMQDrainSession),
    "redis": (RedisRig, RedisDrainSession),
    "nats": (NatsRig, NatsDrainSession),
    "activemq": (ActiveMQRig, ActiveMQDrainSession),
}


@pytest.fixture(params=sorted(RIGS))
def rig(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.setattr(relay_outcomes, "backoff", lambda attempt: 0.0)
    made = RIGS[request.param][0](monkeypatch)
    made.kind = request.param  # type: ignore[attr-defined]
    try:
        yield made
    finally:
        made.close()  # type: ignore[attr-defined]


def _ingest_until(channel: Channel, wanted: int) -> ingest.IngestResult:
    """Ingest until ``wanted`` letters were fetched (advisories may trail the consumer)."""
    total = ingest.IngestResult(channel.slug)
    for _ in range(10):
        total.add(ingest.ingest_channel(channel))
        if total.fetched >= wanted:
            break
    return total


def test_a_replayed_message_that_dies_again_is_a_new_child_entry(
    rig: Rig, oncall: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_class = RIGS[rig.kind][1]  # type: ignore[attr-defined]
    rig.publish(COUNT)
    rig.reject_all(COUNT)
    first = _ingest_until(rig.channel, COUNT)
    assert (first.fetched, first.inserted) == (COUNT, COUNT)
    parents = list(DeadLetter.objects.order_by("id"))

    plan = plan_for(parents, oncall)
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    rig.reject_all(COUNT)  # the consumer is still broken: every replay dies again

    # The second deaths are committed, then the ack fails (a crash before the ack).
    def lost_ack(self: Any, letters: Any) -> None:
        raise BrokerError("connection lost before the ack")

    with monkeypatch.context() as patch:
        patch.setattr(session_class, "ack", lost_ack)
        with pytest.raises(BrokerError):
            _ingest_until(rig.channel, COUNT)
    children = DeadLetter.objects.filter(parent__isnull=False)
    assert children.count() == COUNT, "every second death is a new entry"
    assert {c.parent_id for c in children} == {p.pk for p in parents}
    assert {c.generation for c in children} == {1}
    assert canary_recurrences(plan) == COUNT

    # The broker redelivers the unacknowledged second deaths: the same deaths, deduplicated.
    again = _ingest_until(rig.channel, COUNT)
    assert (again.fetched, again.inserted, again.duplicates) == (COUNT, 0, COUNT)
    assert DeadLetter.objects.count() == 2 * COUNT
    assert ingest.ingest_channel(rig.channel).fetched == 0  # acknowledged: drained


def test_rabbitmq_a_producer_resending_identical_bytes_is_one_entry_per_death(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three byte-identical publishes rejected together (same x-death second): three deaths.
    A crash before the ack redelivers the same three: still three."""
    rig = RabbitRig(monkeypatch)
    try:
        ch = rig.conn.channel()
        props = pika.BasicProperties(delivery_mode=2, message_id="order-7")
        for _ in range(3):
            ch.basic_publish("", rig.queue, b'{"order": 7}', props)
        rig.reject_all(3)
        with monkeypatch.context() as patch:
            patch.setattr(RabbitMQDrainSession, "ack", lambda self, letters: 1 / 0)
            with pytest.raises(ZeroDivisionError):
                _ingest_until(rig.channel, 3)
        assert DeadLetter.objects.count() == 3
        again = _ingest_until(rig.channel, 3)
        assert (again.fetched, again.inserted, again.duplicates) == (3, 0, 3)
    finally:
        rig.close()


def test_nats_one_message_given_up_by_two_consumers_is_two_deaths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two channels on one stream (two durable consumers) both terminate the same stored
    message: two advisories, two deaths, one entry on each channel."""
    from nats.js.api import AckPolicy, ConsumerConfig

    rig = NatsRig(monkeypatch)
    try:

        async def second_consumer(nc: Any) -> None:
            config = ConsumerConfig(durable_name="audit", ack_policy=AckPolicy.EXPLICIT)
            await nc.jetstream().add_consumer(rig.stream, config)

        _nats(second_consumer)
        audit = make_channel(
            rig.channel.broker,
            slug="orders-audit",
            name="Orders audit",
            address=rig.stream,
            address_group="audit",
            nats_advisory_capture=True,
        )
        ingest.adapter_for(audit).prepare_drain(Address(rig.stream, "audit"))
        rig.publish(1)
        rig.reject_all(1)

        async def audit_terminates(nc: Any) -> None:
            sub = await nc.jetstream().pull_subscribe_bind("audit", rig.stream)
            [msg] = await sub.fetch(1, timeout=5)
            await msg.term()
            await nc.flush()

        _nats(audit_terminates)
        assert _ingest_until(rig.channel, 1).inserted == 1
        assert _ingest_until(audit, 1).inserted == 1
        assert DeadLetter.objects.filter(channel=audit).count() == 1
    finally:
        rig.close()
