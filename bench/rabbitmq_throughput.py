"""RabbitMQ replay/drain throughput (hand-run): ``.venv/bin/python -m bench.rabbitmq_throughput``.

1. Publish: the adapter's confirmed, mandatory, persistent publisher sends N 1 KiB messages
   into a durable queue, versus RabbitMQ's own shovel moving the same N messages between two
   durable queues (what the management UI's "move messages" does: a dynamic shovel with
   ``src-delete-after: queue-length``, ``ack-mode: on-confirm``).
2. Drain: the adapter's ``fetch`` + ``ack`` over N dead-letter-sized messages, versus a bare
   pika consume + per-message ack loop on the same queue contents.
Loopback only; every loop is bounded; the queues are deleted at the end.
"""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pika

from brokers import get_adapter
from brokers.base import Address, OutgoingMessage

N = int(os.environ.get("BENCH_MESSAGES", "20000"))
BATCH = int(os.environ.get("BENCH_BATCH", "1000"))
URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
API = "http://127.0.0.1:15672/api"
BODY = os.urandom(1024)


def depth(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count or 0)


def fill(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> None:
    props = pika.BasicProperties(delivery_mode=2, headers={"x-bench": "1"})
    for i in range(N):
        channel.basic_publish("", queue, BODY, props)
        if i % 1000 == 999:
            channel.connection.process_data_events(time_limit=0)
    deadline = time.monotonic() + 120
    while depth(channel, queue) < N and time.monotonic() < deadline:
        time.sleep(0.05)


def bench_publish(channel: pika.adapters.blocking_connection.BlockingChannel, run: str) -> None:
    target = f"bench-tp-{run}-target"
    channel.queue_declare(target, durable=True)
    adapter = get_adapter("rabbitmq", URL)
    messages = [OutgoingMessage(str(i), BODY, {"x-dlq-replay-id": run}) for i in range(N)]
    with adapter.publisher(Address(target)) as publisher:
        started = time.monotonic()
        confirmed = 0
        for start in range(0, N, BATCH):
            outcomes = publisher.publish(messages[start : start + BATCH])
            confirmed += sum(o.confirmed for o in outcomes)
        elapsed = time.monotonic() - started
    adapter_rate = N / elapsed
    print(
        f"adapter publish: {confirmed}/{N} confirmed in {elapsed:.2f} s = {adapter_rate:,.0f} msg/s"
    )

    # The shovel moves the same N messages from `target` into `moved`.
    moved = f"bench-tp-{run}-moved"
    channel.queue_declare(moved, durable=True)
    shovel = {
        "value": {
            "src-protocol": "amqp091",
            "src-uri": "amqp://",
            "src-queue": target,
            "dest-protocol": "amqp091",
            "dest-uri": "amqp://",
            "dest-queue": moved,
            "src-delete-after": "queue-length",
            "ack-mode": "on-confirm",
        }
    }
    with httpx.Client(auth=("guest", "guest"), timeout=10) as api:
        started = time.monotonic()
        api.put(f"{API}/parameters/shovel/%2F/bench-{run}", json=shovel).raise_for_status()
        deadline = started + 300
        while depth(channel, moved) < N and time.monotonic() < deadline:
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        api.delete(f"{API}/parameters/shovel/%2F/bench-{run}")
    count = depth(channel, moved)
    shovel_rate = count / elapsed
    print(f"shovel move:     {count}/{N} moved in {elapsed:.2f} s = {shovel_rate:,.0f} msg/s")
    print(f"publish/shovel ratio: {adapter_rate / shovel_rate:.2f}x")
    channel.queue_delete(target)
    channel.queue_delete(moved)


def bench_drain(channel: pika.adapters.blocking_connection.BlockingChannel, run: str) -> None:
    queue = f"bench-tp-{run}-dlq"
    channel.queue_declare(queue, durable=True)

    fill(channel, queue)
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    bare = connection.channel()
    bare.basic_qos(prefetch_count=BATCH)
    started = time.monotonic()
    for method, _props, _body in bare.consume(queue, inactivity_timeout=2):
        if method is None:
            break
        bare.basic_ack(method.delivery_tag)
        if method.delivery_tag >= N:
            break
    bare_elapsed = time.monotonic() - started
    bare.cancel()
    connection.close()
    bare_rate = N / bare_elapsed
    print(f"bare consume+ack: {N} in {bare_elapsed:.2f} s = {bare_rate:,.0f} msg/s")

    fill(channel, queue)
    adapter = get_adapter("rabbitmq", URL)
    taken = 0
    with adapter.drain(Address(queue)) as session:
        started = time.monotonic()
        while taken < N:
            letters = session.fetch(BATCH, wait_s=2.0)
            if not letters:
                break
            session.ack(letters)
            taken += len(letters)
        elapsed = time.monotonic() - started
    rate = taken / elapsed
    print(f"adapter drain:    {taken} in {elapsed:.2f} s = {rate:,.0f} msg/s")
    print(f"drain/bare ratio: {rate / bare_rate:.2f}x")
    channel.queue_delete(queue)


def main() -> None:
    run = uuid.uuid4().hex[:8]
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    try:
        print(f"{N} persistent 1 KiB messages, batch {BATCH}")
        bench_publish(channel, run)
        bench_drain(channel, run)
    finally:
        for suffix in ("target", "moved", "dlq"):
            channel.queue_delete(f"bench-tp-{run}-{suffix}")
        connection.close()


if __name__ == "__main__":
    main()
