"""Poll faults found under real traffic (issue 22, item 6), against the real brokers: a missing
group or consumer is named precisely, a missing RabbitMQ queue is one log line, a missing
ActiveMQ queue none."""

# ruff: noqa: F811 - fixtures imported from the neighbouring modules
from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from channels_registry.actions import do_poll_broker
from channels_registry.models import BrokerKind, ChannelHealth, ChannelSample
from tests.channels_registry.test_poll import (  # noqa: F401 - fixtures
    _name,
    _nats,
    nats_stream,
    rabbit_broker,
    redis_client,
)
from tests.conftest import make_broker, make_channel

pytestmark = [pytest.mark.broker, pytest.mark.django_db]


def test_redis_stream_without_the_declared_group_says_so(redis_client: redis.Redis) -> None:
    stream = _name("dlo-nogroup")
    redis_client.created.append(stream)  # type: ignore[attr-defined]
    redis_client.xadd(stream, {"n": 1})
    redis_client.xgroup_create(stream, "someone-else", id="0")
    broker = make_broker(name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_REDIS_URL")
    channel = make_channel(broker, address=stream, address_group="workers<b>", dlq_address="")

    do_poll_broker(broker.pk)

    sample = ChannelSample.objects.get(channel=channel)
    assert sample.exists is False
    assert sample.error == f"stream '{stream}' exists but has no consumer group 'workers<b>'"
    evidence = ChannelHealth.objects.get(channel=channel).evidence
    assert evidence[0] == (f"Stream '{stream}' exists but has no consumer group 'workers<b>'.")
    assert not any("does not exist" in line for line in evidence)


def test_nats_stream_without_the_declared_consumer_says_so(nats_stream: str) -> None:
    _nats(lambda js: js.add_stream(name=nats_stream, subjects=[f"{nats_stream.lower()}.>"]))
    broker = make_broker(name="nats", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_NATS_URL")
    channel = make_channel(broker, address=nats_stream, address_group="workers", dlq_address="")

    do_poll_broker(broker.pk)

    evidence = ChannelHealth.objects.get(channel=channel).evidence
    assert evidence[0] == f"Stream '{nats_stream}' exists but has no consumer 'workers'."


def test_polling_a_missing_rabbitmq_queue_logs_one_line(
    amqp: Any, rabbit_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = _name("dlo-missing")
    make_channel(rabbit_broker, address=queue, dlq_address="", poison_address="")
    caplog.set_level(logging.INFO)

    do_poll_broker(rabbit_broker.pk)  # the first poll also inspects: two passive declares

    pika_lines = [r for r in caplog.records if r.name.startswith("pika")]
    ours = [r for r in caplog.records if queue in r.getMessage()]
    assert pika_lines == []
    assert [r.name for r in ours] == ["brokers.rabbitmq"]


def test_long_running_poll_keeps_a_healthy_broker_on_time_behind_a_hung_one(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A broker that accepts connections and never answers holds its call until the timeout;
    meanwhile the healthy broker is polled each time it falls due, not once per round."""
    import socket

    from channels_registry.polling import PollScheduler

    settings.DLO_BROKER_TIMEOUT_S = 60.0  # the hung call outlives the whole test
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel accepts; nobody ever answers
    scheduler = PollScheduler(tick_s=0.2)
    try:
        _race(silent, scheduler, redis_client, monkeypatch)
    finally:
        silent.close()  # the hung call ends at once (connection reset), so the thread does too
        scheduler.close()


def _race(silent: Any, scheduler: Any, redis_client: redis.Redis, monkeypatch: Any) -> None:
    import datetime as dt

    from django.utils import timezone

    from channels_registry.models import BrokerPollState

    monkeypatch.setenv("DLO_BROKER_TEST_HUNG_URL", f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
    hung = make_broker(name="hung", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_HUNG_URL")
    make_channel(hung, slug="on-hung", address="s", address_group="g", dlq_address="")
    healthy = make_broker(
        name="healthy", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_REDIS_URL"
    )
    stream = _name("dlo-sched")
    redis_client.created.append(stream)  # type: ignore[attr-defined]
    redis_client.xadd(stream, {"n": 1})
    redis_client.xgroup_create(stream, "g", id="0")
    make_channel(healthy, slug="on-healthy", address=stream, address_group="g", dlq_address="")
    outcomes: list[str] = []
    for round_ in range(3):
        # Due now (the interval elapsing, without waiting for it in a test).
        BrokerPollState.objects.filter(pk=healthy.pk).update(
            next_due_at=timezone.now() - dt.timedelta(seconds=1)
        )
        for _ in range(200):  # bounded: the healthy poll returns in milliseconds
            scheduler.step(lambda o: outcomes.append(o.broker))
            if outcomes.count("healthy") > round_:
                break
    assert outcomes == ["healthy", "healthy", "healthy"]
    assert set(scheduler.running.values()) == {hung.pk}  # still waiting out its timeout


def test_polling_a_missing_activemq_queue_logs_nothing_from_stomp(
    amq: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing queue is the statistics plugin's empty answer: no error, no wait, and none
    of stomp.py's per-connection chatter in the poller's log (one connection per poll)."""
    import uuid

    broker = make_broker(
        name="activemq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_STOMP_URL"
    )
    queue = f"dlo-missing.{uuid.uuid4().hex[:10]}"
    channel = make_channel(broker, address=queue, dlq_address="", poison_address="")
    caplog.set_level(logging.INFO)

    assert do_poll_broker(broker.pk).status == "ok"  # the first poll also inspects

    assert ChannelSample.objects.get(channel=channel).exists is False
    assert [r for r in caplog.records if r.name.startswith("stomp")] == []
