"""ActiveMQ Classic adapter against the real broker on loopback (tests/activemq/start.sh: STOMP
61613, the statistics plugin, queues ``indiv.>`` with their own ``DLQ.<queue>``).

The application side is a plain stomp.py client, as a JMS-style consumer over STOMP runs: it
gives a message back by closing its subscription without acking (ActiveMQ redelivers it, marked
``redelivered``), counts the deliveries itself (STOMP has no broker-side redelivery policy) and,
past its budget, NACKs: ActiveMQ dead-letters a NACKed message at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp

from brokers import get_adapter
from brokers.activemq import ActiveMQAdapter, _stats_map, escape_name
from brokers.base import Address, BrokerError, ChannelStats, DeadLetter, OutgoingMessage
from tests.conftest import broker_required

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

STOMP_URL = os.environ.get("DLO_TEST_ACTIVEMQ_URL", "stomp://127.0.0.1:61613")
HOST, PORT = "127.0.0.1", 61613

HOSTILE_BODIES = [
    b"\xff\xfe not utf-8 \xc3\x28",
    b"nul\x00in\x00the\x00middle\x00",
    b"FRAME\ndestination:/queue/x\n\n\x00",  # a STOMP frame inside a body
    os.urandom(256 * 1024),
    b"",
]
HOSTILE_HEADERS = {
    "tenant": "acme",
    "multi-line": "a\nb\r\nc",
    "colon:name": "x:y",
    "back\\slash": "\\n not a newline",
    "unicode": "ünïcødé ✓",
    "Idempotency-Key": "order-42",
}


def adapter(**options: Any) -> ActiveMQAdapter:
    built = get_adapter("activemq", STOMP_URL, timeout=options.pop("timeout", 5.0), **options)
    assert isinstance(built, ActiveMQAdapter)
    return built


def require_activemq(url: str = STOMP_URL) -> None:
    """Every ActiveMQ test's check: skip when the broker does not answer on ``url``, naming
    how to start it; fail under ``CI=true``, where it must be up."""
    try:
        ActiveMQAdapter(url, timeout=3.0).ping()
    except BrokerError as exc:
        broker_required(f"ActiveMQ (STOMP on {url}; tests/activemq/start.sh)", exc)


@pytest.fixture(scope="module")
def activemq() -> None:
    require_activemq()


def test_without_activemq_its_tests_skip_with_how_to_start_it_and_fail_in_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on: the broker is "absent"
        sock.bind(("127.0.0.1", 0))
        closed = f"stomp://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="tests/activemq/start.sh"):
        require_activemq(closed)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="ActiveMQ .* is not reachable"):
        require_activemq(closed)


def unique(prefix: str = "q") -> str:
    return f"activemq.test.{prefix}.{uuid.uuid4().hex[:10]}"


class App(stomp.ConnectionListener):
    """A STOMP application client: produces, and consumes with client-individual acks."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.receipts: set[str] = set()
        self.cond = threading.Condition()
        self.conn = stomp.Connection12([(HOST, PORT)], auto_decode=False, timeout=5)
        self.conn.set_listener("app", self)
        self.conn.connect(wait=True)

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.frames.append(frame)
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def send(self, queue: str, body: bytes, **headers: str) -> None:
        """Persistent, with a receipt waited for (the broker has it when this returns)."""
        receipt = uuid.uuid4().hex
        headers = {escape_name(k): v for k, v in headers.items()}
        headers = {"persistent": "true", **headers, "receipt": receipt}
        if "amq-msg-type" not in headers:
            headers["content-length"] = str(len(body))
        self.conn.send(f"/queue/{queue}", body, headers=headers)
        with self.cond:
            assert self.cond.wait_for(lambda: receipt in self.receipts, 10.0)

    def wait(self, count: int, timeout: float = 10.0) -> list[Any]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.frames) >= count, timeout)
            taken, self.frames = self.frames[:count], self.frames[count:]
        assert len(taken) == count, f"got {len(taken)} of {count} messages"
        return taken

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.disconnect()
        self.conn.transport.disconnect_socket()


@pytest.fixture
def app(activemq: None) -> Iterator[App]:
    client = App()
    try:
        yield client
    finally:
        client.close()


