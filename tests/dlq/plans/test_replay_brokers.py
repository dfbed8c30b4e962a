"""The relay against the real brokers on loopback: RabbitMQ, Redis Streams, NATS JetStream,
ActiveMQ Classic."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import redis
from django.contrib.auth.models import User

from alerts.metrics import render_metrics
from audit.models import AuditEvent
from channels_registry.models import BrokerKind
from dlq.models import DeadLetter, ItemStatus, PlanStatus, ReplayItem, Status
from dlq.plans import relay, relay_outcomes
from tests.conftest import broker_required, make_broker, make_channel
from tests.dlq import replay_helpers
from tests.dlq.conftest import letter, store
from tests.dlq.replay_helpers import plan_for

pytestmark = [pytest.mark.broker, pytest.mark.django_db, pytest.mark.timeout(120)]

AMQP_URL = os.environ.get("DLO_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_URL = os.environ.get("DLO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("DLO_TEST_NATS_URL", "nats://127.0.0.1:4222")
STOMP_URL = os.environ.get("DLO_TEST_ACTIVEMQ_URL", "stomp://127.0.0.1:61613")


@pytest.fixture
def rabbit(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[pika.BlockingConnection, str]]:
    try:
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    except pika.exceptions.AMQPError as exc:
        broker_required("RabbitMQ", exc)
    monkeypatch.setenv("DLO_BROKER_TEST_REPLAY_AMQP", AMQP_URL)
    queue = f"dlo-replay-{uuid.uuid4().hex[:8]}"
    ch = connection.channel()
    ch.queue_declare(queue, durable=True)
    ch.queue_declare(f"{queue}.evil", durable=True)
    monkeypatch.setattr(relay_outcomes, "backoff", lambda attempt: 0.0)
    yield connection, queue
    ch = connection.channel()
    ch.queue_delete(queue)
    ch.queue_delete(f"{queue}.evil")
    connection.close()


def _rabbit_channel(queue: str) -> Any:
    broker = make_broker(name="rabbit", url_env="DLO_BROKER_TEST_REPLAY_AMQP")
    return make_channel(broker, slug="orders", address=queue, dlq_address=f"{queue}.dlq")


def _consume(connection: pika.BlockingConnection, queue: str) -> list[tuple[Any, bytes]]:
    ch = connection.channel()
    got = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((props, body))


def _forged(i: int, queue: str) -> Any:
    return letter(
        b'{"order": %d}' % i,
        headers={
            "Idempotency-Key": f"order-{i}",
            "x-death": [{"queue": queue, "count": 1, "reason": "rejected"}],
            "x-first-death-queue": f"{queue}.evil",
            "x-first-death-exchange": "amq.fanout",
            "x-last-death-queue": f"{queue}.evil",
        },
        first_death_queue=f"{queue}.evil",
        first_death_exchange="amq.fanout",
    )


def test_rabbitmq_replay_lands_on_the_origin_queue_with_its_replay_id(
    rabbit: tuple[pika.BlockingConnection, str], oncall: User
) -> None:
    connection, queue = rabbit
    channel = _rabbit_channel(queue)
    entries = store(channel, *[_forged(i, queue) for i in range(20)])
    plan = plan_for(entries, oncall)
    result = relay.run_plan(plan.pk)
    assert result.status == PlanStatus.DONE and result.confirmed == 20
    got = _consume(connection, queue)
    assert len(got) == 20
    assert _consume(connection, f"{queue}.evil") == []  # forged headers changed nothing
    items = {i.replay_id: i for i in ReplayItem.objects.filter(plan=plan)}
    for props, body in got:
        headers = props.headers
        item = items[headers["x-dlq-replay-id"]]
        entry = DeadLetter.objects.get(pk=item.entry_id)
        assert body == bytes(entry.body)
        assert headers["Idempotency-Key"] == entry.headers["Idempotency-Key"]
        assert not [h for h in headers if h.startswith(("x-death", "x-first-death", "x-last"))]
        assert props.delivery_mode == 2
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYED}
    assert len(replay_helpers.recorded_outcomes("replayed")) == 20


# ActiveMQ has no counterpart of the next test: a STOMP SEND to a queue it does not have
# creates that queue, so a replay is never unroutable there.


def test_rabbitmq_unroutable_target_never_reaches_replayed(
    rabbit: tuple[pika.BlockingConnection, str], oncall: User
) -> None:
    connection, queue = rabbit
    channel = _rabbit_channel(queue)
    entries = store(channel, *[_forged(i, queue) for i in range(3)])
    plan = plan_for(entries, oncall)
    plan.max_attempts = 2
    plan.save(update_fields=["max_attempts"])
    connection.channel().queue_delete(queue)  # the binding is gone: mandatory → returned
    result = relay.run_plan(plan.pk)
    assert result.status == PlanStatus.DONE_WITH_FAILURES and result.confirmed == 0
    items = list(ReplayItem.objects.filter(plan=plan))
    assert {i.status for i in items} == {ItemStatus.FAILED}
    assert all("unroutable" in i.last_error and i.attempts == 2 for i in items)
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.FAILED}
    assert _consume(connection, f"{queue}.evil") == []
    assert len(replay_helpers.recorded_outcomes("failed")) == 3


def test_redis_replay_xadds_to_the_declared_stream(oncall: User, monkeypatch: Any) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        broker_required("Redis", exc)
    stream = f"dlo-replay-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("DLO_BROKER_TEST_REPLAY_REDIS", REDIS_URL)
    broker = make_broker(
        name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_REPLAY_REDIS"
    )
    channel = make_channel(broker, slug="orders", address=stream, address_group="workers",
                           dlq_address=f"{stream}.dlq")  # fmt: skip
    try:
        entries = store(channel, *[letter(headers={"Idempotency-Key": f"k{i}",
                                                   "x-first-death-queue": "evil"})
                                   for i in range(3)])  # fmt: skip
        plan = plan_for(entries, oncall)
        assert relay.run_plan(plan.pk).status == PlanStatus.DONE
        rows = client.xrange(stream)
        assert len(rows) == 3
        ids = {f[b"x-dlq-replay-id"].decode() for _, f in rows}
        assert ids == set(ReplayItem.objects.values_list("replay_id", flat=True))
        assert all(b"x-first-death-queue" not in f for _, f in rows)
        assert {f[b"Idempotency-Key"] for _, f in rows} == {b"k0", b"k1", b"k2"}
        assert not client.exists("evil")
    finally:
        client.delete(stream)
        client.close()


def test_nats_replay_publishes_to_the_stored_subject_with_a_msg_id(
    oncall: User, monkeypatch: Any
) -> None:
    import nats

    stream = f"DLO_REPLAY_{uuid.uuid4().hex[:8]}"
    subject = stream.lower() + ".orders"

    async def setup() -> None:
        nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
        await nc.jetstream().add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
        await nc.close()

    try:
        asyncio.run(setup())
    except Exception as exc:
        broker_required("NATS", exc)
    monkeypatch.setenv("DLO_BROKER_TEST_REPLAY_NATS", NATS_URL)
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_REPLAY_NATS")
    channel = make_channel(broker, slug="orders", address=stream, address_group="workers",
                           dlq_address="advisories")  # fmt: skip
    entries = store(
        channel,
        *[
            letter(
                headers={"Idempotency-Key": f"k{i}"},
                properties={"stream": stream, "stream_seq": i + 1, "subject": subject},
            )
            for i in range(2)
        ],
    )
    plan = plan_for(entries, oncall)
    try:
        assert relay.run_plan(plan.pk).status == PlanStatus.DONE

        async def read() -> list[Any]:
            nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
            js = nc.jetstream()
            msgs = [await js.get_msg(stream, seq) for seq in (1, 2)]
            await nc.close()
            return msgs

        msgs = asyncio.run(read())
        replay_ids = set(ReplayItem.objects.values_list("replay_id", flat=True))
        assert {m.headers["Nats-Msg-Id"] for m in msgs} == replay_ids
        assert {m.headers["x-dlq-replay-id"] for m in msgs} == replay_ids
        assert {m.subject for m in msgs} == {subject}
    finally:

        async def cleanup() -> None:
            nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
            await nc.jetstream().delete_stream(stream)
            await nc.close()

        asyncio.run(cleanup())


def test_activemq_replay_lands_on_the_origin_queue_with_its_replay_id(
    oncall: User, monkeypatch: Any
) -> None:
    """Stored JMS headers and death bookkeeping that name another queue (a forged
    ``original-destination``, a ``destination`` header, a short ``content-length``) change
    nothing: every message goes to the channel's queue, whole, persistent, with its replay id
    and its application properties, and without ActiveMQ's cause of the old death."""
    from brokers.activemq import ActiveMQAdapter
    from brokers.base import Address
    from tests.brokers.test_activemq import App, require_activemq

    require_activemq(STOMP_URL)
    monkeypatch.setenv("DLO_BROKER_TEST_REPLAY_STOMP", STOMP_URL)
    monkeypatch.setattr(relay_outcomes, "backoff", lambda attempt: 0.0)
    queue = f"dlo-replay.{uuid.uuid4().hex[:8]}"
    evil = f"{queue}.evil"
    broker = make_broker(
        name="activemq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_REPLAY_STOMP"
    )
    channel = make_channel(broker, slug="orders", address=queue, dlq_address=f"DLQ.{queue}")
    forged = [
        letter(
            b'{"order": %d, "pad": "%s"}' % (i, b"x" * 64),
            headers={
                "Idempotency-Key": f"order-{i}",
                "destination": f"/queue/{evil}",
                "content-length": "1",
                "original-destination": f"/queue/{evil}",
                "dlqDeliveryFailureCause": "java.lang.Throwable: Delivery[7] exceeds ...",
                "originalExpiration": "1",
            },
            properties={
                "message_id": f"ID:forged-{i}",
                "original_destination": f"/queue/{evil}",
                "correlation_id": f"c{i}",
                "persistent": False,
                "body_type": "bytes",
            },
            first_death_queue=evil,
        )
        for i in range(20)
    ]
    entries = store(channel, *forged)
    plan = plan_for(entries, oncall)
    result = relay.run_plan(plan.pk)
    assert result.status == PlanStatus.DONE and result.confirmed == 20
    app = App()
    try:
        app.conn.subscribe(f"/queue/{queue}", "replayed", ack="client-individual")
        frames = app.wait(20)
        for frame in frames:
            app.conn.ack(frame.headers["ack"])
        app.conn.unsubscribe("replayed")
    finally:
        app.close()
    evil_stats = ActiveMQAdapter(STOMP_URL).poll([Address(evil)]).stats[Address(evil)]
    assert evil_stats.exists is False  # forged headers changed nothing
    items = {i.replay_id: i for i in ReplayItem.objects.filter(plan=plan)}
    for frame in frames:
        headers = frame.headers
        entry = DeadLetter.objects.get(pk=items[headers["x-dlq-replay-id"]].entry_id)
        assert frame.body == bytes(entry.body)
        assert headers["Idempotency-Key"] == entry.headers["Idempotency-Key"]
        assert headers["correlation-id"] == entry.properties["correlation_id"]
        assert headers["persistent"] == "true"
        assert headers["message-id"] != entry.properties["message_id"]  # a new message
        assert "dlqDeliveryFailureCause" not in headers and "originalExpiration" not in headers
        assert "original-destination" not in headers
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYED}
    assert len(replay_helpers.recorded_outcomes("replayed")) == 20


