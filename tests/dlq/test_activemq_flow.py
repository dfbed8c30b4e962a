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


def _channel(queue: str, dlq: str = "") -> Any:
    broker = make_broker(name="amq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_ACTIVEMQ")
    return make_channel(
        broker,
        slug="amq-orders",
        address=queue,
        dlq_address=dlq or f"DLQ.{queue}",
        poison_address="",
    )


#: (queue prefix, declared DLQ): the test broker gives ``indiv.>`` queues a DLQ of their own;
#: the others share ActiveMQ.DLQ, drained for the channel's queue alone.
LAYOUTS = {"individual": ("indiv.", ""), "shared": ("", "ActiveMQ.DLQ")}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ingest_replay_and_second_death_on_activemq(app: App, oncall: User, layout: str) -> None:
    prefix, dlq = LAYOUTS[layout]
    queue = f"{prefix}activemq.flow.{uuid.uuid4().hex[:8]}"
    bodies = [b'{"order": 1}', *HOSTILE_BODIES[:3]]
    for n, body in enumerate(bodies):
        app.send(queue, body, **HOSTILE_HEADERS, n=str(n), **{"correlation-id": f"c{n}"})
    _dead_letter_all(app, queue, len(bodies), "first")
    channel = _channel(queue, dlq)

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
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.REPLAYED}
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


def test_a_shared_activemq_dlq_gives_each_channel_exactly_its_own_dead_letters(
    app: App,
) -> None:
    """Two channels declare the shared ActiveMQ.DLQ (their queues have no DLQ of their own):
    each ingests exactly the letters of its own queue, selected by their original destination;
    a queue no channel declares keeps its letters in the DLQ; a batch stored but not acked (a
    crash before the ack) comes back and is not stored twice; the per-channel depth is unknown,
    never the whole DLQ's."""
    from brokers.activemq import SHARED_DLQ, shared_dlq_address
    from channels_registry.models import ChannelHealth
    from channels_registry.polling import do_poll_broker
    from dlq.capture.ingest import store_batch
    from dlq.models import Source

    tag = uuid.uuid4().hex[:8]
    # Not indiv.>: the test broker dead-letters these into the shared ActiveMQ.DLQ.
    queue_a, queue_b, stray = (f"activemq.shared.{n}.{tag}" for n in ("a", "b", "stray"))
    counts = {queue_a: 3, queue_b: 2, stray: 2}
    for queue, count in counts.items():
        for n in range(count):
            app.send(queue, f"{queue} #{n}".encode(), **{"Idempotency-Key": f"{queue}-{n}"})
        _dead_letter_all(app, queue, count, f"dead-{queue}")
    broker = make_broker(name="amq", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_ACTIVEMQ")
    shared = {"dlq_address": SHARED_DLQ, "poison_address": ""}
    channel_a = make_channel(broker, slug="amq-a", address=queue_a, **shared)
    channel_b = make_channel(broker, slug="amq-b", address=queue_b, **shared)
    assert "dlq-shared-by-channels" in {f["code"] for f in channel_b.findings}

    # A's first batch is stored, then the drain closes before its ack (a crash).
    address_a = shared_dlq_address(SHARED_DLQ, queue_a)
    adapter = ActiveMQAdapter(URL, timeout=5.0)
    with adapter.drain(address_a) as session:
        first: list[Any] = []
        for _ in range(10):
            first += session.fetch(counts[queue_a], 2.0)
            if len(first) >= counts[queue_a]:
                break
        assert {letter.first_death_queue for letter in first} == {queue_a}
        assert store_batch(channel_a, first, Source.DLQ, address_a) == (len(first), 0)

    do_poll_broker(broker.pk, force=True)
    health = ChannelHealth.objects.get(channel=channel_a)
    assert health.dlq_depth is None and health.dlq_retained is None  # unknown, not the DLQ's
    assert any(e.startswith("DLQ depth unknown: ActiveMQ.DLQ is shared") for e in health.evidence)

    result_b = do_ingest_channel(channel_b.pk)
    result_a = do_ingest_channel(channel_a.pk)
    assert (result_b.inserted, result_b.duplicates, result_b.errors) == (2, 0, [])
    assert (result_a.inserted, result_a.duplicates, result_a.errors) == (
        counts[queue_a] - len(first),
        len(first),
        [],
    )
    for channel, queue in ((channel_a, queue_a), (channel_b, queue_b)):
        entries = DeadLetter.objects.filter(channel=channel)
        assert sorted(bytes(e.body) for e in entries) == [
            f"{queue} #{n}".encode() for n in range(counts[queue])
        ]
        assert {e.first_death_queue for e in entries} == {queue}
        assert do_ingest_channel(channel.pk).fetched == 0  # acked: nothing comes back
    assert DeadLetter.objects.count() == counts[queue_a] + counts[queue_b]

    # The stray queue's letters were neither taken nor lost: still in the shared DLQ.
    with adapter.drain(shared_dlq_address(SHARED_DLQ, stray)) as session:
        left: list[Any] = []
        for _ in range(10):
            left += session.fetch(5, 2.0)
            if len(left) >= counts[stray]:
                break
        assert sorted(letter.body for letter in left) == [
            f"{stray} #{n}".encode() for n in range(counts[stray])
        ]
        session.ack(left)  # cleaned up: the shared DLQ is the broker's, not this test's