def roll_back_until_dead(app: App, queue: str, *, budget: int = 3) -> int:
    """A consumer whose processing always fails: each failure closes the subscription without
    an ack (ActiveMQ redelivers, ``redelivered: true``); after ``budget`` deliveries it NACKs
    and ActiveMQ dead-letters the message. Returns the deliveries seen."""
    deliveries = 0
    for attempt in range(budget):
        sub = f"roll-{attempt}"
        app.conn.subscribe(f"/queue/{queue}", sub, ack="client-individual")
        frame = app.wait(1)[0]
        deliveries += 1
        assert (frame.headers.get("redelivered") == "true") == (attempt > 0)
        if attempt == budget - 1:
            app.conn.nack(frame.headers["ack"], receipt=f"nack-{attempt}")
        app.conn.unsubscribe(sub)
    return deliveries


def drain_all(session: Any, count: int) -> list[DeadLetter]:
    """Fetch until ``count`` letters came back or a fetch comes back empty."""
    letters: list[DeadLetter] = []
    while len(letters) < count:
        batch = session.fetch(count - len(letters), wait_s=3.0)
        if not batch:
            break
        letters.extend(batch)
    return letters


def wait_stats(queue: str, expected: dict[str, Any]) -> ChannelStats:
    """The statistics are live; a consumer's prefetch may still be on its way: bounded."""
    address = Address(queue)
    deadline = time.monotonic() + 10.0
    while True:
        stats = adapter().poll([address]).stats[address]
        seen = {k: getattr(stats, k) for k in expected}
        if seen == expected or time.monotonic() > deadline:
            assert seen == expected
            return stats
        time.sleep(0.2)


# -- health --------------------------------------------------------------------------------


def test_poll_reads_depth_in_flight_consumers_and_counters(app: App) -> None:
    queue = unique("poll")
    for n in range(5):
        app.send(queue, b"m%d" % n)
    app.conn.subscribe(
        f"/queue/{queue}", "hold", ack="client-individual", headers={"activemq.prefetchSize": "2"}
    )
    app.wait(2)
    stats = wait_stats(
        queue,
        {"exists": True, "backlog": 3, "in_flight": 2, "retained": 5, "consumers": 1},
    )
    assert (stats.produced, stats.delivered, stats.acked, stats.redelivered) == (5, 2, 0, 0)
    assert stats.oldest_message_age_s is not None and stats.oldest_message_age_s >= 0
    app.conn.unsubscribe("hold")  # given back: counted as redelivered, none acked
    stats = wait_stats(queue, {"backlog": 5, "in_flight": 0, "consumers": 0})
    assert stats.redelivered == 2
    with adapter().drain(Address(queue)) as session:  # leave nothing behind
        session.ack(drain_all(session, 5))


def test_poll_missing_queue_is_missing_and_an_absent_dlq_holds_none(activemq: None) -> None:
    missing, dlq = Address(unique("missing")), Address(f"DLQ.{unique('never')}")
    result = adapter().poll([missing, missing, dlq])
    assert result.stats[missing].exists is False
    assert result.stats[missing].backlog is None
    # ActiveMQ creates a DLQ with its first dead letter: before that it holds none.
    assert (result.stats[dlq].exists, result.stats[dlq].retained) == (True, 0)
    assert result.errors == [] and result.limits == []


def test_poll_of_one_origins_share_is_unknown_beside_the_whole_queues_size(app: App) -> None:
    """One channel's share of a shared DLQ (``Address.group``): no statistic counts it, so its
    numbers are unknown; the whole queue's size comes beside them (a private queue stands in
    for ActiveMQ.DLQ, which other tests share)."""
    queue = unique("shared")
    for n in range(3):
        app.send(queue, b"m%d" % n)
    wait_stats(queue, {"retained": 3})
    share, whole = Address(queue, group="some.origin"), Address(queue)
    result = adapter().poll([share, whole])
    assert (result.stats[share].exists, result.stats[share].retained) == (True, None)
    assert result.stats[share].backlog is None
    assert result.stats[share].shared_total == 3
    assert (result.stats[whole].retained, result.stats[whole].shared_total) == (3, None)
    with adapter().drain(Address(queue)) as session:  # leave nothing behind
        session.ack(drain_all(session, 3))


def test_poll_round_trips_do_not_grow_with_queue_count(activemq: None) -> None:
    names = [Address(unique("many")) for _ in range(30)]
    one, many = adapter().poll(names[:1]), adapter().poll(names)
    assert one.round_trips == many.round_trips == 2


@pytest.mark.parametrize(
    ("url", "permanent"),
    [("stomp://127.0.0.1:1", False), ("http://127.0.0.1:61613", True), ("stomp://", True)],
)
def test_unreachable_is_transient_and_a_bad_url_permanent(url: str, permanent: bool) -> None:
    with pytest.raises(BrokerError) as info:
        ActiveMQAdapter(url, timeout=1.0).poll([Address("anything")])
    assert info.value.permanent is permanent
    assert info.value.connection_lost is not permanent


