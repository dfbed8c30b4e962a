"""Polling against the real brokers on loopback: exact sampled values, states, STALE on failure.

Every test declares its broker with ``url_env`` pointing at an environment variable set with
``monkeypatch``, creates uniquely named queues/streams with known depth, polls through the
action, and deletes what it created.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import nats
import pika
import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from nats.js.api import AckPolicy, ConsumerConfig

from channels_registry.actions import do_poll_broker
from channels_registry.health import DlqFlag, HealthState
from channels_registry.models import (
    Broker,
    BrokerKind,
    BrokerPollState,
    ChannelHealth,
    ChannelRollup,
    ChannelSample,
)
from channels_registry.polling import due_brokers, prune_samples
from tests.conftest import broker_required, client_for, make_broker, make_channel

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
MGMT_URL = "http://127.0.0.1:15672"

pytestmark = [pytest.mark.broker, pytest.mark.django_db]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _queue(channel: Any, depth: int, **arguments: Any) -> str:
    name = _name("dlo-poll")
    channel.queue_declare(name, arguments={"x-queue-type": "classic", **arguments})
    channel.created.append(name)
    for i in range(depth):
        channel.basic_publish("", name, f"m{i}".encode())
    return name


def _drain(queue: str, count: int) -> None:
    """Take ``count`` messages off an ActiveMQ queue (STOMP cannot delete it), bounded."""
    from brokers.activemq import ActiveMQAdapter
    from brokers.base import Address

    taken = 0
    with ActiveMQAdapter("stomp://127.0.0.1:61613").drain(Address(queue)) as session:
        for _ in range(count + 1):
            batch = session.fetch(count - taken, wait_s=2.0)
            session.ack(batch)
            taken += len(batch)
            if not batch or taken >= count:
                break
    assert taken == count


@pytest.fixture
def rabbit_broker(monkeypatch: pytest.MonkeyPatch, amqp: Any) -> Any:
    monkeypatch.setenv("DLO_BROKER_TEST_RABBIT_URL", RABBIT_URL)
    return make_broker(
        name="rabbit", kind=BrokerKind.RABBITMQ, url_env="DLO_BROKER_TEST_RABBIT_URL"
    )


def test_rabbitmq_poll_samples_exact_depths_and_stopped(amqp: Any, rabbit_broker: Any) -> None:
    queue = _queue(amqp, 7)
    dlq = _queue(amqp, 2)
    poison = _queue(amqp, 1)
    channel = make_channel(rabbit_broker, address=queue, dlq_address=dlq, poison_address=poison)

    outcome = do_poll_broker(rabbit_broker.pk)

    assert outcome.status == "ok", outcome.errors
    assert outcome.channels == 1
    sample = ChannelSample.objects.get(channel=channel)
    assert (sample.backlog, sample.consumers, sample.dlq_depth, sample.poison_depth) == (7, 0, 2, 1)
    assert sample.exists is True and sample.stale is False
    assert sample.in_flight is None  # the passive-declare path cannot see it: unknown, not 0
    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.STOPPED
    assert health.evidence[0] == "7 messages waiting and no active consumer."
    assert DlqFlag.NONEMPTY in health.dlq_flags
    assert ChannelRollup.objects.filter(channel=channel, backlog=7).count() == 1
    state = BrokerPollState.objects.get(pk=rabbit_broker.pk)
    assert state.lease_until is None and state.consecutive_failures == 0
    assert state.last_success_at is not None


def test_rabbitmq_consumer_stopping_turns_channel_stopped(amqp: Any, rabbit_broker: Any) -> None:
    queue = _queue(amqp, 5)
    channel = make_channel(rabbit_broker, address=queue, dlq_address="", poison_address="")
    consumer_connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    consumer = consumer_connection.channel()
    consumer.basic_qos(prefetch_count=2)
    consumer.basic_consume(queue, lambda *a: None, auto_ack=False)
    consumer_connection.process_data_events(time_limit=0.5)

    do_poll_broker(rabbit_broker.pk)
    first = ChannelSample.objects.filter(channel=channel).latest("taken_at")
    assert (first.backlog, first.consumers) == (3, 1)
    assert ChannelHealth.objects.get(channel=channel).state != HealthState.STOPPED

    consumer_connection.close()  # the two unacked messages go back to the queue
    do_poll_broker(rabbit_broker.pk)
    second = ChannelSample.objects.filter(channel=channel).latest("taken_at")
    assert (second.backlog, second.consumers) == (5, 0)
    assert ChannelHealth.objects.get(channel=channel).state == HealthState.STOPPED


def test_rabbitmq_missing_queue_is_unknown_and_flagged_as_observed(
    amqp: Any, rabbit_broker: Any
) -> None:
    channel = make_channel(
        rabbit_broker, address=_name("dlo-missing"), dlq_address="", poison_address=""
    )
    do_poll_broker(rabbit_broker.pk)
    sample = ChannelSample.objects.get(channel=channel)
    assert sample.exists is False and sample.backlog is None
    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.UNKNOWN
    assert [f["code"] for f in health.observed_findings] == ["observed.address-missing"]


def require_management(url: str) -> None:
    """The topology tests read queue arguments through the management API: on a machine
    where the plugin is off they skip with the fix (in CI, where it must be on, they fail)."""
    import httpx

    try:
        httpx.get(url + "/api/overview", auth=("guest", "guest"), timeout=2.0)
    except httpx.HTTPError as exc:
        broker_required(
            "RabbitMQ's management plugin (rabbitmq-plugins enable rabbitmq_management)", exc
        )


@pytest.fixture
def rabbit_management() -> None:
    require_management(MGMT_URL)


def test_a_missing_management_plugin_skips_with_the_fix_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: the plugin is "off"
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="rabbitmq-plugins enable rabbitmq_management"):
        require_management(closed)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="management plugin"):
        require_management(closed)


def test_rabbitmq_topology_without_dlx_is_a_finding(
    amqp: Any, rabbit_broker: Any, rabbit_management: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rabbit_broker.management_url = MGMT_URL
    rabbit_broker.save()
    queue = _queue(amqp, 0, **{"x-max-length": 100})
    channel = make_channel(rabbit_broker, address=queue, dlq_address="orders.dlq")
    do_poll_broker(rabbit_broker.pk)
    health = ChannelHealth.objects.get(channel=channel)
    assert health.observed is not None and health.observed["kind"] == "classic"
    codes = {f["code"] for f in health.observed_findings}
    assert "observed.no-dead-letter-exchange" in codes
    assert "observed.overflow-drop-head" in codes  # a length limit dropping the oldest
    assert "observed.retry-budget-mismatch" not in codes  # classic queues have no limit


def test_rabbitmq_quorum_topology_findings(
    amqp: Any, rabbit_broker: Any, rabbit_management: None
) -> None:
    rabbit_broker.management_url = MGMT_URL
    rabbit_broker.save()
    name = _name("dlo-poll-q")
    amqp.queue_declare(
        name,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-delivery-limit": 3,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "orders.dlq",
        },
    )
    amqp.created.append(name)
    channel = make_channel(rabbit_broker, address=name, dlq_address="orders.dlq")
    do_poll_broker(rabbit_broker.pk)
    health = ChannelHealth.objects.get(channel=channel)
    codes = {f["code"] for f in health.observed_findings}
    assert codes == {
        "observed.retry-budget-mismatch",
        "observed.at-most-once-dead-lettering",
        "observed.dead-letter-missing",  # orders.dlq and orders.poison are not declared
    }
    mismatch = next(f for f in health.observed_findings if "retry" in f["code"])
    assert mismatch["message"] == (
        "The broker's delivery-limit is 3; the declared retry budget is 5."
    )


DOWN = {"rabbitmq": "amqp://guest:guest@127.0.0.1:1/%2F", "activemq": "stomp://127.0.0.1:1"}


@pytest.mark.parametrize("kind", sorted(DOWN))
def test_wrong_port_is_stale_never_ok_and_the_board_still_renders(
    monkeypatch: pytest.MonkeyPatch, viewer: Any, kind: str
) -> None:
    monkeypatch.setenv("DLO_BROKER_TEST_DEAD_URL", DOWN[kind])
    broker = make_broker(name="down", kind=kind, url_env="DLO_BROKER_TEST_DEAD_URL")
    channel = make_channel(broker, address="orders")
    ChannelHealth.objects.create(channel=channel, state=HealthState.OK, updated_at=timezone.now())

    outcome = do_poll_broker(broker.pk)

    assert outcome.status == "failed" and outcome.errors
    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.STALE
    assert health.evidence[0].startswith("down did not answer:")
    sample = ChannelSample.objects.get(channel=channel)
    assert sample.stale and sample.backlog is None and sample.error
    state = BrokerPollState.objects.get(pk=broker.pk)
    assert state.consecutive_failures == 1 and state.next_due_at > timezone.now()
    response = client_for(viewer).get("/")
    assert response.status_code == 200
    assert b'class="state state-stale">Stale<' in response.content
    assert b'class="state state-ok"' not in response.content


def test_unset_url_env_is_stale_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DLO_BROKER_TEST_UNSET_URL", raising=False)
    broker = make_broker(name="unset", url_env="DLO_BROKER_TEST_UNSET_URL")
    channel = make_channel(broker)
    assert do_poll_broker(broker.pk).status == "failed"
    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.STALE
    assert "DLO_BROKER_TEST_UNSET_URL is not set" in health.evidence[0]


def test_circuit_opens_after_repeated_failures_and_scheduler_skips(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DLO_BROKER_TEST_UNSET_URL", raising=False)
    broker = make_broker(name="unset", url_env="DLO_BROKER_TEST_UNSET_URL")
    make_channel(broker)
    for _ in range(3):
        assert do_poll_broker(broker.pk, force=True).status == "failed"
    state = BrokerPollState.objects.get(pk=broker.pk)
    assert state.consecutive_failures == 3
    assert state.circuit_open_until is not None and state.circuit_open_until > timezone.now()
    assert do_poll_broker(broker.pk).status == "circuit-open"
    assert due_brokers(timezone.now()) == []
    assert "3 failures in a row" in ChannelHealth.objects.get().evidence[0]


def test_overlapping_poll_is_skipped_and_counted(amqp: Any, rabbit_broker: Any) -> None:
    make_channel(rabbit_broker, address=_queue(amqp, 1))
    BrokerPollState.objects.create(
        broker=rabbit_broker, lease_until=timezone.now() + dt.timedelta(minutes=1), lease_token="x"
    )
    assert do_poll_broker(rabbit_broker.pk).status == "overrun"
    assert BrokerPollState.objects.get(pk=rabbit_broker.pk).overruns == 1
    assert not ChannelSample.objects.exists()


def test_scheduler_enqueues_due_broker_once(amqp: Any, rabbit_broker: Any) -> None:
    make_channel(rabbit_broker, address=_queue(amqp, 1))
    now = timezone.now()
    assert due_brokers(now) == [rabbit_broker.pk]
    assert due_brokers(now) == []  # claimed until its interval passes


def test_scheduler_for_one_broker_leaves_the_others_unclaimed() -> None:
    wanted, other = make_broker(name="wanted"), make_broker(name="other")
    now = timezone.now()
    assert due_brokers(now, name="wanted") == [wanted.pk]
    assert due_brokers(now) == [other.pk]


def test_poll_command_forever_polls_only_the_named_broker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from channels_registry import polling

    make_broker(name="wanted")
    asked: list[str | None] = []

    def due(now: Any, *, name: str | None = None, skip: Any = frozenset()) -> list[int]:
        asked.append(name)
        os.kill(os.getpid(), signal.SIGINT)  # the long-running form stops cleanly on SIGINT
        return []

    monkeypatch.setattr(polling, "due_brokers", due)
    call_command("poll", "--broker", "wanted")
    assert asked == ["wanted"]
    call_command("poll", "--broker", "nosuch")
    assert "No enabled broker named 'nosuch': nothing to poll." in capsys.readouterr().out
    assert asked == ["wanted"]


def test_prune_deletes_old_samples_and_rollups_in_batches(amqp: Any, rabbit_broker: Any) -> None:
    channel = make_channel(rabbit_broker, address=_queue(amqp, 1))
    old = timezone.now() - dt.timedelta(days=40)
    ChannelSample.objects.bulk_create(
        [ChannelSample(channel=channel, taken_at=old + dt.timedelta(seconds=i)) for i in range(7)]
    )
    ChannelRollup.objects.create(channel=channel, minute=old)
    do_poll_broker(rabbit_broker.pk)
    assert prune_samples(batch=3, max_batches=10) == (7, 1)
    assert ChannelSample.objects.count() == 1
    assert ChannelRollup.objects.count() == 1


def test_poll_command_prints_summary_and_fails_when_every_broker_fails(
    monkeypatch: pytest.MonkeyPatch,
    amqp: Any,
    rabbit_broker: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_channel(rabbit_broker, address=_queue(amqp, 3))
    call_command("poll", "--once")
    out = capsys.readouterr().out
    assert "rabbit: ok, 1 channel(s)" in out
    assert "total: 1 broker(s), 1 channel(s)" in out and "0 failed" in out

    rabbit_broker.url_env = "DLO_BROKER_TEST_UNSET_URL"
    rabbit_broker.save()
    monkeypatch.delenv("DLO_BROKER_TEST_UNSET_URL", raising=False)
    with pytest.raises(CommandError, match="every broker failed"):
        call_command("poll", "--once")
    assert "rabbit: failed" in capsys.readouterr().out


# --- ActiveMQ Classic (the statistics plugin over STOMP) ------------------------------------


@pytest.fixture
def activemq_broker(amq: Any) -> Any:
    return make_broker(
        name="activemq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_STOMP_URL"
    )


def _poll_until(broker: Any, channel: Any, done: Any) -> ChannelSample:
    """ActiveMQ's statistics are live and a consumer's prefetch is dispatched asynchronously:
    poll again, a bounded number of times, until ``done(sample)``."""
    sample = None
    for _ in range(40):
        outcome = do_poll_broker(broker.pk, force=True)
        assert outcome.status == "ok", outcome.errors
        sample = ChannelSample.objects.filter(channel=channel).latest("taken_at")
        if done(sample):
            break
        time.sleep(0.25)
    assert sample is not None
    return sample


def test_activemq_poll_samples_depth_in_flight_dlq_and_stopped(
    amq: Any, activemq_broker: Any
) -> None:
    queue = f"indiv.dlo-poll.{uuid.uuid4().hex[:10]}"
    for i in range(7):
        amq.send(queue, b"m%d" % i)
    for i in range(2):
        amq.send(f"DLQ.{queue}", b"dead %d" % i)
    channel = make_channel(
        activemq_broker, address=queue, dlq_address=f"DLQ.{queue}", poison_address=""
    )
    try:
        sample = _poll_until(activemq_broker, channel, lambda s: s.backlog == 7)
        assert (sample.backlog, sample.in_flight, sample.consumers) == (7, 0, 0)
        assert (sample.retained, sample.produced, sample.dlq_depth) == (7, 7, 2)
        assert sample.exists is True and sample.stale is False
        health = ChannelHealth.objects.get(channel=channel)
        assert health.state == HealthState.STOPPED
        assert health.evidence[0] == "7 messages waiting and no active consumer."
        assert DlqFlag.NONEMPTY in health.dlq_flags

        amq.conn.subscribe(
            f"/queue/{queue}", "hold", ack="client-individual",
            headers={"activemq.prefetchSize": "2"},
        )  # fmt: skip
        amq.wait(2)
        sample = _poll_until(activemq_broker, channel, lambda s: s.in_flight == 2)
        assert (sample.backlog, sample.in_flight, sample.consumers) == (5, 2, 1)
        assert ChannelHealth.objects.get(channel=channel).state != HealthState.STOPPED

        amq.conn.unsubscribe("hold")  # the two unacked messages go back to the queue
        sample = _poll_until(activemq_broker, channel, lambda s: s.consumers == 0)
        assert (sample.backlog, sample.in_flight, sample.consumers) == (7, 0, 0)
        assert sample.redelivered == 2
        assert ChannelHealth.objects.get(channel=channel).state == HealthState.STOPPED
    finally:
        _drain(queue, 7)
        _drain(f"DLQ.{queue}", 2)


def test_activemq_missing_queue_is_unknown_and_flagged_as_observed(
    amq: Any, activemq_broker: Any
) -> None:
    channel = make_channel(
        activemq_broker,
        address=f"dlo-missing.{uuid.uuid4().hex[:10]}",
        dlq_address="",
        poison_address="",
    )
    assert do_poll_broker(activemq_broker.pk).status == "ok"
    sample = ChannelSample.objects.get(channel=channel)
    assert sample.exists is False and sample.backlog is None
    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.UNKNOWN
    assert [f["code"] for f in health.observed_findings] == ["observed.address-missing"]


# --- Redis Streams ---------------------------------------------------------------------------


@pytest.fixture
def redis_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
    try:
        client.ping()
    except Exception as exc:
        broker_required("Redis", exc)
    keys: list[str] = []
    client.created = keys  # type: ignore[attr-defined]
    monkeypatch.setenv("DLO_BROKER_TEST_REDIS_URL", REDIS_URL)
    yield client
    if keys:
        client.delete(*keys)
    client.close()


def test_redis_poll_samples_lag_pending_and_dlq(redis_client: redis.Redis) -> None:
    stream, dlq = _name("dlo-poll"), _name("dlo-poll-dlq")
    redis_client.created.extend([stream, dlq])  # type: ignore[attr-defined]
    for i in range(5):
        redis_client.xadd(stream, {"n": i})
    redis_client.xgroup_create(stream, "workers", id="0")
    redis_client.xreadgroup("workers", "c1", {stream: ">"}, count=2)
    for i in range(4):
        redis_client.xadd(dlq, {"body": f"dead {i}", "reason": "boom"})
    broker = make_broker(name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_REDIS_URL")
    channel = make_channel(
        broker, address=stream, address_group="workers", dlq_address=dlq, poison_address=""
    )

    outcome = do_poll_broker(broker.pk)

    assert outcome.status == "ok", outcome.errors
    sample = ChannelSample.objects.get(channel=channel)
    assert (sample.backlog, sample.in_flight, sample.consumers) == (3, 2, 1)
    assert (sample.retained, sample.produced, sample.delivered, sample.acked) == (5, 5, 2, 0)
    assert sample.dlq_depth == 4  # no dlo-ingest group yet: the stream's length
    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.OK  # one sample: no trend yet
    assert DlqFlag.NONEMPTY in health.dlq_flags

    redis_client.xgroup_create(dlq, "dlo-ingest", id="0")
    redis_client.xreadgroup("dlo-ingest", "dlo", {dlq: ">"}, count=1)
    redis_client.xack(dlq, "dlo-ingest", redis_client.xrange(dlq, count=1)[0][0])
    do_poll_broker(broker.pk)
    latest = ChannelSample.objects.filter(channel=channel).latest("taken_at")
    assert latest.dlq_depth == 3  # what the dashboard has not ingested yet


# --- NATS JetStream --------------------------------------------------------------------------


def _nats(work: Any) -> Any:
    async def run() -> Any:
        nc = await nats.connect(NATS_URL, connect_timeout=2, allow_reconnect=False)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(run())


@pytest.fixture
def nats_stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    try:
        _nats(lambda js: js.account_info())
    except Exception as exc:
        broker_required("NATS JetStream", exc)
    name = "DLOPOLL_" + uuid.uuid4().hex[:10]
    monkeypatch.setenv("DLO_BROKER_TEST_NATS_URL", NATS_URL)
    yield name

    async def cleanup(js: Any) -> None:
        with contextlib.suppress(Exception):
            await js.delete_stream(name)

    _nats(cleanup)


def test_nats_poll_samples_pending_and_ack_pending(nats_stream: str) -> None:
    subject = nats_stream.lower()

    async def setup(js: Any) -> None:
        await js.add_stream(name=nats_stream, subjects=[f"{subject}.>"])
        await js.add_consumer(
            nats_stream,
            ConsumerConfig(
                durable_name="workers",
                ack_policy=AckPolicy.EXPLICIT,
                max_deliver=9,
                max_ack_pending=1000,
                ack_wait=300,
            ),
        )
        for i in range(6):
            await js.publish(f"{subject}.x", f"m{i}".encode())
        sub = await js.pull_subscribe_bind("workers", stream=nats_stream)
        await sub.fetch(2, timeout=2)

    _nats(setup)
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_NATS_URL")
    channel = make_channel(
        broker,
        address=nats_stream,
        address_group="workers",
        dlq_address="",
        poison_address="",
        max_in_flight=50,
    )

    outcome = do_poll_broker(broker.pk)

    assert outcome.status == "ok", outcome.errors
    sample = ChannelSample.objects.get(channel=channel)
    assert (sample.backlog, sample.in_flight, sample.retained) == (4, 2, 6)
    # acked unknown: JetStream's ack floor is not a count of acknowledgements (docs/health.md)
    assert (sample.delivered, sample.acked, sample.consumers) == (2, None, 1)
    health = ChannelHealth.objects.get(channel=channel)
    codes = {f["code"] for f in health.observed_findings}
    assert codes == {
        "observed.retry-budget-mismatch",
        "observed.in-flight-above-declared",
        "observed.ack-timeout-mismatch",  # ack_wait 300 s, declared 30 s
    }
    assert health.observed["ack_policy"] == "explicit"


def test_sample_rollup_and_health_row_keep_the_same_measurements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No broker needed: the adapter is a stand-in returning known stats for every field."""
    from brokers.base import Address, ChannelStats, PollResult
    from channels_registry import polling

    monkeypatch.setenv("DLO_BROKER_TEST_FAKE_URL", RABBIT_URL)
    broker = make_broker(name="fake", url_env="DLO_BROKER_TEST_FAKE_URL")
    channel = make_channel(broker, address="orders", dlq_address="orders.dlq", poison_address="")
    stats = {
        Address("orders"): ChannelStats(
            Address("orders"), **{name: i + 1 for i, name in enumerate(polling.STATS_FIELDS)}
        ),
        Address("orders.dlq"): ChannelStats(Address("orders.dlq"), retained=42),
    }

    class Adapter:
        def poll(self, addresses: Any) -> PollResult:
            return PollResult(stats, 1, 0.01)

        def inspect(self, addresses: Any) -> dict[Any, Any]:
            return {}

    monkeypatch.setattr(Broker, "adapter", lambda self, installation=None: Adapter())
    assert do_poll_broker(broker.pk).status == "ok"
    sample = ChannelSample.objects.get(channel=channel)
    expected = {name: i + 1 for i, name in enumerate(polling.STATS_FIELDS)}
    assert {name: getattr(sample, name) for name in polling.STATS_FIELDS} == expected
    assert sample.dlq_depth == 42 and sample.poison_depth is None
    rollup = ChannelRollup.objects.get(channel=channel)
    health = ChannelHealth.objects.get(channel=channel)
    for name in ("backlog", "in_flight", "consumers", "active_consumers", "dlq_depth"):
        assert getattr(rollup, name) == getattr(health, name) == getattr(sample, name), name
    assert rollup.poison_depth is None and health.poison_depth is None
    assert health.oldest_age_s == sample.oldest_message_age_s == expected["oldest_message_age_s"]


