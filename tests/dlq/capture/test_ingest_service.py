"""Ingest and poll as real processes under faults: two workers on one Redis channel, the
long-running commands through a PostgreSQL outage and a broker outage (Redis, ActiveMQ), SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.dlq.services import (
    ProcDb,
    output,
    own_nats,
    own_redis,
    proc_db,
    proc_db_module,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(600)]
__all__ = ["proc_db", "proc_db_module"]  # the fixtures

REDIS_URL = os.environ.get("DLO_TEST_LAYER_REDIS_URL", "redis://127.0.0.1:6379/0")
STOMP_URL = os.environ.get("DLO_TEST_ACTIVEMQ_URL", "stomp://127.0.0.1:61613")
SUMMARY = re.compile(r"(\d+) fetched, (\d+) new, (\d+) duplicates")
WAITING = re.compile(r"(\d+) waiting unfetched")


def _redis_channel(db: ProcDb, slug: str, stream: str, url_env: str) -> None:
    db.only_new_channels()
    db.shell(
        "from channels_registry.models import Broker, Channel;"
        f"b = Broker.objects.create(name='{slug}', kind='redis', url_env='{url_env}');"
        f"Channel.objects.create(broker=b, name='{slug}', slug='{slug}', address='{stream}',"
        f" address_group='workers', dlq_address='{stream}.dlq', poison_address='',"
        " semantic='at-least-once')"
    )


def _rows(db: ProcDb, slug: str) -> int:
    [(count,)] = db.query(
        "SELECT count(*) FROM dlq_deadletter d JOIN channels_registry_channel c"
        " ON c.id = d.channel_id WHERE c.slug = %s",
        slug,
    )
    return int(count)


def test_two_ingest_workers_on_one_redis_channel_read_each_entry_once(proc_db: ProcDb) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis not reachable: {exc}")
    stream = f"dlo-two-{uuid.uuid4().hex[:8]}"
    slug = f"two-{uuid.uuid4().hex[:6]}"
    _redis_channel(proc_db, slug, stream, "DLO_BROKER_TEST_TWO_REDIS")
    try:
        pipe = client.pipeline(transaction=False)
        for i in range(2000):
            pipe.xadd(f"{stream}.dlq", {"body": b'{"n": %d}' % i, "reason": b"failed"})
        pipe.execute()
        env = {"DLO_BROKER_TEST_TWO_REDIS": REDIS_URL}
        workers = [
            proc_db.spawn("ingest", "--once", "--channel", slug, "--max-batches", "50", **env)
            for _ in range(2)
        ]
        outs = [output(w, timeout=240) for w in workers]
        counts = [tuple(int(x) for x in SUMMARY.search(out).groups()) for out in outs]  # type: ignore[union-attr]
        fetched = [c[0] for c in counts]
        duplicates = [c[2] for c in counts]
        print(f"two workers: fetched {fetched}, duplicates {duplicates}")
        assert sum(fetched) == 2000, outs
        assert duplicates == [0, 0], outs
        assert _rows(proc_db, slug) == 2000
        assert client.xpending(f"{stream}.dlq", "dlo-ingest")["pending"] == 0
    finally:
        client.delete(stream, f"{stream}.dlq")
        client.close()


def _ride_out_outages(
    db: ProcDb,
    tmp_path: Path,
    slug: str,
    env: dict[str, str],
    dead_letter: Callable[[int], None],
    broker_down: Callable[[], None],
    broker_up: Callable[[], None],
) -> None:
    """``ingest`` and ``poll`` run as long-running processes on ``slug``'s channel through a
    PostgreSQL outage and then a broker outage (``broker_down``, ``broker_up``); each says so in
    one line, no traceback, and every dead letter (``dead_letter(n)`` adds n) is stored once."""
    logs = {"ingest": tmp_path / "ingest.log", "poll": tmp_path / "poll.log"}
    ingest = db.spawn("ingest", log=logs["ingest"], **env)
    poll = db.spawn("poll", log=logs["poll"], **env)
    sent = 0

    def more(n: int) -> None:
        nonlocal sent
        dead_letter(n)
        sent += n

    def samples() -> int:
        return int(db.query("SELECT count(*) FROM channels_registry_channelsample")[0][0])

    def said(name: str, text: str) -> bool:
        return text in logs[name].read_text()

    try:
        more(50)
        wait_until(lambda: _rows(db, slug) == 50, 120, "the first 50 entries")
        # 1. PostgreSQL goes away (connections terminated, new ones refused) and comes back.
        db.cut()
        more(50)
        wait_until(lambda: said("ingest", "database unavailable"), 120, "ingest to notice")
        wait_until(lambda: said("poll", "database unavailable"), 120, "poll to notice")
        db.restore()
        wait_until(lambda: _rows(db, slug) == 100, 180, "ingest after the database outage")
        before = samples()
        wait_until(lambda: samples() > before, 180, "poll after the database outage")
        # 2. The broker goes away and comes back on the same port.
        broker_down()
        wait_until(lambda: said("ingest", "broker unavailable"), 120, "ingest to notice")
        failed = re.compile(rf"{slug}: failed, \d+ channel")
        wait_until(lambda: failed.search(logs["poll"].read_text()), 120, "poll to notice")
        broker_up()
        more(50)
        wait_until(lambda: _rows(db, slug) == 150, 240, "ingest after the broker outage")
        before = samples()
        wait_until(lambda: samples() > before, 180, "poll after the broker outage")
    finally:
        for proc in (ingest, poll):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (ingest, poll):
            proc.wait(timeout=60)
        ingest_out, poll_out = logs["ingest"].read_text(), logs["poll"].read_text()
    print(ingest_out[-3000:], poll_out[-3000:], sep="\n---\n")
    assert ingest.returncode == 0 and poll.returncode == 0
    for out in (ingest_out, poll_out):
        assert "Traceback" not in out
        assert "database unavailable" in out
        assert out.rstrip().endswith("stopped")
    assert "broker unavailable" in ingest_out and "broker ok again" in ingest_out
    assert _rows(db, slug) == sent == 150


def test_long_running_ingest_and_poll_ride_out_database_and_broker_outages(
    proc_db: ProcDb, tmp_path: Path
) -> None:
    """On Redis: our own server, killed -9 and restarted."""
    server = own_redis(tmp_path)
    url = f"redis://127.0.0.1:{server.port}/0"
    clients = [redis.Redis.from_url(url, socket_timeout=5)]
    stream, slug = "svc", f"svc-{uuid.uuid4().hex[:6]}"
    clients[0].xgroup_create(stream, "workers", id="0", mkstream=True)
    _redis_channel(proc_db, slug, stream, "DLO_BROKER_TEST_SVC_REDIS")
    sent = 0

    def dead_letter(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            clients[0].xadd(f"{stream}.dlq", {"body": b'{"n": %d}' % sent, "reason": b"failed"})
            sent += 1

    def down() -> None:
        server.kill()
        clients[0].close()

    def up() -> None:
        server.start()
        clients[0] = redis.Redis.from_url(url, socket_timeout=5)

    env = {"DLO_BROKER_TEST_SVC_REDIS": url, "DLO_BROKER_TIMEOUT_S": "2"}
    try:
        _ride_out_outages(proc_db, tmp_path, slug, env, dead_letter, down, up)
    finally:
        clients[0].close()
        server.stop()


def test_long_running_ingest_and_poll_ride_out_database_and_activemq_outages(
    proc_db: ProcDb, tmp_path: Path
) -> None:
    """On ActiveMQ: the shared broker must not be stopped, so the services reach it through a
    TCP proxy (tests/faultproxy.py) that drops every connection and refuses new ones."""
    from brokers.activemq import ActiveMQAdapter
    from brokers.base import Address, OutgoingMessage
    from tests.brokers.test_activemq import require_activemq
    from tests.faultproxy import FaultProxy

    require_activemq(STOMP_URL)
    direct = ActiveMQAdapter(STOMP_URL, timeout=10.0)
    proxy = FaultProxy(("127.0.0.1", 61613))
    queue, slug = f"indiv.svc.{uuid.uuid4().hex[:8]}", f"svc-{uuid.uuid4().hex[:6]}"
    proc_db.only_new_channels()
    proc_db.shell(
        "from channels_registry.models import Broker, Channel;"
        f"b = Broker.objects.create(name='{slug}', kind='activemq',"
        " url_env='DLO_BROKER_TEST_SVC_STOMP');"
        f"Channel.objects.create(broker=b, name='{slug}', slug='{slug}', address='{queue}',"
        f" dlq_address='DLQ.{queue}', poison_address='', semantic='at-least-once')"
    )
    sent = 0

    def dead_letter(n: int) -> None:  # straight to the broker, past the proxy
        nonlocal sent
        messages = [
            OutgoingMessage(str(sent + i), b'{"n": %d}' % (sent + i), {}, {"body_type": "text"})
            for i in range(n)
        ]
        with direct.publisher(Address(f"DLQ.{queue}")) as publisher:
            assert all(o.confirmed for o in publisher.publish(messages))
        sent += n

    env = {"DLO_BROKER_TEST_SVC_STOMP": f"stomp://127.0.0.1:{proxy.port}"}
    env["DLO_BROKER_TIMEOUT_S"] = "2"
    try:
        _ride_out_outages(proc_db, tmp_path, slug, env, dead_letter, proxy.cut, proxy.restore)
    finally:
        proxy.close()


def test_long_running_commands_start_while_the_database_is_away(
    proc_db: ProcDb, tmp_path: Path
) -> None:
    """Started during an outage (a restart of the host, or a slow start under load), both
    services say so in one line and carry on when the database answers, no traceback. Their
    start-up check used to query first and die."""
    server = own_redis(tmp_path)
    url = f"redis://127.0.0.1:{server.port}/0"
    client = redis.Redis.from_url(url, socket_timeout=5)
    stream, slug = "away", f"away-{uuid.uuid4().hex[:6]}"
    client.xgroup_create(stream, "workers", id="0", mkstream=True)
    _redis_channel(proc_db, slug, stream, "DLO_BROKER_TEST_AWAY_REDIS")
    client.xadd(f"{stream}.dlq", {"body": b'{"n": 1}', "reason": b"failed"})
    env = {"DLO_BROKER_TEST_AWAY_REDIS": url, "DLO_BROKER_TIMEOUT_S": "2"}
    logs = {"ingest": tmp_path / "ingest.log", "poll": tmp_path / "poll.log"}
    proc_db.cut()
    procs = {
        "ingest": proc_db.spawn("ingest", "--channel", slug, log=logs["ingest"], **env),
        "poll": proc_db.spawn("poll", "--broker", slug, log=logs["poll"], **env),
    }
    try:
        for name in procs:
            wait_until(lambda n=name: "database unavailable" in logs[n].read_text(), 120, name)
        proc_db.restore()
        wait_until(lambda: _rows(proc_db, slug) == 1, 180, "ingest once the database is back")
    finally:
        proc_db.restore()
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            proc.wait(timeout=60)
        client.close()
        server.stop()
    for name, proc in procs.items():
        out = logs[name].read_text()
        assert proc.returncode == 0, out
        assert "Traceback" not in out and out.rstrip().endswith("stopped"), out


def test_nats_ingest_killed_mid_drain_recovers_everything_on_the_next_runs(
    proc_db: ProcDb, tmp_path: Path
) -> None:
    """kill -9 of ``ingest --once`` mid-drain on our own nats-server, then ``ingest --once``
    again: every advisory is stored exactly once. The next run fetches what the dead one did
    not hold at once (max_ack_pending no longer blocks it); what it held comes back after the
    (bounded) ack wait, and a run that finds only held advisories says how many wait."""
    import asyncio

    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    server = own_nats(tmp_path)
    url = f"nats://127.0.0.1:{server.port}"
    count, slug, stream = 3000, f"nats-{uuid.uuid4().hex[:6]}", "KILLED"
    proc_db.only_new_channels()
    proc_db.shell(
        "from channels_registry.models import Broker, Channel;"
        f"b = Broker.objects.create(name='{slug}', kind='nats',"
        " url_env='DLO_BROKER_TEST_KILL_NATS');"
        f"Channel.objects.create(broker=b, name='{slug}', slug='{slug}', address='{stream}',"
        " address_group='app', nats_advisory_capture=True, semantic='at-least-once')"
    )
    env = {"DLO_BROKER_TEST_KILL_NATS": url, "DLO_NATS_DRAIN_ACK_WAIT_S": "5"}
    # The advisory stream must exist before the first death (the scheduler's first run).
    first = proc_db.spawn("ingest", "--once", "--channel", slug, **env)
    assert "0 fetched" in output(first, 120)  # creates DLO_ADVISORIES and the drain consumers

    async def terminate_all() -> None:
        nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0)
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=["killed.>"])
        await js.add_consumer(
            stream, ConsumerConfig(durable_name="app", ack_policy=AckPolicy.EXPLICIT)
        )
        for i in range(count):
            await js.publish("killed.orders", b'{"n": %d}' % i)
        sub = await js.pull_subscribe_bind("app", stream)
        done = 0
        while done < count:
            for msg in await sub.fetch(min(500, count - done), timeout=5):
                await msg.term()
                done += 1
        await nc.flush()
        await nc.close()

    asyncio.run(terminate_all())
    try:
        # 1. kill -9 at a random point mid-drain.
        victim = proc_db.spawn("ingest", "--once", "--channel", slug, **env)
        wait_until(lambda: _rows(proc_db, slug) >= 500 or victim.poll() is not None, 120, "rows")
        victim.send_signal(signal.SIGKILL)
        output(victim, 30)
        assert victim.returncode == -signal.SIGKILL, "the ingester finished before the kill"
        # 2. Dead at the worst moment: right after a commit, holding its batch unacknowledged.
        crash_env = {**env, "DLO_TEST_CRASH_AFTER_COMMIT": "1"}
        crash = proc_db.spawn("ingest", "--once", "--channel", slug, **crash_env)
        output(crash, 120)
        assert crash.returncode == 137
        at_kill = _rows(proc_db, slug)
        assert 0 < at_kill < count
        runs: list[tuple[int, ...]] = []
        stalls: list[int] = []
        for _ in range(20):  # bounded: each run drains what is visible, then ack waits end
            out = output(proc_db.spawn("ingest", "--once", "--channel", slug, **env), 120)
            found = SUMMARY.search(out)
            assert found is not None, out
            runs.append(tuple(int(x) for x in found.groups()))
            held = WAITING.search(out)
            stalls.append(int(held.group(1)) if held else 0)
            if _rows(proc_db, slug) == count:
                break
        print(
            f"NATS kill -9 + crash after commit: {at_kill} stored; runs after (fetched, new,"
            f" duplicates): {runs}; reported waiting unfetched per run: {stalls}"
        )
        assert runs[0][0] > 0, "the first run after the crash fetched nothing"
        assert _rows(proc_db, slug) == count
        [(distinct,)] = proc_db.query(
            "SELECT count(DISTINCT dedupe_key) FROM dlq_deadletter d JOIN"
            " channels_registry_channel c ON c.id = d.channel_id WHERE c.slug = %s",
            slug,
        )
        assert distinct == count
    finally:
        server.stop()