def test_statistics_answers_are_parsed_from_xstream_json() -> None:
    body = (
        b'{"map":{"entry":[{"string":"size","long":3},{"string":["brokerName","dlo"]},'
        b'{"string":"averageEnqueueTime","double":1.5}]}}'
    )
    assert _stats_map(body) == {"size": 3, "brokerName": "dlo", "averageEnqueueTime": 1.5}
    assert _stats_map(b'{"map":{"entry":{"string":"size","long":0}}}') == {"size": 0}
    assert _stats_map(b'{"map":""}') == {}
    assert _stats_map(b"<map/>") is None


def test_inspect_says_what_stomp_cannot_read(app: App) -> None:
    queue = unique("inspect")
    app.send(queue, b"x")
    topo = adapter().inspect([Address(queue)])[Address(queue)]
    assert (topo.exists, topo.kind, topo.delivery_limit, topo.dead_letter_target) == (
        True,
        "activemq-queue",
        None,
        None,
    )
    notes = " ".join(topo.raw["notes"])
    assert "client's connection factory" in notes and "ActiveMQ.DLQ" in notes
    assert topo.raw["statistics"]["size"] == 1
    retries = adapter().retries(Address(queue))
    assert retries.count is None and "RedeliveryPolicy" in retries.notes[0]
    with adapter().drain(Address(queue)) as session:
        session.ack(drain_all(session, 1))


# -- dead letters, replay --------------------------------------------------------------------


def test_rolled_back_message_dead_letters_is_drained_replayed_and_consumed_intact(
    app: App,
) -> None:
    """The real-client proof: a consumer that rolls back until the message dead-letters
    (shared ActiveMQ.DLQ), the drain, a confirmed replay, and the message consumed intact."""
    queue = unique("proof")
    body = b"\x00\xff order 42 \x00"
    app.send(queue, body, **HOSTILE_HEADERS, **{"correlation-id": "corr-42", "type": "Order"})
    assert roll_back_until_dead(app, queue, budget=3) == 3
    wait_stats(queue, {"retained": 0})

    with adapter().drain(Address("ActiveMQ.DLQ")) as session:
        letters = drain_all(session, 50)
        mine = [x for x in letters if x.first_death_queue == queue]
        assert len(mine) == 1, [x.first_death_queue for x in letters]
        letter = mine[0]
        assert letter.body == body
        for name, value in HOSTILE_HEADERS.items():
            assert letter.headers[name] == value
        assert letter.properties["correlation_id"] == "corr-42"
        assert letter.properties["type"] == "Order"
        assert letter.properties["persistent"] is True
        assert letter.properties["body_type"] == "bytes"
        assert letter.dedupe_key == f"amq:ActiveMQ.DLQ:{letter.broker_id}"
        session.ack([letter])  # the others' letters go back when the session closes

    from dlq.plans.relay_publish import replay_headers

    message = OutgoingMessage(
        "k1", letter.body, replay_headers(letter.headers, "replay-1"), letter.properties
    )
    with adapter().publisher(Address(queue)) as publisher:
        [outcome] = publisher.publish([message])
    assert outcome.confirmed, outcome

    app.conn.subscribe(f"/queue/{queue}", "after", ack="client-individual")
    frame = app.wait(1)[0]
    app.conn.ack(frame.headers["ack"], receipt="done")
    assert frame.body == body
    for name, value in HOSTILE_HEADERS.items():
        assert frame.headers[name] == value
    assert frame.headers["x-dlq-replay-id"] == "replay-1"
    assert frame.headers["correlation-id"] == "corr-42"
    assert frame.headers["message-id"] != letter.broker_id  # a new message, a new identity


