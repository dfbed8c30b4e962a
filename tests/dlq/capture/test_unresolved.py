"""Stored dead letters awaiting triage count beside the broker's own DLQ depth (issue 15.1):
ingest empties the broker's DLQ, so the board must not read "DLQ 0" while entries wait."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from django.contrib.auth.models import User

from channels_registry.actions import do_poll_broker
from channels_registry.health import DlqFlag
from channels_registry.models import BrokerKind, ChannelHealth
from tests.conftest import broker_required, client_for, make_broker, make_channel
from tests.dlq.conftest import letter, store

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

pytestmark = [pytest.mark.broker, pytest.mark.django_db]


@pytest.fixture
def queues(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    try:
        connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    except Exception as exc:
        broker_required("RabbitMQ", exc)
    amqp = connection.channel()
    name = f"dlo-unresolved-{uuid.uuid4().hex[:10]}"
    amqp.queue_declare(name)
    amqp.queue_declare(f"{name}.dlq")
    monkeypatch.setenv("DLO_BROKER_TEST_RABBIT_URL", RABBIT_URL)
    yield name
    for queue in (name, f"{name}.dlq"):
        with contextlib.suppress(Exception):
            amqp.queue_delete(queue)
    connection.close()


def test_ingested_entries_awaiting_triage_flag_the_dlq_until_resolved(
    queues: str, viewer: User, oncall: User
) -> None:
    broker = make_broker(
        name="rabbit", kind=BrokerKind.RABBITMQ, url_env="DLO_BROKER_TEST_RABBIT_URL"
    )
    channel = make_channel(broker, address=queues, dlq_address=f"{queues}.dlq", alert_dlq_depth=3)
    entries = store(channel, *[letter() for _ in range(4)])

    assert do_poll_broker(broker.pk).status == "ok"
    health = ChannelHealth.objects.get(channel=channel)
    assert (health.dlq_depth, health.dlq_unresolved) == (0, 4)  # broker empty, 4 stored
    assert DlqFlag.NONEMPTY in health.dlq_flags
    assert any("4 stored awaiting triage" in e for e in health.evidence)
    page = client_for(viewer).get(f"/channels/{channel.slug}/").content.decode()
    assert 'id="dlq-unresolved"' in page and "4 stored, awaiting triage" in page

    ids = ",".join(str(e.pk) for e in entries)
    client_for(oncall).post(
        "/dead-letters/discard/", {"id": ids, "action_reason": "fixed", "request_key": "u1"}
    )
    do_poll_broker(broker.pk)
    health.refresh_from_db()
    assert (health.dlq_depth, health.dlq_unresolved) == (0, 0)
    assert DlqFlag.NONEMPTY not in health.dlq_flags


def test_a_channel_without_dead_letter_addresses_counts_nothing(queues: str) -> None:
    broker = make_broker(
        name="rabbit", kind=BrokerKind.RABBITMQ, url_env="DLO_BROKER_TEST_RABBIT_URL"
    )
    channel: Any = make_channel(
        broker, address=queues, dlq_address="", poison_address="", dlq_strategies=[]
    )
    do_poll_broker(broker.pk)
    assert ChannelHealth.objects.get(channel=channel).dlq_unresolved is None