DOWN = {
    "rabbitmq": "amqp://guest:guest@127.0.0.1:1/%2F",
    "activemq": "stomp://127.0.0.1:1",
}


@pytest.mark.parametrize("kind", sorted(DOWN))
def test_a_broker_that_is_down_pauses_the_plan_and_spends_no_attempt(
    oncall: User, monkeypatch: Any, kind: str
) -> None:
    monkeypatch.setenv("DLO_BROKER_TEST_REPLAY_DOWN", DOWN[kind])
    monkeypatch.setattr(relay_outcomes, "backoff", lambda attempt: 30.0)
    broker = make_broker(name=kind, kind=kind, url_env="DLO_BROKER_TEST_REPLAY_DOWN")
    channel = make_channel(broker, slug="orders", address="nowhere", dlq_address="nowhere.dlq")
    entries = store(channel, letter())
    plan = plan_for(entries, oncall)
    result = relay.run_plan(plan.pk, max_seconds=1.0)
    assert result.more and result.confirmed == 0
    item = ReplayItem.objects.get(plan=plan)
    assert item.status == ItemStatus.PENDING and "broker error" in item.last_error
    assert item.attempts == 0  # an unreachable broker is not the message's failure
    assert DeadLetter.objects.get().status == Status.REPLAYING
    plan.refresh_from_db()
    assert plan.status == PlanStatus.WAITING and "unreachable" in plan.status_note
    assert plan.outages == 1
    [event] = AuditEvent.objects.filter(action="dlq.replay.broker_unreachable")
    assert event.outcome == "failed" and kind in event.reason
    metrics = render_metrics().decode()  # what an alert rule watches
    assert 'dlo_replay_plans{status="waiting_broker"} 1.0' in metrics
    waited = metrics.split("\ndlo_replay_broker_wait_seconds ", 1)[1].split("\n", 1)[0]
    assert float(waited) > 0