def test_individual_dlq_keeps_keys_stable_acks_exactly_and_bodies_byte_exact(app: App) -> None:
    queue = f"indiv.{unique('dlq')}"
    dlq = Address(f"DLQ.{queue}")
    for n, body in enumerate(HOSTILE_BODIES):
        app.send(queue, body, n=str(n))
    app.conn.subscribe(f"/queue/{queue}", "fail", ack="client-individual")
    for frame in app.wait(len(HOSTILE_BODIES)):
        app.conn.nack(frame.headers["ack"])
    app.conn.unsubscribe("fail")
    wait_stats(dlq.name, {"retained": len(HOSTILE_BODIES)})

    with adapter().drain(dlq) as session:
        first = drain_all(session, len(HOSTILE_BODIES))
    assert [x.body for x in first] == HOSTILE_BODIES
    assert {x.first_death_queue for x in first} == {queue}
    assert len({x.dedupe_key for x in first}) == len(HOSTILE_BODIES)

    # Closed without ack: everything comes back, with the same identities.
    with adapter().drain(dlq) as session:
        again = drain_all(session, len(HOSTILE_BODIES))
        assert [x.dedupe_key for x in again] == [x.dedupe_key for x in first]
        session.ack([again[0], again[2]])
    with adapter().drain(dlq) as session:
        left = drain_all(session, 3)
        assert [x.body for x in left] == [HOSTILE_BODIES[i] for i in (1, 3, 4)]
        assert session.fetch(10, wait_s=0.3) == []
        # Replayed byte-exact, bytes and (empty) bodies alike, then consumed.
        target = unique("replayed")
        messages = [OutgoingMessage(x.dedupe_key, x.body, x.headers, x.properties) for x in left]
        with adapter().publisher(Address(target)) as publisher:
            assert all(o.confirmed for o in publisher.publish(messages))
        session.ack(left)
    app.conn.subscribe(f"/queue/{target}", "replayed", ack="auto")
    assert [f.body for f in app.wait(3)] == [HOSTILE_BODIES[i] for i in (1, 3, 4)]
    assert wait_stats(dlq.name, {"retained": 0}).retained == 0


def test_text_messages_stay_text_and_byte_exact(app: App) -> None:
    queue, target = f"indiv.{unique('text')}", unique("text-replayed")
    text = "plain text, ünïcødé, no length".encode()
    app.send(queue, text, **{"amq-msg-type": "text"})
    app.conn.subscribe(f"/queue/{queue}", "fail", ack="client-individual")
    app.conn.nack(app.wait(1)[0].headers["ack"])
    app.conn.unsubscribe("fail")
    with adapter().drain(Address(f"DLQ.{queue}")) as session:
        [letter] = drain_all(session, 1)
        assert letter.properties["body_type"] == "text"
        with adapter().publisher(Address(target)) as publisher:
            [outcome] = publisher.publish([OutgoingMessage("t", text, {}, letter.properties)])
        assert outcome.confirmed
        session.ack([letter])
    app.conn.subscribe(f"/queue/{target}", "text", ack="auto")
    frame = app.wait(1)[0]
    assert frame.body == text
    assert frame.headers.get("amq-msg-type") == "text"


def test_publisher_confirms_a_pipelined_batch_and_reports_a_lost_broker(app: App) -> None:
    queue = unique("batch")
    messages = [OutgoingMessage(f"k{i}", b"b%d" % i, {"n": i}, {}) for i in range(300)]
    with adapter().publisher(Address(queue)) as publisher:
        outcomes = publisher.publish(messages)
    assert [(o.key, o.confirmed) for o in outcomes] == [(m.key, True) for m in messages]
    assert wait_stats(queue, {"retained": 300}).produced == 300
    drained: list[DeadLetter] = []
    with adapter().drain(Address(queue)) as session:
        # ActiveMQ pages 200 messages of a queue in at a time (maxPageSize): unacked ones
        # hold the page, so a drain acks each batch before it fetches more, as ingest does.
        for _ in range(10):
            batch = drain_all(session, 300 - len(drained))
            session.ack(batch)
            drained.extend(batch)
            if not batch or len(drained) == 300:
                break
    assert [x.body for x in drained] == [m.body for m in messages]
    with pytest.raises(BrokerError) as info:
        ActiveMQAdapter("stomp://127.0.0.1:1", timeout=1.0).open_publisher(Address(queue))
    assert info.value.connection_lost is True


def test_declared_vs_observed_flags_the_shared_dlq_and_the_client_side_budget() -> None:
    from types import SimpleNamespace

    from channels_registry.observed import compare

    channel = SimpleNamespace(
        address="orders",
        address_display="orders",
        dlq_address="ActiveMQ.DLQ",
        retry_max_attempts=5,
        semantic="at-least-once",
        ordering="",
        max_in_flight=None,
        ack_timeout_s=None,
        retention_s=None,
        broker=SimpleNamespace(kind="activemq"),
    )
    topology = {"exists": True, "kind": "activemq-queue", "raw": {}}
    codes = {f["code"] for f in compare(channel, topology)}
    assert {
        "observed.shared-dlq",
        "observed.redelivery-client-side",
        "observed.non-persistent-not-dead-lettered",
    } <= codes
    channel.dlq_address = "DLQ.orders"
    assert "observed.shared-dlq" not in {f["code"] for f in compare(channel, topology)}


