"""NatsJetStreamAdapter against the real NATS (JetStream) on loopback.

Each test creates uniquely named streams and consumers and deletes them; DLO_ADVISORIES (the
dashboard-owned advisory stream) is left in place, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import httpx
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig

from brokers.base import (
    Address,
    BrokerError,
    ChannelStats,
    DeadLetter,
    DrainSession,
    OutgoingMessage,
)
from brokers.nats_jetstream import ADVISORY_STREAM, NatsJetStreamAdapter

URL = os.environ.get("DLO_TEST_NATS_URL", "nats://127.0.0.1:4222")
T = TypeVar("T")

pytestmark = pytest.mark.broker


def _with_nats(work: Callable[[NATS], Awaitable[T]]) -> T:
    async def run() -> T:
        nc = await nats.connect(URL, connect_timeout=2, allow_reconnect=False)
        try:
            return await work(nc)
        finally:
            await nc.close()

    return asyncio.run(run())


@pytest.fixture
def nats_streams() -> Iterator[list[str]]:
    """Unique stream names; every one is deleted afterwards (with its consumers)."""
    try:
        _with_nats(lambda nc: nc.jetstream().account_info())
    except Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"NATS JetStream not reachable at {URL}: {exc!r}")
        pytest.skip(f"NATS JetStream not reachable at {URL}: {exc!r}")
    names: list[str] = []
    yield names

    async def cleanup(nc: NATS) -> None:
        js = nc.jetstream()
        for name in names:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(name)
        with contextlib.suppress(nats.js.errors.NotFoundError):
            # our drain consumers on DLO_ADVISORIES for these streams
            for consumer in await js.consumers_info(ADVISORY_STREAM):
                if any(f"_{n}_" in consumer.name for n in names):
                    await js.delete_consumer(ADVISORY_STREAM, consumer.name)

    _with_nats(cleanup)


def _stream(names: list[str]) -> tuple[str, str]:
    """Create a stream ``DLOT_<hex>`` on ``dlot.<hex>.>``; return (name, subject prefix)."""
    token = uuid.uuid4().hex[:12]
    name, prefix = f"DLOT_{token}", f"dlot.{token}"
    names.append(name)

    async def create(nc: NATS) -> None:
        await nc.jetstream().add_stream(name=name, subjects=[f"{prefix}.>"])

    _with_nats(create)
    return name, prefix


@pytest.fixture
def adapter() -> NatsJetStreamAdapter:
    nats_adapter = NatsJetStreamAdapter(URL, timeout=2.0)
    # A pull still open when a session closes can hold a message until ack_wait; keep that
    # short here so "closed without ack: they come back" is observed within the test.
    nats_adapter.drain_ack_wait_s = 3.0
    return nats_adapter


def test_poll_samples_consumer_state_exactly(
    adapter: NatsJetStreamAdapter, nats_streams: list[str]
) -> None:
    stream, prefix = _stream(nats_streams)

    async def setup(nc: NATS) -> None:
        js = nc.jetstream()
        # Only four messages exist while m2 is nak'd, so its redelivery is the only candidate.
        for i in range(4):
            await js.publish(f"{prefix}.a", f"m{i}".encode())
        await js.add_consumer(
            stream, ConsumerConfig(durable_name="work", ack_policy=AckPolicy.EXPLICIT)
        )
        sub = await js.pull_subscribe_bind("work", stream)
        msgs = await sub.fetch(4, timeout=2)
        assert len(msgs) == 4
        await msgs[0].ack_sync()
        await msgs[1].ack_sync()
        await msgs[2].nak()
        await nc.flush()
        redelivered = await sub.fetch(1, timeout=2)  # m2 again: counted as redelivered
        assert redelivered[0].metadata.num_delivered == 2
        for i in range(4, 10):
            await js.publish(f"{prefix}.a", f"m{i}".encode())

    _with_nats(setup)
    address = Address(stream, "work")
    result = adapter.poll([address, Address(stream)])

    sample = result.stats[address]
    assert sample.exists is True
    assert sample.backlog == 6
    assert sample.in_flight == 2
    assert sample.redelivered == 1
    assert sample.retained == 10
    assert sample.produced == 10
    assert sample.delivered == 4
    # The ack floor (2) is not a count of acks: a message waiting for a retry holds it.
    assert sample.acked is None
    assert sample.consumers == 1  # a pull consumer that delivered just now has a client
    assert sample.oldest_unacked_age_s is None
    stream_only = result.stats[Address(stream)]
    assert stream_only.retained == 10
    assert stream_only.oldest_message_age_s is not None
    assert result.errors == []


def test_poll_round_trips_grow_with_streams_not_consumers(
    adapter: NatsJetStreamAdapter, nats_streams: list[str]
) -> None:
    stream, _prefix = _stream(nats_streams)

    async def setup(nc: NATS) -> None:
        for i in range(20):
            await nc.jetstream().add_consumer(
                stream, ConsumerConfig(durable_name=f"c{i}", ack_policy=AckPolicy.EXPLICIT)
            )

    _with_nats(setup)
    addresses = [Address(stream, f"c{i}") for i in range(20)]

    result = adapter.poll(addresses)

    assert all(s.exists and s.backlog == 0 for s in result.stats.values())
    listing = result.round_trips - 1  # minus the consumer list of our stream
    assert 1 <= listing <= 1 + adapter.max_pages  # stream-list pages only


def test_missing_stream_or_consumer_is_not_there(
    adapter: NatsJetStreamAdapter, nats_streams: list[str]
) -> None:
    stream, _prefix = _stream(nats_streams)
    missing_stream = Address(f"DLOT_absent_{uuid.uuid4().hex[:8]}", "c")
    missing_consumer = Address(stream, "nobody")

    result = adapter.poll([missing_stream, missing_consumer])
    topology = adapter.inspect([missing_stream, missing_consumer])

    assert result.stats[missing_stream].exists is False
    assert result.stats[missing_consumer].exists is False
    assert result.stats[missing_consumer].backlog is None
    assert topology[missing_stream].exists is False
    assert topology[missing_consumer].exists is False


def test_inspect_reports_consumer_limits(
    adapter: NatsJetStreamAdapter, nats_streams: list[str]
) -> None:
    stream, _prefix = _stream(nats_streams)

    async def setup(nc: NATS) -> None:
        await nc.jetstream().add_consumer(
            stream,
            ConsumerConfig(
                durable_name="limited",
                ack_policy=AckPolicy.EXPLICIT,
                max_deliver=5,
                max_ack_pending=50,
            ),
        )

    _with_nats(setup)
    topology = adapter.inspect([Address(stream, "limited")])[Address(stream, "limited")]

    assert topology.exists is True
    assert topology.kind == "jetstream"
    assert topology.ack_policy == "explicit"
    assert topology.delivery_limit == 5
    assert topology.max_ack_pending == 50
    assert topology.dead_letter_target == ""
    assert topology.overflow == "drop-head"
    assert topology.raw["consumer"]["max_deliver"] == 5
    assert topology.raw["stream"]["name"] == stream


def test_unreachable_port_is_a_transient_broker_error() -> None:
    started = time.monotonic()
    with pytest.raises(BrokerError) as caught:
        NatsJetStreamAdapter("nats://127.0.0.1:1", timeout=2.0).poll([Address("S", "c")])
    assert caught.value.permanent is False
    assert time.monotonic() - started < 10  # bounded by the timeout, not hanging


def test_malformed_url_is_a_permanent_broker_error() -> None:
    with pytest.raises(BrokerError) as caught:
        NatsJetStreamAdapter("http://127.0.0.1:4222").ping()
    assert caught.value.permanent is True


HOSTILE = [b"\xff\xfe not utf-8", b"nul\x00inside", os.urandom(1024 * 1024 - 4096)]


def _dead_letter(stream: str, prefix: str) -> None:
    """Publish HOSTILE; m0 and m1 exceed max_deliver=2 (nak twice), m2 is terminated."""

    async def work(nc: NATS) -> None:
        js = nc.jetstream()
        for i, body in enumerate(HOSTILE):
            await js.publish(f"{prefix}.a", body, headers={"idem": f"key-{i}", "bin": "x"})
        await js.add_consumer(
            stream,
            ConsumerConfig(durable_name="app", ack_policy=AckPolicy.EXPLICIT, max_deliver=2),
        )
        sub = await js.pull_subscribe_bind("app", stream)
        for _ in range(5):  # m0, m1, m2, then m0 and m1 redelivered
            for msg in await sub.fetch(1, timeout=2):
                if msg.data == HOSTILE[2]:
                    await msg.term()
                else:
                    await msg.nak()
        # On 2.9 the MAX_DELIVERIES advisory fires when the server next tries to deliver.
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=1)
        await nc.flush()

    _with_nats(work)


def test_drain_reads_advisories_with_original_bytes_and_stable_keys(
    adapter: NatsJetStreamAdapter, nats_streams: list[str]
) -> None:
    stream, prefix = _stream(nats_streams)
    address = Address(stream, "app")
    adapter.prepare_drain(address)
    adapter.prepare_drain(address)  # idempotent
    _dead_letter(stream, prefix)

    def fetch_three(session: DrainSession) -> list[DeadLetter]:
        # Two advisory consumers answer separately: a bounded number of fetches gathers both.
        letters: list[DeadLetter] = []
        for _ in range(6):
            letters += session.fetch(max_batch=10, wait_s=2.0)
            if len(letters) >= 3:
                break
        return letters

    with adapter.drain(address) as session:
        first = fetch_three(session)
    with adapter.drain(address) as session:  # closed without ack: they come back
        again = fetch_three(session)
        session.ack(again)
    with adapter.drain(address) as session:
        after_ack = session.fetch(max_batch=10, wait_s=0.5)

    by_seq = {letter.properties["stream_seq"]: letter for letter in first}
    assert sorted(by_seq) == [1, 2, 3]
    # One death = one advisory: the key names the stored message and the advisory's id.
    for seq, letter in by_seq.items():
        assert letter.dedupe_key.startswith(f"nats:{stream}:{seq}:app:")
        assert letter.dedupe_key.endswith(str(letter.properties["advisory_id"]))
    assert sorted(letter.dedupe_key for letter in again) == sorted(x.dedupe_key for x in first)
    assert after_ack == []
    for seq, body in enumerate(HOSTILE, start=1):
        letter = by_seq[seq]
        assert letter.body == body
        assert letter.headers["idem"] == f"key-{seq - 1}"
        assert letter.dead_lettered_at is not None
    assert by_seq[1].reason == "max_deliveries"
    assert by_seq[1].redelivery_count == 2
    assert by_seq[3].reason is not None
    assert by_seq[3].reason.startswith("terminated")
    assert by_seq[3].redelivery_count == 1


def test_drain_reports_originals_gone_from_retention(
    adapter: NatsJetStreamAdapter, nats_streams: list[str]
) -> None:
    stream, prefix = _stream(nats_streams)
    address = Address(stream, "app")
    adapter.prepare_drain(address)
    _dead_letter(stream, prefix)
    _with_nats(lambda nc: nc.jetstream().purge_stream(stream))

    with adapter.drain(address) as session:
        letters = session.fetch(max_batch=10, wait_s=2.0)
        session.ack(letters)

    assert letters
    assert all(letter.body == b"" for letter in letters)
    assert all("no longer retained" in (letter.reason or "") for letter in letters)


def test_publisher_confirms_with_dedup_and_reports_no_responders(
    adapter: NatsJetStreamAdapter, nats_streams: list[str]
) -> None:
    stream, prefix = _stream(nats_streams)
    messages = [
        OutgoingMessage(key=f"k{i}", body=body, headers={"x-dlq-replay-id": f"r{i}"})
        for i, body in enumerate(HOSTILE)
    ]

    with adapter.publisher(Address(f"{prefix}.replay")) as publisher:
        outcomes = publisher.publish(messages)
        duplicate = publisher.publish(messages[:1])
    with adapter.publisher(Address(f"nobody.listens.{uuid.uuid4().hex}")) as publisher:
        orphan = publisher.publish([OutgoingMessage(key="o", body=b"x", headers={})])

    assert [(o.key, o.confirmed) for o in outcomes] == [("k0", True), ("k1", True), ("k2", True)]
    assert duplicate[0].confirmed is True and "duplicate" in duplicate[0].reason
    assert orphan[0].confirmed is False and "no responders" in orphan[0].reason

    async def read_back(nc: NATS) -> list[Any]:
        js = nc.jetstream()
        return [await js.get_msg(stream, seq) for seq in (1, 2, 3)]

    stored = _with_nats(read_back)
    assert [m.data for m in stored] == HOSTILE
    assert stored[0].headers["Nats-Msg-Id"] == "r0"
    assert _with_nats(lambda nc: nc.jetstream().stream_info(stream)).state.messages == 3


# --- the monitoring endpoint (/jsz) on a private server with a monitoring port --------------

NATS_SERVER = os.environ.get("DLO_NATS_SERVER_BIN", "/usr/sbin/nats-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclasses.dataclass
class PrivateNats:
    url: str
    monitor: str


@pytest.fixture(scope="module")
def private_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateNats]:
    """A nats-server of our own with JetStream and a monitoring port, stopped after the module."""
    if not (os.path.isfile(NATS_SERVER) and os.access(NATS_SERVER, os.X_OK)):
        message = f"nats-server binary not found at {NATS_SERVER} (set DLO_NATS_SERVER_BIN)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    port, monitor_port = _free_port(), _free_port()
    store = tmp_path_factory.mktemp("nats-jsz")
    log = (store / "server.log").open("wb")
    process = subprocess.Popen(
        [NATS_SERVER, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port)]
        + ["-m", str(monitor_port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    monitor = f"http://127.0.0.1:{monitor_port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                pytest.fail(f"nats-server exited with {process.returncode}; see {store}")
            try:
                if httpx.get(f"{monitor}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"nats-server did not become healthy within 15 s; see {store}")
            time.sleep(0.05)
        yield PrivateNats(url=f"nats://127.0.0.1:{port}", monitor=monitor)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _on(url: str, work: Callable[[NATS], Awaitable[T]]) -> T:
    async def run() -> T:
        nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
        try:
            return await work(nc)
        finally:
            await nc.close()

    return asyncio.run(run())


def _adapters(server: PrivateNats) -> tuple[NatsJetStreamAdapter, NatsJetStreamAdapter]:
    """(the JetStream API path, the /jsz path) on the same server."""
    return (
        NatsJetStreamAdapter(server.url, timeout=2.0),
        NatsJetStreamAdapter(server.url, management_url=server.monitor, timeout=2.0),
    )


def _comparable(sample: ChannelStats) -> dict[str, Any]:
    data = sample.as_dict()
    del data["observed_at"]
    data.pop("oldest_message_age_s")  # now - first_ts: differs by the time between the polls
    return data


def test_jsz_samples_equal_the_api_samples(private_nats: PrivateNats) -> None:
    token = uuid.uuid4().hex[:8]
    stream, prefix = f"JSZ_{token}", f"jsz.{token}"

    async def setup(nc: NATS) -> None:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{prefix}.>"])
        for i in range(4):
            await js.publish(f"{prefix}.a", f"m{i}".encode())
        await js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name="work",
                ack_policy=AckPolicy.EXPLICIT,
                max_deliver=5,
                max_ack_pending=50,
            ),
        )
        await js.add_consumer(
            stream, ConsumerConfig(durable_name="idle", ack_policy=AckPolicy.EXPLICIT)
        )
        sub = await js.pull_subscribe_bind("work", stream)
        msgs = await sub.fetch(4, timeout=2)
        await msgs[0].ack_sync()
        await msgs[1].ack_sync()
        await msgs[2].nak()
        await nc.flush()
        assert (await sub.fetch(1, timeout=2))[0].metadata.num_delivered == 2
        for i in range(4, 10):
            await js.publish(f"{prefix}.a", f"m{i}".encode())

    _on(private_nats.url, setup)
    api, jsz = _adapters(private_nats)
    addresses = [
        Address(stream, "work"),
        Address(stream, "idle"),
        Address(stream),
        Address(stream, "nobody"),
        Address(f"JSZ_absent_{token}", "work"),
        Address(f"JSZ_absent_{token}"),
    ]

    by_api, by_jsz = api.poll(addresses), jsz.poll(addresses)

    assert by_jsz.round_trips == 1  # one HTTP request, no JetStream API fallback
    assert by_jsz.errors == []
    for address in addresses:
        assert _comparable(by_jsz.stats[address]) == _comparable(by_api.stats[address])
    work = by_jsz.stats[Address(stream, "work")]
    assert (work.backlog, work.in_flight, work.redelivered) == (6, 2, 1)
    assert (work.retained, work.produced, work.delivered, work.acked) == (10, 10, 4, None)
    assert by_jsz.stats[Address(stream)].oldest_message_age_s is not None
    assert [by_jsz.stats[a].exists for a in addresses[3:]] == [False, False, False]
    assert by_jsz.stats[Address(stream, "nobody")].backlog is None

    topology_api, topology_jsz = api.inspect(addresses), jsz.inspect(addresses)
    assert topology_jsz == topology_api
    limited = topology_jsz[Address(stream, "work")]
    assert (limited.ack_policy, limited.delivery_limit, limited.max_ack_pending) == (
        "explicit",
        5,
        50,
    )
    assert [topology_jsz[a].exists for a in addresses[3:]] == [False, False, False]


def test_jsz_round_trips_do_not_grow_with_streams(private_nats: PrivateNats) -> None:
    token = uuid.uuid4().hex[:8]
    streams = [f"JSZN_{token}_{i:03d}" for i in range(100)]

    async def setup(nc: NATS) -> None:
        js = nc.jetstream()
        for name in streams:
            await js.add_stream(name=name, subjects=[f"jszn.{token}.{name}"])
            await js.add_consumer(
                name, ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT)
            )

    _on(private_nats.url, setup)
    api, jsz = _adapters(private_nats)
    addresses = [Address(name, "c") for name in streams]

    ten, hundred = jsz.poll(addresses[:10]), jsz.poll(addresses)

    assert ten.round_trips == hundred.round_trips
    assert 1 <= hundred.round_trips <= 2
    assert all(s.exists and s.backlog == 0 for s in hundred.stats.values())
    assert api.poll(addresses).round_trips > hundred.round_trips  # the per-stream path


def test_jsz_account_filter_and_unknown_account(private_nats: PrivateNats) -> None:
    _api, jsz = _adapters(private_nats)
    jsz.management_url = f"{private_nats.monitor}/jsz?acc=$G"
    assert jsz.poll([Address("JSZ_none")]).stats[Address("JSZ_none")].exists is False

    jsz.management_url = f"{private_nats.monitor}?acc=NO_SUCH_ACCOUNT"
    with pytest.raises(BrokerError) as caught:
        jsz.poll([Address("JSZ_none")])
    assert caught.value.permanent is True


def test_jsz_closed_monitoring_port_falls_back_to_the_jetstream_api(
    private_nats: PrivateNats,
) -> None:
    """A monitoring port that does not answer (closed, or the server runs without ``-m``) is
    not an outage: the JetStream API tells the same, and ``errors`` says why it was used."""
    adapter = NatsJetStreamAdapter(
        private_nats.url, management_url=f"http://127.0.0.1:{_free_port()}", timeout=2.0
    )
    started = time.monotonic()
    result = adapter.poll([Address("S", "c")])
    assert result.stats[Address("S", "c")].exists is False
    assert any("monitoring port" in e and "JetStream API" in e for e in result.errors)
    assert time.monotonic() - started < 10
    assert adapter.inspect([Address("S", "c")])[Address("S", "c")].exists is False


def test_jsz_closed_monitoring_port_and_no_server_is_a_transient_broker_error() -> None:
    adapter = NatsJetStreamAdapter(
        f"nats://127.0.0.1:{_free_port()}",
        management_url=f"http://127.0.0.1:{_free_port()}",
        timeout=2.0,
    )
    with pytest.raises(BrokerError) as caught:
        adapter.poll([Address("S", "c")])
    assert caught.value.permanent is False


def test_jsz_not_a_monitoring_url_is_a_permanent_broker_error(
    private_nats: PrivateNats,
) -> None:
    for url in ("nats://127.0.0.1:8222", f"{private_nats.monitor}/varz/nothing-here"):
        adapter = NatsJetStreamAdapter(private_nats.url, management_url=url, timeout=2.0)
        with pytest.raises(BrokerError) as caught:
            adapter.poll([Address("S", "c")])
        assert caught.value.permanent is True, url
