"""Replay benchmark (hand-run, not a test): ``.venv/bin/python -m bench.replay``.

N (default 20,000) persistent 1 KiB dead letters in a fresh PostgreSQL database are replayed by
the real relay (``dlq.relay.run_plan``: batches, confirms, per-message item state, one audit
event per entry) and compared, in the same run, with:

- RabbitMQ: the broker's own shovel "move messages" (a dynamic shovel with
  ``src-delete-after: queue-length`` and ``ack-mode: on-confirm``, what the management UI
  does) moving the same N messages from the replay target into a second durable queue;
- Redis Streams and NATS JetStream: the adapter's raw confirmed publisher sending the same N
  messages without any database work.

Freezing the plan (N items and N request audit events, one transaction) is timed separately.
Set ``BENCH_MESSAGES``; ``BENCH_BROKERS=rabbitmq,redis,nats`` picks brokers. Everything created
is deleted again (the database too). Loopback only; every loop is bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
import uuid
from typing import Any

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
N = int(os.environ.get("BENCH_MESSAGES", "20000"))
BROKERS = os.environ.get("BENCH_BROKERS", "rabbitmq,redis,nats").split(",")
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
API = "http://127.0.0.1:15672/api"
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
RUN = uuid.uuid4().hex[:8]
DB = f"bench_replay_{RUN}"


def _pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


def setup_django() -> None:
    with _pg() as conn:
        conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ["DATABASE_URL"] = PG_ADMIN.rsplit("/", 1)[0] + "/" + DB
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_entries(kind: str, address: str, url_env: str) -> tuple[Any, list[int]]:
    from django.utils import timezone

    from channels_registry.models import Broker, Channel
    from dlq.models import DeadLetter

    broker = Broker.objects.create(name=f"bench-{kind}", kind=kind, url_env=url_env)
    channel = Channel.objects.create(
        broker=broker, name=f"bench {kind}", slug=f"bench-{kind}", address=address,
        address_group="workers" if kind != "rabbitmq" else "", dlq_address=f"{address}.dlq",
        semantic="at-least-once", idempotency_source="header", idempotency_key="Idempotency-Key",
    )  # fmt: skip
    pad = os.urandom(512).hex().encode()  # 1 KiB body
    now = timezone.now()
    rows = []
    for i in range(N):
        body = pad[: 1024 - 12] + b"%012d" % i
        rows.append(
            DeadLetter(
                channel=channel,
                dedupe_key=f"bench:{kind}:{i}",
                body=body,
                body_sha256=hashlib.sha256(body).hexdigest(),
                size=len(body),
                headers={"Idempotency-Key": f"k-{i}", "x-death": [{"queue": address, "count": 1}]},
                properties={"content_type": "application/octet-stream", "message_id": f"m-{i}"},
                dead_lettered_at=now,
                ingested_at=now,
                idempotency_key=f"k-{i}",
            )  # fmt: skip
        )
    DeadLetter.objects.bulk_create(rows, batch_size=2000)
    return channel, list(DeadLetter.objects.filter(channel=channel).values_list("pk", flat=True))


def relay(channel: Any) -> float:
    """Freeze (and approve: N is above the four-eyes threshold) a plan, run it; msgs/s."""
    from django.contrib.auth.models import User

    from audit.actions import Actor
    from dlq import relay
    from dlq.actions import do_approve_plan, do_create_plan
    from dlq.filters import EntryFilter
    from dlq.models import DeadLetter, PlanStatus
    from dlq.preview import Selection

    requester, _ = User.objects.get_or_create(username="bench-requester")
    approver, _ = User.objects.get_or_create(username="bench-approver")
    selection = Selection(EntryFilter(channel=channel.slug))
    started = time.monotonic()
    plan, _ = do_create_plan(
        "replay", selection, DeadLetter.objects.all(), actor=Actor.for_user(requester),
        reason="bench", velocity=None,
    )  # fmt: skip
    if plan.status == PlanStatus.AWAITING_APPROVAL:
        do_approve_plan(plan.pk, actor=Actor.for_user(approver), reason="bench")
    frozen = time.monotonic() - started
    started = time.monotonic()
    result = relay.run_plan(plan.pk, max_seconds=600)
    elapsed = time.monotonic() - started
    plan.refresh_from_db()
    assert plan.status == PlanStatus.DONE and plan.confirmed == N, (plan.status, plan.confirmed)
    rate = N / elapsed
    print(f"  freeze plan: {N} items + {N} request audit events in {frozen:.2f} s")
    print(f"  relay:       {result.confirmed}/{N} confirmed, state + audit per message, "
          f"in {elapsed:.2f} s = {rate:,.0f} msg/s")  # fmt: skip
    return rate


def bench_rabbitmq() -> None:
    import httpx
    import pika

    queue, moved = f"bench-replay-{RUN}", f"bench-replay-{RUN}-moved"
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = connection.channel()
    ch.queue_declare(queue, durable=True)
    ch.queue_declare(moved, durable=True)
    os.environ["BENCH_RABBIT_URL"] = AMQP_URL
    try:
        channel, _ = make_entries("rabbitmq", queue, "BENCH_RABBIT_URL")
        print(f"RabbitMQ: {N} persistent 1 KiB messages")
        relay_rate = relay(channel)
        depth = ch.queue_declare(queue, passive=True).method.message_count
        assert depth == N, depth
        shovel = {
            "value": {
                "src-protocol": "amqp091", "src-uri": "amqp://", "src-queue": queue,
                "dest-protocol": "amqp091", "dest-uri": "amqp://", "dest-queue": moved,
                "src-delete-after": "queue-length", "ack-mode": "on-confirm",
            }
        }  # fmt: skip
        with httpx.Client(auth=("guest", "guest"), timeout=10) as api:
            started = time.monotonic()
            api.put(f"{API}/parameters/shovel/%2F/bench-{RUN}", json=shovel).raise_for_status()
            deadline = started + 300
            count = 0
            while count < N and time.monotonic() < deadline:
                count = ch.queue_declare(moved, passive=True).method.message_count or 0
                time.sleep(0.01)
            elapsed = time.monotonic() - started
            api.delete(f"{API}/parameters/shovel/%2F/bench-{RUN}")
        shovel_rate = count / elapsed
        print(f"  shovel move: {count}/{N} in {elapsed:.2f} s = {shovel_rate:,.0f} msg/s")
        print(f"  relay/shovel ratio: {relay_rate / shovel_rate:.2f}x (target >= 0.5x)")
    finally:
        ch.queue_delete(queue)
        ch.queue_delete(moved)
        connection.close()


def _raw_publish_rate(kind: str, url: str, target: str) -> float:
    from brokers import get_adapter
    from brokers.base import Address, OutgoingMessage

    body = os.urandom(512).hex().encode()
    messages = [OutgoingMessage(str(i), body, {"Idempotency-Key": f"r-{i}",
                                               "x-dlq-replay-id": f"raw:{RUN}:{i}"})
                for i in range(N)]  # fmt: skip
    adapter = get_adapter(kind, url)
    with adapter.publisher(Address(target)) as publisher:
        started = time.monotonic()
        confirmed = 0
        for start in range(0, N, 200):
            confirmed += sum(o.confirmed for o in publisher.publish(messages[start : start + 200]))
        elapsed = time.monotonic() - started
    rate = confirmed / elapsed
    print(f"  raw adapter publish (batches of 200, no database): {confirmed}/{N} in "
          f"{elapsed:.2f} s = {rate:,.0f} msg/s")  # fmt: skip
    return rate


def bench_redis() -> None:
    import redis

    stream = f"bench-replay-{RUN}"
    client = redis.Redis.from_url(REDIS_URL)
    os.environ["BENCH_REDIS_URL"] = REDIS_URL
    try:
        channel, _ = make_entries("redis", stream, "BENCH_REDIS_URL")
        print(f"Redis Streams: {N} 1 KiB messages")
        relay_rate = relay(channel)
        raw = _raw_publish_rate("redis", REDIS_URL, f"{stream}-raw")
        print(f"  relay/raw ratio: {relay_rate / raw:.2f}x")
    finally:
        client.delete(stream, f"{stream}-raw")
        client.close()


def bench_nats() -> None:
    import nats

    stream = f"BENCH_REPLAY_{RUN}"

    async def admin(create: bool) -> None:
        nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
        js = nc.jetstream()
        if create:
            await js.add_stream(name=stream, subjects=[stream, f"{stream}.raw"])
        else:
            await js.delete_stream(stream)
        await nc.close()

    asyncio.run(admin(True))
    os.environ["BENCH_NATS_URL"] = NATS_URL
    try:
        channel, _ = make_entries("nats", stream, "BENCH_NATS_URL")
        print(f"NATS JetStream: {N} 1 KiB messages")
        relay_rate = relay(channel)
        raw = _raw_publish_rate("nats", NATS_URL, f"{stream}.raw")
        print(f"  relay/raw ratio: {relay_rate / raw:.2f}x")
    finally:
        asyncio.run(admin(False))


def main() -> None:
    setup_django()
    try:
        for name, run in (("rabbitmq", bench_rabbitmq), ("redis", bench_redis),
                          ("nats", bench_nats)):  # fmt: skip
            if name in BROKERS:
                try:
                    run()
                except Exception as exc:  # a broker that is down is reported, not fatal
                    print(f"{name}: skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        from django.db import connections

        connections.close_all()
        with _pg() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


if __name__ == "__main__":
    main()
