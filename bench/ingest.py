"""Ingest throughput (hand-run): ``DATABASE_URL=postgres://…/db python -m bench.ingest``.

Drains N dead letters (default 20,000; ~300-byte JSON bodies with x-death headers, like real
dead letters) from one durable RabbitMQ queue into PostgreSQL through ``dlq.ingest`` (batch
insert ON CONFLICT DO NOTHING + failure groups + one audit event per batch, commit, then ack),
versus a bare pika consume + ack loop over the same N messages on the same queue, in one run.
Target: ingest >= 0.5x the bare loop. The queue is deleted at the end; the rows stay.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
import uuid

import django
import pika

N = int(os.environ.get("BENCH_MESSAGES", "20000"))
URL = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def fill(queue: str, run: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    for i in range(N):
        body = (
            b'{"order": {"id": %d, "customer": "c-%d", "lines": [{"sku": "A-1", "qty": 2}]},'
            b' "run": "%s", "note": "%s"}' % (i, i % 977, run.encode(), b"x" * 150)
        )
        death = {"count": 3, "reason": "rejected", "queue": "orders", "exchange": "", "time": now}
        channel.basic_publish(
            "",
            queue,
            body,
            pika.BasicProperties(
                delivery_mode=2,
                content_type="application/json",
                message_id=f"{run}-{i}",
                headers={
                    "x-death": [death],
                    "x-first-death-queue": "orders",
                    "x-first-death-reason": "rejected",
                    "x-first-death-exchange": "",
                    "Idempotency-Key": f"{run}-{i}",
                    "x-exception-class": "OrderNotFound",
                    "x-exception-message": f"order {i} not found",
                },
            ),
        )
        if i % 1000 == 999:
            connection.process_data_events(time_limit=0)
    deadline = time.monotonic() + 30
    while channel.queue_declare(queue, passive=True).method.message_count < N:
        if time.monotonic() > deadline:
            sys.exit("messages did not all arrive")
        time.sleep(0.1)
    connection.close()


def bare_loop(queue: str) -> float:
    """basic.consume with manual ack, prefetch 1000, one multiple-ack per 500 messages."""
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1000)
    seen = 0
    started = time.perf_counter()
    for method, _props, _body in channel.consume(queue, auto_ack=False, inactivity_timeout=5):
        if method is None:
            break
        seen += 1
        if seen % 500 == 0 or seen == N:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if seen == N:
            break
    elapsed = time.perf_counter() - started
    channel.cancel()
    connection.close()
    assert seen == N, f"bare loop saw {seen}"
    return elapsed


def main() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to a PostgreSQL database for the benchmark.")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    os.environ["DLO_BROKER_BENCH_INGEST_URL"] = URL
    django.setup()
    from django.core.management import call_command

    from channels_registry.models import Broker, Channel
    from dlq.ingest import ingest_channel
    from dlq.models import DeadLetter

    call_command("migrate", verbosity=0)
    run = uuid.uuid4().hex[:8]
    queue = f"bench.ingest.{run}.dlq"
    broker, _ = Broker.objects.get_or_create(
        name="bench-ingest", defaults={"kind": "rabbitmq", "url_env": "DLO_BROKER_BENCH_INGEST_URL"}
    )
    channel = Channel.objects.create(
        broker=broker,
        name=f"Bench {run}",
        slug=f"bench-{run}",
        address=f"bench.{run}",
        dlq_address=queue,
        semantic="at-least-once",
        idempotency_source="header",
        idempotency_key="Idempotency-Key",
    )
    fill(queue, run + "a")
    bare_s = bare_loop(queue)
    fill(queue, run + "b")
    started = time.perf_counter()
    result = ingest_channel(channel, max_batches=10_000)
    ingest_s = time.perf_counter() - started
    stored = DeadLetter.objects.filter(channel=channel).count()
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    left = connection.channel().queue_declare(queue, passive=True).method.message_count
    connection.channel().queue_delete(queue)
    connection.close()
    bare_rate, ingest_rate = N / bare_s, N / ingest_s
    print(f"messages: {N} per side; stored {stored}, left on broker {left}")
    print(f"bare consume+ack : {bare_rate:9.0f} msg/s ({bare_s:.2f} s)")
    print(
        f"dlq ingest       : {ingest_rate:9.0f} msg/s ({ingest_s:.2f} s, {result.batches} batches)"
    )
    print(f"ratio ingest/bare: {ingest_rate / bare_rate:.2f}x (target >= 0.5x)")


if __name__ == "__main__":
    main()