def test_rabbitmq_without_management_api_says_what_is_unknown_and_how_to_see_it(
    amqp: Any, rabbit_broker: Any, viewer: Any
) -> None:
    """Issue 22 item 2: over AMQP alone a busy queue is not IDLE and does not "match the
    declaration": in-flight and the DLQ's total are unknown, the state is UNKNOWN, and the
    page names the fix."""
    queue, dlq = _queue(amqp, 0), _queue(amqp, 2)
    channel = make_channel(rabbit_broker, address=queue, dlq_address=dlq, poison_address="")
    consumer_connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    consumer_connection.channel().basic_consume(queue, lambda *a: None, auto_ack=False)
    consumer_connection.process_data_events(time_limit=0.2)
    try:
        outcome = do_poll_broker(rabbit_broker.pk)
    finally:
        consumer_connection.close()

    assert outcome.status == "ok", outcome.errors
    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.UNKNOWN
    assert health.evidence[0].startswith("Traffic unknown")
    assert any("Enable the rabbitmq_management plugin" in e for e in health.evidence)
    assert (health.in_flight, health.dlq_depth, health.dlq_retained) == (None, 2, None)
    assert [f["code"] for f in health.observed_findings] == ["observed.unchecked"]
    page = client_for(viewer).get(f"/channels/{channel.slug}/").content.decode()
    assert "Polled over AMQP only (no management URL is declared)" in page
    assert "matches the declaration" not in page
    assert "on the broker, not yet ingested" in page and "on the broker in total" in page


def test_a_shared_activemq_dlq_says_its_depth_is_unknown_and_warns_from_a_page_of_letters() -> None:
    """On ActiveMQ's shared DLQ a channel's depth is unknown (with the fix); from ActiveMQ's
    page of 200 letters on, a selector may not reach the channel's own: the board says so."""
    from channels_registry.polling import shared_dlq_evidence

    below = shared_dlq_evidence("orders", 199)
    assert len(below) == 1 and below[0].startswith("DLQ depth unknown: ActiveMQ.DLQ is shared")
    assert "declare DLQ.orders" in below[0]
    assert shared_dlq_evidence("orders", None) == below  # the whole DLQ's size unknown too
    at = shared_dlq_evidence("orders", 1_200)
    assert at[0] == below[0]
    assert at[1].startswith("ActiveMQ.DLQ holds 1,200 dead letters: ActiveMQ pages 200")
