"""RabbitMQ adapter against the real broker on loopback (guest/guest, management + prometheus)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pika
import pytest

from brokers import get_adapter
from brokers.base import (
    Address,
    BrokerError,
    ChannelStats,
    DeadLetter,
    DrainSession,
    OutgoingMessage,
)
from brokers.rabbitmq import RabbitMQAdapter

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

AMQP_URL = os.environ.get("DLO_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
MGMT_URL = os.environ.get("DLO_TEST_RABBITMQ_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672")
PROM_URL = os.environ.get("DLO_TEST_RABBITMQ_PROMETHEUS_URL", "http://127.0.0.1:15692/metrics")
STATS_WAIT_S = 15.0  # management/prometheus stats refresh every collect_statistics_interval


@pytest.fixture(scope="module")
def rabbit_available() -> None:
    """Skip (or, under CI, fail) when RabbitMQ is not reachable on loopback."""
    try:
        RabbitMQAdapter(AMQP_URL, timeout=2.0).ping()
        httpx.get(f"{MGMT_URL}/api/overview", timeout=2.0).raise_for_status()
    except (BrokerError, httpx.HTTPError) as exc:
        message = f"RabbitMQ not reachable at {AMQP_URL} / management API: {exc}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def rabbit_api(rabbit_available: None) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{MGMT_URL}/api", timeout=10.0) as client:
        yield client


@pytest.fixture
def rabbit_conn(rabbit_available: None) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    yield connection
    if connection.is_open:
        connection.close()


@pytest.fixture
def rabbit_queue(
    rabbit_conn: pika.BlockingConnection, rabbit_api: httpx.Client
) -> Iterator[Callable[..., str]]:
    """Factory: declare a uniquely named durable queue; every one is deleted afterwards."""
    created: list[str] = []
    channel = rabbit_conn.channel()

    def make(prefix: str = "q", arguments: dict[str, Any] | None = None) -> str:
        name = f"dlo-test-{prefix}-{uuid.uuid4().hex[:12]}"
        channel.queue_declare(name, durable=True, arguments=arguments)
        created.append(name)
        return name

    yield make
    for name in created:
        rabbit_api.delete(f"/queues/%2F/{name}")


@pytest.fixture
def rabbit_policy(rabbit_api: httpx.Client) -> Iterator[Callable[[str, dict[str, Any]], None]]:
    created: list[str] = []

    def make(queue: str, definition: dict[str, Any]) -> None:
        name = f"dlo-test-policy-{uuid.uuid4().hex[:12]}"
        body = {"pattern": f"^{queue}$", "definition": definition, "apply-to": "queues"}
        rabbit_api.put(f"/policies/%2F/{name}", json=body).raise_for_status()
        created.append(name)

    yield make
    for name in created:
        rabbit_api.delete(f"/policies/%2F/{name}")


def rabbit_publish(
    conn: pika.BlockingConnection,
    queue: str,
    bodies: list[bytes],
    *,
    keep_open: bool = False,
    **props: Any,
) -> Any:
    """Publish confirmed; returns the channel when ``keep_open`` (the caller closes it)."""
    channel = conn.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2, **props))
    if keep_open:
        return channel
    channel.close()
    return None


def rabbit_dead_letter(conn: pika.BlockingConnection, source: str, count: int) -> None:
    """Reject ``count`` messages from ``source`` without requeue: the broker dead-letters them."""
    channel = conn.channel()
    for _ in range(count):
        method, _props, _body = channel.basic_get(source)
        assert method is not None, "source queue ran dry"
        channel.basic_reject(method.delivery_tag, requeue=False)
    channel.close()


def rabbit_fetch_all(session: DrainSession, count: int) -> list[DeadLetter]:
    """Fetch until ``count`` letters came back or a fetch comes back empty (a large body may
    still be on the wire when one fetch returns)."""
    letters: list[DeadLetter] = []
    while len(letters) < count:
        batch = session.fetch(count - len(letters), wait_s=5.0)
        if not batch:
            break
        letters.extend(batch)
    return letters


def wait_for_stats(
    adapter: RabbitMQAdapter, address: Address, expected: dict[str, Any]
) -> ChannelStats:
    """Poll until the sampled fields equal ``expected`` (stats lag by a refresh interval)."""
    deadline = time.monotonic() + STATS_WAIT_S
    while True:
        stats = adapter.poll([address]).stats[address]
        seen = {k: getattr(stats, k) for k in expected}
        if seen == expected or time.monotonic() > deadline:
            assert seen == expected
            return stats
        time.sleep(0.5)


def adapter_for(path: str, **options: Any) -> RabbitMQAdapter:
    management = {"prometheus": PROM_URL, "management": MGMT_URL, "passive": None}[path]
    adapter = get_adapter("rabbitmq", AMQP_URL, management_url=management, **options)
    assert isinstance(adapter, RabbitMQAdapter)
    return adapter


@pytest.mark.parametrize("path", ["prometheus", "management", "passive"])
def test_poll_reports_exact_ready_unacked_and_consumers(
    path: str, rabbit_queue: Callable[..., str], rabbit_conn: pika.BlockingConnection
) -> None:
    queue = rabbit_queue("poll")
    # The publishing channel stays open until the stats are read: the management plugin loses a
    # channel's publish counts when the channel closes before its next stats collection
    # (rabbitmq-management#353), and ``produced`` then never reaches 5.
    publisher = rabbit_publish(rabbit_conn, queue, [b"m%d" % i for i in range(5)], keep_open=True)
    consumer = rabbit_conn.channel()
    consumer.basic_qos(prefetch_count=2)
    consumer.basic_consume(queue, lambda *_: None, auto_ack=False)
    rabbit_conn.process_data_events(time_limit=0.5)
    address = Address(queue)

    if path == "passive":
        # declare-ok only carries the ready count and consumers: the rest is unknown, not 0.
        expected = {"exists": True, "backlog": 3, "consumers": 1, "in_flight": None}
    else:
        expected = {"exists": True, "backlog": 3, "in_flight": 2, "retained": 5, "consumers": 1}
    if path == "management":
        # message_stats (the positions) can arrive a refresh after the counts: wait for both.
        expected.update(produced=5, active_consumers=1)
    stats = wait_for_stats(adapter_for(path), address, expected)
    publisher.close()

    if path != "management":
        assert stats.produced is None
        assert stats.retained is None if path == "passive" else stats.retained == 5


@pytest.mark.parametrize("path", ["prometheus", "management"])
def test_poll_with_a_basic_get_poller_holding_messages_does_not_say_no_consumer(
    path: str, rabbit_queue: Callable[..., str], rabbit_conn: pika.BlockingConnection
) -> None:
    """A client polling with basic.get holds unacknowledged messages and is in no consumer
    count; RabbitMQ would have requeued them had its channel closed. The statistics' 0 is
    contradicted by their own unacknowledged count: unknown, not "no consumer" (the board
    called such a queue STOPPED)."""
    queue = rabbit_queue("poller")
    rabbit_publish(rabbit_conn, queue, [b"m%d" % i for i in range(4)])
    poller = rabbit_conn.channel()
    for _ in range(2):
        method, _props, _body = poller.basic_get(queue, auto_ack=False)
        assert method is not None
    stats = wait_for_stats(adapter_for(path), Address(queue), {"backlog": 2, "in_flight": 2})
    assert stats.consumers is None
    assert stats.active_consumers is None
    poller.close()  # the broker requeues both: now 0 is the truth again
    stats = wait_for_stats(adapter_for(path), Address(queue), {"backlog": 4, "in_flight": 0})
    assert stats.consumers == 0


@pytest.mark.parametrize("path", ["prometheus", "management", "passive"])
def test_poll_missing_queue_does_not_exist(path: str, rabbit_available: None) -> None:
    missing = Address(f"dlo-test-missing-{uuid.uuid4().hex}")
    result = adapter_for(path).poll([missing, missing])
    assert result.stats[missing].exists is False
    assert result.stats[missing].backlog is None
    assert result.round_trips >= 1


def test_poll_round_trips_do_not_grow_with_queue_count(rabbit_queue: Callable[..., str]) -> None:
    names = [rabbit_queue("many") for _ in range(30)]
    for path in ("prometheus", "management"):
        adapter = adapter_for(path)
        one = adapter.poll([Address(names[0])])
        many = adapter.poll([Address(n) for n in names])
        assert one.round_trips == many.round_trips == 1
        assert all(s.exists for s in many.stats.values())


@pytest.mark.parametrize(
    ("url", "management"),
    [
        ("amqp://guest:guest@127.0.0.1:1/%2F", None),
        ("amqp://guest:guest@127.0.0.1:1/%2F", "http://guest:guest@127.0.0.1:1"),
        ("amqp://guest:guest@127.0.0.1:1/%2F", "http://127.0.0.1:1/metrics"),
    ],
)
def test_unreachable_broker_is_a_transient_error(url: str, management: str | None) -> None:
    adapter = RabbitMQAdapter(url, management_url=management, timeout=1.0)
    with pytest.raises(BrokerError) as info:
        adapter.poll([Address("anything")])
    assert info.value.permanent is False


@pytest.mark.parametrize(
    "management", ["http://guest:guest@127.0.0.1:1", "http://127.0.0.1:1/metrics"]
)
def test_management_url_not_answering_falls_back_to_amqp_and_says_what_is_unknown(
    management: str, rabbit_available: None
) -> None:
    """The plugin disabled or the port closed is not an outage of the broker: the queues are
    read over AMQP, and ``limits`` names what that cannot see and how to get it."""
    adapter = RabbitMQAdapter(AMQP_URL, management_url=management, timeout=2.0)
    result = adapter.poll([Address(f"dlo-absent-{uuid.uuid4().hex[:8]}")])
    assert [s.exists for s in result.stats.values()] == [False]
    assert any("polled over AMQP instead" in e for e in result.errors)
    assert len(result.limits) == 1 and "Enable the rabbitmq_management plugin" in result.limits[0]
    assert "did not answer" in result.limits[0]


def test_unreachable_broker_ping_is_transient() -> None:
    with pytest.raises(BrokerError) as info:
        RabbitMQAdapter("amqp://guest:guest@127.0.0.1:1/%2F", timeout=1.0).ping()
    assert info.value.permanent is False


@pytest.mark.parametrize("management", [None, "http://127.0.0.1:15672"])
def test_bad_credentials_are_permanent(management: str | None, rabbit_available: None) -> None:
    adapter = RabbitMQAdapter(
        "amqp://guest:wrong-password@127.0.0.1:5672/%2F", management_url=management, timeout=3.0
    )
    with pytest.raises(BrokerError) as info:
        adapter.poll([Address("anything")])
    assert info.value.permanent is True


def test_unknown_vhost_is_permanent(rabbit_available: None) -> None:
    adapter = RabbitMQAdapter(f"amqp://guest:guest@127.0.0.1:5672/no-such-{uuid.uuid4().hex}")
    with pytest.raises(BrokerError) as info:
        adapter.ping()
    assert info.value.permanent is True


def test_malformed_url_is_permanent() -> None:
    with pytest.raises(BrokerError) as info:
        RabbitMQAdapter("http://127.0.0.1:5672/")
    assert info.value.permanent is True


def test_inspect_reads_queue_arguments(rabbit_queue: Callable[..., str]) -> None:
    quorum = rabbit_queue(
        "quorum",
        {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "dlx.x",
            "x-delivery-limit": 3,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        },
    )
    fallback = rabbit_queue(
        "quorum-drophead",
        {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "dlx.y",
            "x-dead-letter-strategy": "at-least-once",
        },
    )
    classic = rabbit_queue(
        "classic", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq.z"}
    )
    plain = rabbit_queue("plain")
    missing = Address(f"dlo-test-missing-{uuid.uuid4().hex}")

    topo = adapter_for("management").inspect(
        [Address(quorum), Address(fallback), Address(classic), Address(plain), missing]
    )

    q = topo[Address(quorum)]
    assert (q.kind, q.dead_letter_target, q.delivery_limit) == ("quorum", "dlx.x", 3)
    assert (q.dead_letter_strategy, q.overflow) == ("at-least-once", "reject-publish")
    assert q.raw["arguments"]["x-delivery-limit"] == 3
    # at-least-once without reject-publish: RabbitMQ falls back to at-most-once.
    assert topo[Address(fallback)].dead_letter_strategy == "at-most-once"
    c = topo[Address(classic)]
    assert (c.kind, c.dead_letter_target, c.dead_letter_strategy) == (
        "classic",
        "dlq.z",
        "at-most-once",
    )
    p = topo[Address(plain)]
    assert (p.dead_letter_target, p.dead_letter_strategy, p.overflow) == ("", None, "drop-head")
    assert topo[missing].exists is False


def test_inspect_reads_effective_policy(
    rabbit_queue: Callable[..., str], rabbit_policy: Callable[[str, dict[str, Any]], None]
) -> None:
    queue = rabbit_queue("policy", {"x-queue-type": "quorum"})
    rabbit_policy(
        queue,
        {
            "dead-letter-exchange": "dlx.policy",
            "delivery-limit": 5,
            "overflow": "reject-publish",
            "dead-letter-strategy": "at-least-once",
        },
    )
    adapter = adapter_for("management")
    deadline = time.monotonic() + STATS_WAIT_S
    while True:
        topo = adapter.inspect([Address(queue)])[Address(queue)]
        if topo.raw.get("policy") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert topo.raw["policy"], "policy never applied"
    assert (topo.dead_letter_target, topo.delivery_limit) == ("dlx.policy", 5)
    assert (topo.dead_letter_strategy, topo.overflow) == ("at-least-once", "reject-publish")
    assert topo.raw["effective_policy_definition"]["delivery-limit"] == 5


def test_inspect_without_management_reports_existence_only(
    rabbit_queue: Callable[..., str],
) -> None:
    queue = Address(rabbit_queue("bare", {"x-dead-letter-exchange": "dlx"}))
    missing = Address(f"dlo-test-missing-{uuid.uuid4().hex}")
    topo = adapter_for("passive").inspect([queue, missing])
    assert topo[queue].exists is True
    assert topo[queue].dead_letter_target is None
    assert topo[missing].exists is False


@pytest.fixture
def rabbit_dlq(rabbit_queue: Callable[..., str]) -> tuple[str, str]:
    """(source, dlq): a reject in ``source`` dead-letters into ``dlq`` via the default exchange."""
    dlq = rabbit_queue("dlq")
    source = rabbit_queue("src", {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    return source, dlq


def test_drain_parses_x_death_and_keeps_keys_stable(
    rabbit_dlq: tuple[str, str], rabbit_conn: pika.BlockingConnection
) -> None:
    source, dlq = rabbit_dlq
    before = time.time()
    rabbit_publish(
        rabbit_conn,
        source,
        [b"one", b"two", b"three"],
        message_id="mid-1",
        timestamp=1_700_000_000,
        headers={"idempotency-key": "k1", "tenant": b"acme"},
        content_type="application/json",
    )
    rabbit_dead_letter(rabbit_conn, source, 3)
    adapter = adapter_for("passive")

    with adapter.drain(Address(dlq)) as session:
        first = rabbit_fetch_all(session, 3)
    assert [letter.body for letter in first] == [b"one", b"two", b"three"]
    letter = first[0]
    assert letter.reason == "rejected"
    assert letter.first_death_queue == source
    assert letter.first_death_exchange == ""
    assert letter.redelivery_count == 1
    assert letter.first_death_at is not None and letter.first_death_at >= int(before)
    assert letter.dead_lettered_at == letter.first_death_at
    assert letter.death_history[0]["queue"] == source
    assert letter.death_history[0]["count"] == 1
    assert letter.headers["idempotency-key"] == "k1"
    assert letter.headers["tenant"] == "acme"
    assert letter.properties["message_id"] == "mid-1"
    assert letter.properties["timestamp"] == 1_700_000_000
    assert letter.properties["content_type"] == "application/json"
    assert letter.dedupe_key.startswith("rmq:")
    assert len({x.dedupe_key for x in first}) == 3

    # Closed without ack: everything comes back, with the same identities.
    with adapter.drain(Address(dlq)) as session:
        again = rabbit_fetch_all(session, 3)
        assert [x.dedupe_key for x in again] == [x.dedupe_key for x in first]
        session.ack(again)
    stats = adapter.poll([Address(dlq)]).stats[Address(dlq)]
    assert stats.backlog == 0


def test_drain_returns_empty_when_nothing_is_dead_lettered(
    rabbit_queue: Callable[..., str],
) -> None:
    with adapter_for("passive").drain(Address(rabbit_queue("empty"))) as session:
        assert session.fetch(10, wait_s=0.2) == []


def test_drain_acks_exactly_the_given_letters(
    rabbit_dlq: tuple[str, str], rabbit_conn: pika.BlockingConnection
) -> None:
    source, dlq = rabbit_dlq
    rabbit_publish(rabbit_conn, source, [b"a", b"b", b"c", b"d", b"e"])
    rabbit_dead_letter(rabbit_conn, source, 5)
    adapter = adapter_for("passive")
    with adapter.drain(Address(dlq)) as session:
        # A fetch returns what has arrived after waiting for the first: gather, bounded.
        letters = rabbit_fetch_all(session, 2)
        assert [x.body for x in letters] == [b"a", b"b"]
        session.ack(letters)  # a contiguous prefix
        more = rabbit_fetch_all(session, 3)
        assert [x.body for x in more] == [b"c", b"d", b"e"]
        session.ack([more[0], more[2]])  # not a prefix: "d" must stay
    with adapter.drain(Address(dlq)) as session:
        left = rabbit_fetch_all(session, 1)
        assert [x.body for x in left] == [b"d"]
        assert session.fetch(10, wait_s=0.2) == []


def test_drain_keeps_hostile_bodies_byte_identical(
    rabbit_dlq: tuple[str, str], rabbit_conn: pika.BlockingConnection
) -> None:
    source, dlq = rabbit_dlq
    bodies = [
        b"\xff\xfe not utf-8 \xc3\x28",
        b"nul\x00in\x00the\x00middle",
        os.urandom(1024 * 1024),
        b"",
    ]
    rabbit_publish(rabbit_conn, source, bodies, headers={"bin": b"\x00\xff"})
    rabbit_dead_letter(rabbit_conn, source, len(bodies))
    with adapter_for("passive").drain(Address(dlq)) as session:
        letters = rabbit_fetch_all(session, len(bodies))
        assert [x.body for x in letters] == bodies
        assert letters[0].headers["bin"] == {"$bytes": "00ff"}
        session.ack(letters)


def test_publisher_confirms_routed_messages_with_headers_as_given(
    rabbit_queue: Callable[..., str], rabbit_conn: pika.BlockingConnection
) -> None:
    queue = rabbit_queue("target")
    messages = [
        OutgoingMessage(
            f"k{i}", b"body-%d" % i, {"x-dlq-replay-id": "r1", "n": i}, {"message_id": f"m{i}"}
        )
        for i in range(50)
    ]
    with adapter_for("passive").publisher(Address(queue)) as publisher:
        outcomes = publisher.publish(messages)
    assert [(o.key, o.confirmed, o.reason) for o in outcomes] == [
        (m.key, True, "") for m in messages
    ]

    channel = rabbit_conn.channel()
    method, props, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None
    assert body == b"body-0"
    assert props.delivery_mode == 2
    assert props.message_id == "m0"
    assert props.headers == {"x-dlq-replay-id": "r1", "n": 0}


def test_publisher_reports_unroutable_without_raising(rabbit_available: None) -> None:
    missing = Address(f"dlo-test-missing-{uuid.uuid4().hex}")
    messages = [OutgoingMessage("a", b"x", {}), OutgoingMessage("b", b"y", {})]
    with adapter_for("passive").publisher(missing) as publisher:
        outcomes = publisher.publish(messages)
        assert [o.confirmed for o in outcomes] == [False, False]
        assert all(o.reason.startswith("unroutable") for o in outcomes)
        # The session stays usable after returns.
        assert [o.confirmed for o in publisher.publish(messages)] == [False, False]