# -- a real JMS client -----------------------------------------------------------------------

JMS_SOURCE = Path(__file__).resolve().parents[1] / "activemq" / "JmsClient.java"
JMS_JARS = [
    f"/usr/share/java/{jar}.jar"
    for jar in (
        "activemq-client",
        "geronimo-jms_1.1_spec",
        "geronimo-j2ee-management-1.1-spec",
        "hawtbuf",
        "slf4j-api",
    )
]


def jms(*args: str) -> str:
    """Run tests/activemq/JmsClient.java (ActiveMQ's own JMS client over OpenWire)."""
    if shutil.which("java") is None or not all(Path(j).exists() for j in JMS_JARS):
        broker_required("a Java runtime and ActiveMQ's client jars", FileNotFoundError("java"))
    done = subprocess.run(
        ["java", "-Xmx64m", "-cp", ":".join(JMS_JARS), str(JMS_SOURCE), *args],
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout.decode()


def test_a_jms_consumer_that_rolls_back_is_dead_lettered_triaged_replayed_and_consumed(
    activemq: None,
) -> None:
    """The issue's real-client proof with a real JMS client: a transacted consumer rolls back
    until its RedeliveryPolicy (2 redeliveries) gives up; the client's poison ack dead-letters
    the message with dlqDeliveryFailureCause, which quotes that policy; the adapter drains it,
    replays it, and the JMS consumer gets the same TextMessage with its properties."""
    queue = f"indiv.{unique('jms')}"
    jms("produce", queue, "héllo jms ✓", "order-7")
    assert "deliveries=3" in jms("rollback", queue, "2")

    with adapter().drain(Address(f"DLQ.{queue}")) as session:
        [letter] = drain_all(session, 1)
        assert letter.body == "héllo jms ✓".encode()
        assert letter.first_death_queue == queue
        assert letter.properties["body_type"] == "text"
        assert letter.properties["correlation_id"] == "jms-corr-1"
        assert letter.properties["type"] == "OrderPlaced"
        assert letter.headers["Idempotency-Key"] == "order-7"
        assert "exceeds redelivery policy limit" in letter.headers["dlqDeliveryFailureCause"]
        assert (letter.reason, letter.error_class, letter.redelivery_count) == (
            "delivery-limit",
            "java.lang.Throwable",
            3,
        )
        policy = letter.death_history[0]["redelivery_policy"]
        assert policy["maximumRedeliveries"] == 2
        assert policy["useExponentialBackOff"] is False

        from dlq.plans.relay_publish import replay_headers

        message = OutgoingMessage(
            "jms", letter.body, replay_headers(letter.headers, "r-jms"), letter.properties
        )
        with adapter().publisher(Address(queue)) as publisher:
            assert publisher.publish([message])[0].confirmed
        session.ack([letter])

    seen = jms("consume", queue)
    assert "type=text" in seen
    assert "text=héllo jms ✓" in seen
    assert "property.Idempotency-Key=order-7" in seen
    assert "property.x-dlq-replay-id=r-jms" in seen
    assert "correlation=jms-corr-1" in seen and "jmstype=OrderPlaced" in seen
    assert "dlqDeliveryFailureCause" not in seen  # the old death's bookkeeping is not replayed
    assert "property.attempt=1" in seen  # an int property comes back as text over STOMP


# -- a broker without the statistics plugin --------------------------------------------------

START = Path(__file__).resolve().parents[1] / "activemq" / "start.sh"


@pytest.fixture(scope="module")
def plain_activemq(activemq: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second, short-lived ActiveMQ (128 MB heap) with this repository's configuration minus
    the statistics plugin, on free ports: a deployment that never enabled it."""
    import re
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    work = tmp_path_factory.mktemp("plain-activemq")
    config = (START.parent / "activemq.xml").read_text()
    (work / "activemq.xml").write_text(re.sub(r"<plugins>.*?</plugins>", "", config, flags=re.S))
    env = {
        **os.environ,
        "DLO_ACTIVEMQ_DATA": str(work / "data"),
        "DLO_ACTIVEMQ_CONFIG": str(work / "activemq.xml"),
        "DLO_ACTIVEMQ_STOMP_PORT": str(ports[0]),
        "DLO_ACTIVEMQ_OPENWIRE_PORT": str(ports[1]),
        "DLO_ACTIVEMQ_HEAP": "128M",
    }
    started = subprocess.run([str(START)], env=env, capture_output=True, timeout=120, check=False)
    try:
        assert started.returncode == 0, started.stderr.decode()[-2000:]
        yield f"stomp://127.0.0.1:{ports[0]}"
    finally:
        subprocess.run([str(START), "stop"], env=env, capture_output=True, timeout=60, check=False)


def test_without_the_statistics_plugin_every_number_is_unknown_with_the_fix(
    plain_activemq: str,
) -> None:
    plain = ActiveMQAdapter(plain_activemq, timeout=2.0)
    plain.ping()
    queue = Address(unique("plain"))
    with plain.publisher(queue) as publisher:
        assert publisher.publish([OutgoingMessage("k", b"x", {})])[0].confirmed
    result = plain.poll([queue, Address("ActiveMQ.DLQ")])
    for stats in result.stats.values():
        assert stats.exists is True  # not known to be missing either
        assert (stats.backlog, stats.in_flight, stats.retained, stats.consumers) == (None,) * 4
        assert (stats.produced, stats.acked, stats.redelivered) == (None,) * 3
    assert len(result.limits) == 1 and "<statisticsBrokerPlugin/>" in result.limits[0]
    assert plain.inspect([queue])[queue].kind is None  # nothing read, nothing claimed


@pytest.mark.django_db
def test_without_the_statistics_plugin_the_channel_says_what_is_unknown_and_the_fix(
    plain_activemq: str, viewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The board's side of the test above (as RabbitMQ without its management API): numbers
    unknown, never 0, the state UNKNOWN, and the page names the fix, not another broker's."""
    from channels_registry.actions import do_poll_broker
    from channels_registry.health import HealthState
    from channels_registry.models import BrokerKind, ChannelHealth
    from tests.conftest import client_for, make_broker, make_channel

    monkeypatch.setenv("DLO_BROKER_TEST_PLAIN_STOMP", plain_activemq)
    broker = make_broker(
        name="plain", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_PLAIN_STOMP"
    )
    queue = unique("plain-page")
    channel = make_channel(broker, address=queue, dlq_address=f"DLQ.{queue}", poison_address="")

    outcome = do_poll_broker(broker.pk)

    assert outcome.status == "ok", outcome.errors
    health = ChannelHealth.objects.get(channel=channel)
    assert health.state == HealthState.UNKNOWN
    assert (health.backlog, health.in_flight, health.consumers, health.dlq_depth) == (None,) * 4
    assert any("<statisticsBrokerPlugin/>" in line for line in health.evidence)
    [unchecked] = health.observed_findings
    assert unchecked["code"] == "observed.unchecked"
    assert "statisticsBrokerPlugin" in unchecked["fix"]
    page = client_for(viewer).get(channel.get_absolute_url()).content.decode()
    assert "&lt;statisticsBrokerPlugin/&gt;" in page
    assert "matches the declaration" not in page


def test_the_hostile_corpus_round_trips_and_an_oversized_frame_is_refused_not_an_outage(
    activemq: None,
) -> None:
    from tests.dlq.hostile import BODIES, HOSTILE_HEADERS, HOSTILE_NAME

    few = dict(list(HOSTILE_HEADERS.items())[:8])
    few[HOSTILE_NAME] = HOSTILE_NAME
    queue = Address(unique("hostile"))
    messages = [OutgoingMessage(name, body, few, {}) for name, body in BODIES.items()]
    oversized = OutgoingMessage("all-headers", b"x", HOSTILE_HEADERS, {})  # 10,004 headers
    with adapter().publisher(queue) as publisher:
        outcomes = publisher.publish([messages[0], oversized, *messages[1:]])
        refused = outcomes.pop(1)
        assert (refused.confirmed, refused.refused, refused.permanent) == (False, True, True)
        assert not refused.connection_lost and "too many headers" in refused.reason
        assert all(o.confirmed for o in outcomes)
        assert publisher.publish(messages[:1])[0].confirmed  # the session is still good
    drained: list[DeadLetter] = []
    with adapter().drain(queue) as session:
        for _ in range(5):
            batch = drain_all(session, len(BODIES) + 1 - len(drained))
            session.ack(batch)
            drained.extend(batch)
            if not batch or len(drained) == len(BODIES) + 1:
                break
    assert [x.body for x in drained] == [*BODIES.values(), BODIES["script"]]
    for letter in drained:
        assert {k: letter.headers[k] for k in few} == few
