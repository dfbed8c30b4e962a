"""Poll-cycle benchmark (hand-run, not a test): ``.venv/bin/python -m bench.poll``.

For each broker: create 1,000 channels (RabbitMQ queues; Redis streams with a consumer group;
NATS JetStream streams with a durable consumer; ActiveMQ queues), poll them ``CYCLES`` times
with the adapter through ``brokers.get_adapter`` only, and print the cycle duration (median,
max) and the adapter's ``round_trips`` at 10, 100 and 1,000 channels. Everything created is
deleted again. A broker whose adapter does not import yet or whose service is down is skipped,
with a reason. Loopback only; every loop is bounded.

NATS is measured twice more on a private ``nats-server`` started with a monitoring port (the
shared one has none): the JetStream API path and the ``/jsz`` monitoring path side by side on
the same streams. The private server and its store directory are removed afterwards.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence

from brokers import get_adapter
from brokers.base import Address, BrokerAdapter, BrokerError

CHANNELS = int(os.environ.get("BENCH_CHANNELS", "1000"))
SIZES = [n for n in (10, 100, CHANNELS) if n <= CHANNELS]
CYCLES = int(os.environ.get("BENCH_CYCLES", "7"))
RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
NATS_SERVER = os.environ.get("DLO_NATS_SERVER_BIN", "/usr/sbin/nats-server")
ACTIVEMQ_URL = "stomp://127.0.0.1:61613"


def measure(label: str, adapter: BrokerAdapter, addresses: Sequence[Address]) -> None:
    for size in SIZES:
        subset = addresses[:size]
        durations: list[float] = []
        trips: set[int] = set()
        missing = 0
        for _ in range(CYCLES):
            result = adapter.poll(subset)
            durations.append(result.duration_s)
            trips.add(result.round_trips)
            missing = sum(1 for s in result.stats.values() if not s.exists)
        median_ms = statistics.median(durations) * 1000
        print(
            f"  {label:<22} channels={size:>5}  median={median_ms:8.1f} ms"
            f"  max={max(durations) * 1000:8.1f} ms  round_trips={sorted(trips)}"
            + (f"  MISSING={missing}" if missing else "")
        )


def bench_rabbitmq() -> None:
    import pika

    try:
        connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    except Exception as exc:
        print(f"rabbitmq: skipped, broker down ({exc!r})")
        return
    run = uuid.uuid4().hex[:8]
    names = [f"bench-poll-{run}-{i:04d}" for i in range(CHANNELS)]
    channel = connection.channel()
    try:
        for name in names:
            channel.queue_declare(name, durable=False, arguments={"x-queue-type": "classic"})
        for name in names[:: max(1, CHANNELS // 100)]:
            channel.basic_publish("", name, b"x")
        print(f"rabbitmq: {CHANNELS} queues")
        addresses = [Address(n) for n in names]
        paths = {
            "prometheus detailed": "http://127.0.0.1:15692/metrics",
            "management API": "http://guest:guest@127.0.0.1:15672",
            "AMQP passive declare": None,
        }
        for label, management_url in paths.items():
            adapter = get_adapter("rabbitmq", RABBIT_URL, management_url=management_url)
            try:
                measure(label, adapter, addresses)
            except BrokerError as exc:
                print(f"  {label}: failed: {exc}")
    finally:
        for name in names:
            channel.queue_delete(name)
        connection.close()


def bench_redis() -> None:
    try:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
        client.ping()
    except Exception as exc:
        print(f"redis: skipped, service down ({exc!r})")
        return
    try:
        adapter = get_adapter("redis", REDIS_URL)
    except Exception as exc:
        print(f"redis: skipped, adapter not importable yet ({exc!r})")
        return
    run = uuid.uuid4().hex[:8]
    keys = [f"bench-poll-{run}-{i:04d}" for i in range(CHANNELS)]
    try:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.xgroup_create(key, "bench", id="0", mkstream=True)
            pipe.xadd(key, {"n": "1"})
        pipe.execute()
        print(f"redis: {CHANNELS} streams with a consumer group")
        _run(measure, "redis streams", adapter, [Address(k, "bench") for k in keys])
    finally:
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()


def bench_nats(
    url: str = NATS_URL, paths: dict[str, str | None] | None = None, title: str = "nats"
) -> None:
    try:
        import nats
    except Exception as exc:
        print(f"{title}: skipped ({exc!r})")
        return
    paths = paths or {"nats jetstream": None}
    try:
        adapters = {
            label: get_adapter("nats", url, management_url=management_url)
            for label, management_url in paths.items()
        }
    except Exception as exc:
        print(f"{title}: skipped, adapter not importable yet ({exc!r})")
        return
    run = uuid.uuid4().hex[:8]
    streams = [f"BENCH_{run}_{i:04d}" for i in range(CHANNELS)]

    async def setup() -> None:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        js = nc.jetstream()
        for name in streams:
            await js.add_stream(name=name, subjects=[f"bench.{run}.{name}"])
            await js.add_consumer(name, durable_name="bench", ack_policy="explicit")
        await nc.close()

    async def teardown() -> None:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        js = nc.jetstream()
        for name in streams:
            try:
                await js.delete_stream(name)
            except Exception as exc:
                print(f"  nats cleanup of {name} failed: {exc!r}")
        await nc.close()

    try:
        asyncio.run(setup())
    except Exception as exc:
        print(f"{title}: skipped, service down or JetStream off ({exc!r})")
        asyncio.run(teardown())
        return
    try:
        print(f"{title}: {CHANNELS} JetStream streams with a durable consumer")
        for label, adapter in adapters.items():
            _run(measure, label, adapter, [Address(s, "bench") for s in streams])
    finally:
        asyncio.run(teardown())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def bench_nats_jsz() -> None:
    """Both NATS paths on a private nats-server with a monitoring port."""
    if not os.access(NATS_SERVER, os.X_OK):
        print(f"nats (private, /jsz): skipped, no nats-server binary at {NATS_SERVER}")
        return
    import httpx

    store = tempfile.mkdtemp(prefix="dlo-bench-nats-")
    port, monitor_port = _free_port(), _free_port()
    monitor = f"http://127.0.0.1:{monitor_port}"
    process = subprocess.Popen(
        [NATS_SERVER, "-js", "-sd", store, "-a", "127.0.0.1", "-p", str(port)]
        + ["-m", str(monitor_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                print(f"nats (private, /jsz): skipped, nats-server exited ({process.returncode})")
                return
            try:
                if httpx.get(f"{monitor}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                print("nats (private, /jsz): skipped, nats-server not healthy within 15 s")
                return
            time.sleep(0.05)
        bench_nats(
            f"nats://127.0.0.1:{port}",
            {"nats JetStream API": None, "nats /jsz monitoring": monitor},
            title="nats (private server, monitoring port)",
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(store, ignore_errors=True)


def bench_activemq() -> None:
    """ActiveMQ queues (one message in each, so the statistics plugin has every one), polled
    through the statistics plugin; emptied afterwards (the test broker removes empty queues)."""
    try:
        adapter = get_adapter("activemq", ACTIVEMQ_URL)
        adapter.ping()
    except BrokerError as exc:
        print(f"activemq: skipped, broker down ({exc})")
        return
    from brokers.base import OutgoingMessage

    run = uuid.uuid4().hex[:8]
    addresses = [Address(f"bench-poll-{run}-{i:04d}") for i in range(CHANNELS)]
    try:
        for address in addresses:
            with adapter.publisher(address) as publisher:
                publisher.publish([OutgoingMessage("x", b"x", {})])
        print(f"activemq: {CHANNELS} queues")
        _run(measure, "activemq statistics", adapter, addresses)
    finally:
        for address in addresses:
            try:
                with adapter.drain(address) as session:
                    session.ack(session.fetch(10, wait_s=1.0))
            except BrokerError as exc:
                print(f"  activemq cleanup of {address.name} failed: {exc}")


def _run(fn: Callable[..., None], label: str, *args: object) -> None:
    try:
        fn(label, *args)
    except BrokerError as exc:
        print(f"  {label}: failed: {exc}")


def main() -> None:
    print(f"poll benchmark: {CYCLES} cycles per size, sizes {SIZES}")
    bench_rabbitmq()
    bench_redis()
    bench_nats()
    bench_nats_jsz()
    bench_activemq()


if __name__ == "__main__":
    main()
