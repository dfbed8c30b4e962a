"""RedisStreamsAdapter against the real Redis on loopback (uniquely named keys, cleaned up)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from brokers.base import Address, BrokerError, OutgoingMessage
from brokers.redis_streams import DRAIN_GROUP, RedisDrainSession, RedisStreamsAdapter

URL = os.environ.get("DLO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

pytestmark = pytest.mark.broker


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        client.close()
        if os.environ.get("CI"):
            pytest.fail(f"Redis not reachable at {URL}: {exc}")
        pytest.skip(f"Redis not reachable at {URL}: {exc}")
    yield client
    client.close()


@pytest.fixture
def redis_keys(redis_client: redis.Redis) -> Iterator[list[str]]:
    """Unique key names; every one is deleted afterwards."""
    keys: list[str] = []
    yield keys
    if keys:
        redis_client.delete(*keys)


def _key(keys: list[str], prefix: str) -> str:
    key = f"dlo-test:{prefix}:{uuid.uuid4().hex}"
    keys.append(key)
    return key


@pytest.fixture
def adapter() -> RedisStreamsAdapter:
    return RedisStreamsAdapter(URL, timeout=2.0)


def test_poll_samples_group_lag_pending_and_positions(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    stream = _key(redis_keys, "orders")
    for i in range(10):
        redis_client.xadd(stream, {"body": f"m{i}"})
    redis_client.xgroup_create(stream, "workers", id="0")
    read = redis_client.xreadgroup("workers", "w1", {stream: ">"}, count=4)
    redis_client.xack(stream, "workers", read[0][1][0][0])  # 4 delivered, 1 acked, 3 pending

    address = Address(stream, "workers")
    result = adapter.poll([address])

    sample = result.stats[address]
    assert sample.exists is True
    assert sample.backlog == 6
    assert sample.in_flight == 3
    assert sample.retained == 10
    assert sample.consumers == 1
    assert sample.active_consumers == 1
    assert sample.produced == 10
    assert sample.delivered == 4
    assert sample.acked == 1
    assert sample.redelivered is None
    assert sample.oldest_message_age_s is not None and sample.oldest_message_age_s >= 0
    assert sample.oldest_unacked_age_s is not None and sample.oldest_unacked_age_s >= 0
    # one XINFO pipeline plus one targeted pipeline (pending > 0 and oldest undelivered)
    assert result.round_trips == 2
    assert result.errors == []


def test_poll_round_trips_do_not_grow_with_addresses(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    addresses = []
    for _ in range(30):
        stream = _key(redis_keys, "many")
        redis_client.xadd(stream, {"body": "x"})
        redis_client.xgroup_create(stream, "g", id="0")
        redis_client.xreadgroup("g", "c", {stream: ">"}, count=1)
        addresses.append(Address(stream, "g"))

    result = adapter.poll(addresses)

    assert result.round_trips == 2
    assert all(s.in_flight == 1 and s.backlog == 0 for s in result.stats.values())


def test_missing_stream_or_group_is_not_there(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    stream = _key(redis_keys, "lonely")
    redis_client.xadd(stream, {"body": "x"})
    missing_stream = Address(f"dlo-test:absent:{uuid.uuid4().hex}", "g")
    missing_group = Address(stream, "nobody")

    result = adapter.poll([missing_stream, missing_group])

    assert result.stats[missing_stream].exists is False
    assert result.stats[missing_group].exists is False
    assert result.stats[missing_group].backlog is None
    topology = adapter.inspect([missing_stream, missing_group, Address(stream)])
    assert topology[missing_stream].exists is False
    assert topology[missing_group].exists is False
    assert topology[Address(stream)].exists is True
    assert topology[Address(stream)].kind == "redis-stream"


def test_lag_reported_nil_after_xdel_is_unknown_not_zero(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    stream = _key(redis_keys, "trimmed")
    ids = [redis_client.xadd(stream, {"body": f"m{i}"}) for i in range(10)]
    redis_client.xgroup_create(stream, "g", id="0")
    redis_client.xreadgroup("g", "c", {stream: ">"}, count=3)
    redis_client.xdel(stream, ids[6])  # a tombstone between last-delivered-id and the end
    assert redis_client.xinfo_groups(stream)[0]["lag"] is None  # what Redis 7.0 reports

    sample = adapter.poll([Address(stream, "g")]).stats[Address(stream, "g")]

    assert sample.backlog is None
    assert sample.retained == 9
    assert sample.in_flight == 3


def test_inspect_reports_stream_summary(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    stream = _key(redis_keys, "inspect")
    redis_client.xadd(stream, {"body": "x"})
    redis_client.xgroup_create(stream, "g", id="$")

    topology = adapter.inspect([Address(stream, "g")])[Address(stream, "g")]

    assert topology.exists is True
    assert topology.delivery_limit is None
    assert topology.raw["stream"]["entries-added"] == 1
    assert "max-deleted-entry-id" in topology.raw["stream"]
    assert [g["name"] for g in topology.raw["groups"]] == ["g"]


def test_unreachable_port_is_a_transient_broker_error() -> None:
    started = time.monotonic()
    with pytest.raises(BrokerError) as caught:
        RedisStreamsAdapter("redis://127.0.0.1:1/0", timeout=2.0).poll([Address("s", "g")])
    assert caught.value.permanent is False
    assert time.monotonic() - started < 10  # bounded by the timeout, not hanging


def test_malformed_url_is_a_permanent_broker_error() -> None:
    with pytest.raises(BrokerError) as caught:
        RedisStreamsAdapter("http://127.0.0.1:6379").ping()
    assert caught.value.permanent is True


HOSTILE = [b"\xff\xfe not utf-8", b"nul\x00inside", os.urandom(1024 * 1024)]


def test_drain_rereads_unacked_letters_with_the_same_key_then_ack_removes_them(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    dlq = _key(redis_keys, "dlq")
    address = Address(dlq)
    adapter.prepare_drain(address)
    adapter.prepare_drain(address)  # idempotent (BUSYGROUP ignored)
    for i, body in enumerate(HOSTILE):
        redis_client.xadd(
            dlq,
            {
                "body": body,
                "reason": f"boom {i}",
                "delivery_count": "5",
                "source_stream": "orders",
                "error": b"\xc3\x28",
            },
        )

    with adapter.drain(address) as session:
        first = session.fetch(max_batch=10, wait_s=1.0)
    with adapter.drain(address) as session:  # "crash" before ack: reopen and re-read
        again = session.fetch(max_batch=10, wait_s=1.0)
        assert session.fetch(max_batch=10, wait_s=0.2) == []
        session.ack(again)

    assert [letter.body for letter in first] == HOSTILE
    assert [letter.dedupe_key for letter in again] == [letter.dedupe_key for letter in first]
    letter = first[0]
    assert letter.dedupe_key == f"redis:{dlq}:{DRAIN_GROUP}:{letter.broker_id}"
    assert letter.reason == "boom 0"
    assert letter.redelivery_count == 5
    assert letter.first_death_queue == "orders"
    assert letter.headers["error"] == {"$bytes": "c328"}
    assert "body" not in letter.headers
    assert letter.dead_lettered_at == int(letter.broker_id.split("-")[0]) / 1000
    assert redis_client.xpending(dlq, DRAIN_GROUP)["pending"] == 0
    with adapter.drain(address) as session:
        assert session.fetch(max_batch=10, wait_s=0.2) == []
    assert redis_client.xlen(dlq) == 3  # ack is XACK only; the stream's retention trims


def test_drain_respects_max_batch(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    dlq = _key(redis_keys, "dlq-batch")
    adapter.prepare_drain(Address(dlq))
    for i in range(5):
        redis_client.xadd(dlq, {"body": f"{i}"})

    with adapter.drain(Address(dlq)) as session:
        batches = [session.fetch(max_batch=2, wait_s=0.2) for _ in range(4)]

    assert [len(b) for b in batches] == [2, 2, 1, 0]


def test_drain_without_prepare_is_a_permanent_error(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    dlq = _key(redis_keys, "unprepared")
    redis_client.xadd(dlq, {"body": "x"})
    with adapter.drain(Address(dlq)) as session, pytest.raises(BrokerError) as caught:
        session.fetch(max_batch=1, wait_s=0.1)
    assert caught.value.permanent is True


def test_publisher_confirms_and_round_trips_bytes_and_headers(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    target = _key(redis_keys, "replay")
    wrong_type = _key(redis_keys, "string")
    redis_client.set(wrong_type, "not a stream")
    messages = [
        OutgoingMessage(key=f"k{i}", body=body, headers={"x-dlq-replay-id": f"r{i}", "n": i})
        for i, body in enumerate(HOSTILE)
    ]

    with adapter.publisher(Address(target)) as publisher:
        outcomes = publisher.publish(messages)
        clash = publisher.publish([OutgoingMessage(key="c", body=b"x", headers={"body": "y"})])
    with adapter.publisher(Address(wrong_type)) as publisher:
        refused = publisher.publish([OutgoingMessage(key="w", body=b"x", headers={})])

    assert [(o.key, o.confirmed) for o in outcomes] == [("k0", True), ("k1", True), ("k2", True)]
    entries = redis_client.xrange(target)
    assert [fields[b"body"] for _id, fields in entries] == HOSTILE
    assert entries[1][1][b"x-dlq-replay-id"] == b"r1"
    assert clash[0].confirmed is False and clash[0].permanent is True
    assert refused[0].confirmed is False and "WRONGTYPE" in refused[0].reason


def test_two_drain_consumers_split_the_entries_between_them(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    dlq = _key(redis_keys, "dlq")
    adapter.prepare_drain(Address(dlq))
    for i in range(100):
        redis_client.xadd(dlq, {"body": b"m%d" % i})
    one = RedisDrainSession(adapter, dlq, consumer="dlo-test-one")
    two = RedisDrainSession(adapter, dlq, consumer="dlo-test-two")
    read: dict[str, list[str]] = {"one": [], "two": []}
    try:
        for _ in range(20):
            for name, session in (("one", one), ("two", two)):
                letters = session.fetch(max_batch=7, wait_s=0.1)
                session.ack(letters)
                read[name] += [letter.broker_id for letter in letters]
    finally:
        one.close()
        two.close()
    assert read["one"] and read["two"]
    assert not set(read["one"]) & set(read["two"])  # nothing read twice
    assert len(read["one"]) + len(read["two"]) == 100


def test_a_dead_consumers_pending_entries_are_claimed_after_the_idle_bound(
    adapter: RedisStreamsAdapter, redis_client: redis.Redis, redis_keys: list[str]
) -> None:
    dlq = _key(redis_keys, "dlq")
    adapter.prepare_drain(Address(dlq))
    for i in range(5):
        redis_client.xadd(dlq, {"body": b"m%d" % i})
    dead = RedisDrainSession(adapter, dlq, consumer="dlo-test-dead")
    taken = dead.fetch(max_batch=10, wait_s=0.5)
    dead.client.close()  # the worker dies: read, never acknowledged
    assert len(taken) == 5
    adapter.drain_claim_idle_s = 3600.0
    with adapter.drain(Address(dlq)) as session:  # not idle long enough: not claimed
        assert session.fetch(max_batch=10, wait_s=0.2) == []
    adapter.drain_claim_idle_s = 0.05
    time.sleep(0.1)
    with adapter.drain(Address(dlq)) as session:
        claimed = session.fetch(max_batch=10, wait_s=0.2)
        assert [x.dedupe_key for x in claimed] == [x.dedupe_key for x in taken]
        session.ack(claimed)
    assert redis_client.xpending(dlq, DRAIN_GROUP)["pending"] == 0
    redis_client.xgroup_delconsumer(dlq, DRAIN_GROUP, "dlo-test-dead")
