"""ActiveMQ Classic through the dashboard's own code paths: a consumer that gives up NACKs its
messages into ``DLQ.<queue>``; ingest stores them attributed to their origin with their JMS
headers; a replay plan sends them back, confirmed by receipts, and they are consumed intact;
a replay that dies again is a second death linked to its parent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from brokers.activemq import ActiveMQAdapter
from brokers.base import BrokerError
from channels_registry.models import BrokerKind
from dlq.capture.ingest import do_ingest_channel
from dlq.models import DeadLetter, PlanStatus, Status
from dlq.plans import relay, relay_outcomes
from tests.brokers.test_activemq import HOSTILE_BODIES, HOSTILE_HEADERS, App
from tests.conftest import broker_required, make_broker, make_channel
from tests.dlq.replay_helpers import plan_for

pytestmark = [pytest.mark.broker, pytest.mark.django_db, pytest.mark.timeout(120)]

URL = "stomp://127.0.0.1:61613"


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    try:
        ActiveMQAdapter(URL, timeout=3.0).ping()
    except BrokerError as exc:
        broker_required("ActiveMQ (tests/activemq/start.sh)", exc)
    monkeypatch.setenv("DLO_BROKER_TEST_ACTIVEMQ", URL)
    monkeypatch.setattr(relay_outcomes, "backoff", lambda attempt: 0.0)
    client = App()
    try:
        yield client
    finally:
        client.close()


def _dead_letter_all(app: App, queue: str, count: int, sub: str) -> None:
    app.conn.subscribe(f"/queue/{queue}", sub, ack="client-individual")
    for frame in app.wait(count):
        app.conn.nack(frame.headers["ack"])
    app.conn.unsubscribe(sub)


def _channel(queue: str) -> Any:
    broker = make_broker(name="amq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_ACTIVEMQ")
    return make_channel(
        broker, slug="amq-orders", address=queue, dlq_address=f"DLQ.{queue}", poison_address=""
    )


def test_ingest_replay_and_second_death_on_activemq(app: App, oncall: User) -> None:
    queue = f"indiv.activemq.flow.{uuid.uuid4().hex[:8]}"
    bodies = [b'{"order": 1}', *HOSTILE_BODIES[:3]]
    for n, body in enumerate(bodies):
        app.send(queue, body, **HOSTILE_HEADERS, n=str(n), **{"correlation-id": f"c{n}"})
    _dead_letter_all(app, queue, len(bodies), "first")
    channel = _channel(queue)

    result = do_ingest_channel(channel.pk)
    assert (result.inserted, result.errors) == (len(bodies), [])
    assert do_ingest_channel(channel.pk).inserted == 0  # acked: nothing comes back
    entries = list(DeadLetter.objects.order_by("pk"))
    assert [bytes(e.body) for e in entries] == bodies
    assert {e.first_death_queue for e in entries} == {queue}
    assert all(e.headers["Idempotency-Key"] == "order-42" for e in entries)
    assert all(e.idempotency_key == "order-42" for e in entries)
    assert [e.properties["correlation_id"] for e in entries] == [f"c{n}" for n in range(4)]

    plan = plan_for(entries, oncall)
    done = relay.run_plan(plan.pk)
    assert (done.status, done.confirmed) == (PlanStatus.DONE, len(bodies))
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {Status.REPLAYED}
    app.conn.subscribe(f"/queue/{queue}", "replayed", ack="client-individual")
    frames = app.wait(len(bodies))
    assert sorted(f.body for f in frames) == sorted(bodies)
    for frame in frames:
        assert frame.headers["x-dlq-replay-id"]
        assert frame.headers["colon:name"] == HOSTILE_HEADERS["colon:name"]
        assert frame.headers["multi-line"] == HOSTILE_HEADERS["multi-line"]
        app.conn.nack(frame.headers["ack"])  # it fails again: a second death
    app.conn.unsubscribe("replayed")

    assert do_ingest_channel(channel.pk).inserted == len(bodies)
    children = DeadLetter.objects.exclude(pk__in=[e.pk for e in entries])
    assert {c.parent_id for c in children} == {e.pk for e in entries}
    assert {c.generation for c in children} == {1}
