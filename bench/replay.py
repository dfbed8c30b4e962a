"""Replay benchmark (hand-run, not a test): ``.venv/bin/python -m bench.replay``.

N (default 20,000) persistent 1 KiB dead letters, stored in a fresh PostgreSQL database by the
real ingest path (so each row has its ~1.3 KB search text and every index), are replayed by
the real relay (``dlq.plans.relay.run_plan``: batches, confirms, per-message item state, one
audit record per batch listing every message's outcome) and compared, in the same run,
interleaved over ``BENCH_ROUNDS`` (3) rounds with the median ratio printed last, with:

- RabbitMQ: the broker's own shovel "move messages" (a dynamic shovel with
  ``src-delete-after: queue-length`` and ``ack-mode: on-confirm``, what the management UI
  does) moving the same N messages from the replay target into a second durable queue;
- Redis Streams and NATS JetStream: a bare pipelined publish of the same client (the adapter's
  confirmed publisher, batches of 500) sending N messages without any database work;
- ActiveMQ Classic: a bare STOMP publish (stomp.py, persistent sends, a receipt on every 500th
  and on the last one, waited for) of N messages, no database work.

Freezing the plan (N items, a request audit event per chunk) is timed separately.
Set ``BENCH_MESSAGES``; ``BENCH_BROKERS=rabbitmq,redis,nats,activemq`` picks brokers.
``BENCH_STAGES=1`` also prints, per relay run, where its time went per message: the relay's
steps (claim, publish and confirm on the publisher thread, recording the outcomes), the
relay connection's SQL by statement (a timing wrapper on every statement), largest first, and
the CPU of each of the process's threads (which of them competes for the interpreter lock).
The process settles its heap after start-up as a Celery worker does (``config.celery``:
``gc.freeze`` of what start-up left alive); ``BENCH_SETTLE_HEAP=0`` leaves it as it is, to
compare. Everything created is deleted again (the database too). Loopback only; every loop is
bounded.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import statistics
import sys
import threading
import time
import uuid
from typing import Any

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
N = int(os.environ.get("BENCH_MESSAGES", "20000"))
BROKERS = os.environ.get("BENCH_BROKERS", "rabbitmq,redis,nats,activemq").split(",")
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
STAGES = os.environ.get("BENCH_STAGES", "") == "1"
SETTLE_HEAP = os.environ.get("BENCH_SETTLE_HEAP", "1") != "0"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
API = "http://127.0.0.1:15672/api"
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
STOMP_URL = "stomp://127.0.0.1:61613"
RUN = uuid.uuid4().hex[:8]
DB = f"bench_replay_{RUN}"


def _pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


def setup_django() -> None:
    with _pg() as conn:
        conn.execute(f'CREATE DATABASE "{DB}"')
    os.environ["DATABASE_URL"] = PG_ADMIN.rsplit("/", 1)[0] + "/" + DB
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # As production runs (DEBUG is off there): no per-statement SQL log (DEBUG=1 to compare).
    os.environ.setdefault("DEBUG", "0")
    os.environ.pop("CELERY_BROKER_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if SETTLE_HEAP:
        # As a Celery worker does once it is ready (config.celery): the relay runs there.
        from config.startup import settle_process_heap

        print(f"heap settled as a worker's at start: {settle_process_heap():,} objects frozen")


def make_entries(kind: str, address: str, url_env: str, round_no: int = 0) -> tuple[Any, int]:
    """N dead letters stored the way ingest stores them (``dlq.capture.ingest.store_batch``: search
    text of the 1 KiB text body plus headers, ~1.3 KB; fingerprint, group, every index), so the
    relay's updates pay what they pay in production."""
    from brokers.base import Address
    from brokers.base import DeadLetter as Letter
    from channels_registry.models import Broker, Channel
    from dlq.capture.ingest import store_batch
    from dlq.models import Source

    broker, _ = Broker.objects.get_or_create(name=f"bench-{kind}", kind=kind, url_env=url_env)
    channel = Channel.objects.create(
        broker=broker, name=f"bench {kind} {round_no}", slug=f"bench-{kind}-{round_no}",
        address=address, address_group="workers" if kind in ("redis", "nats") else "",
        dlq_address=f"{address}.dlq", semantic="at-least-once", idempotency_source="header",
        idempotency_key="Idempotency-Key",
    )  # fmt: skip
    words = [os.urandom(4).hex() for _ in range(400)]
    for start in range(0, N, 1000):
        letters = []
        for i in range(start, min(start + 1000, N)):
            text = " ".join(words[(i * 7 + k) % 400] for k in range(113))  # ~1 KiB of words
            body = (f'{{"order": {i}, "note": "{text}"}}'.encode())[:1024].ljust(1024, b" ")
            letters.append(
                Letter(
                    dedupe_key=f"bench:{kind}:{round_no}:{i}",
                    body=body,
                    headers={
                        "Idempotency-Key": f"k-{round_no}-{i}",
                        "x-death": [{"queue": address, "count": 1, "reason": "rejected"}],
                        "x-first-death-queue": address,
                        "x-first-death-reason": "rejected",
                        "content-type": "application/json",
                        "traceparent": f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01",
                    },
                    properties={"content_type": "application/json", "message_id": f"m-{i}"},
                    token=i,
                    broker_id=str(i),
                    reason="rejected",
                    first_death_queue=address,
                )
            )
        store_batch(channel, letters, Source.DLQ, Address(f"{address}.dlq"))
    return channel, N


def relay(channel: Any) -> float:
    """Freeze (and approve: N is above the four-eyes threshold) a plan, run it; msgs/s."""
    from django.contrib.auth.models import User

    from audit.actions import Actor
    from dlq.models import DeadLetter, PlanStatus
    from dlq.plans import freeze, relay
    from dlq.plans.actions import do_approve_plan, do_create_plan
    from dlq.plans.preview import Selection
    from dlq.triage.filters import EntryFilter

    requester, _ = User.objects.get_or_create(username="bench-requester")
    approver, _ = User.objects.get_or_create(username="bench-approver")
    selection = Selection(EntryFilter(channel=channel.slug))
    started = time.monotonic()
    plan, _ = do_create_plan(
        "replay", selection, DeadLetter.objects.all(), actor=Actor.for_user(requester),
        reason="bench", velocity=None,
    )  # fmt: skip
    if plan.status == PlanStatus.FREEZING:  # the background job's part (bench/freeze.py)
        plan = freeze.freeze_to_end(plan.pk)
    if plan.status == PlanStatus.AWAITING_APPROVAL:
        do_approve_plan(plan.pk, actor=Actor.for_user(approver), reason="bench")
    frozen = time.monotonic() - started
    stages = Stages() if STAGES else None
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    if stages is not None:
        with stages:
            result = relay.run_plan(plan.pk, max_seconds=600)
    else:
        result = relay.run_plan(plan.pk, max_seconds=600)
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = after.ru_utime - cpu.ru_utime + after.ru_stime - cpu.ru_stime
    plan.refresh_from_db()
    assert plan.status == PlanStatus.DONE and plan.confirmed == N, (plan.status, plan.confirmed)
    rate = N / elapsed
    print(f"  freeze plan: {N} items (request audited per chunk) in {frozen:.2f} s")
    print(f"  relay:       {result.confirmed}/{N} confirmed, state per message, audit per batch, "
          f"in {elapsed:.2f} s = {rate:,.0f} msg/s")  # fmt: skip
    # The relay's process, every thread (one interpreter lock): what less Python would save.
    print(f"  relay CPU:   {1e6 * used / N:.1f} us/msg in this process (user + system)")
    if stages is not None:
        stages.report(N)
    return rate


class ThreadCpu:
    """CPU per thread of this process during a block (``/proc/self/task``, sampled every
    50 ms so that a thread that ends inside the block still counts), by thread name. Mostly
    Python run under the interpreter lock, plus the C it calls (JSON, the drivers): which
    thread competes for the lock. Empty where there is no ``/proc``."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, float, float]] = {}  # tid -> (name, first, last)
        self._stop = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _sample(self) -> None:
        names = {t.native_id: t.name for t in threading.enumerate()}
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return
        for tid_text in tids:
            tid = int(tid_text)
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended meanwhile
            used = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
            name = re.sub(r"_\d+$", "", names.get(tid, f"thread {tid}"))
            first = self.seen.get(tid, (name, used, used))[1]
            self.seen[tid] = (name, first, used)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def __enter__(self) -> ThreadCpu:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="bench-cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()

    def report(self, n: int) -> None:
        by_name: dict[str, float] = {}
        for name, first, last in self.seen.values():
            by_name[name] = by_name.get(name, 0.0) + last - first
        for name, seconds in sorted(by_name.items(), key=lambda kv: -kv[1]):
            if seconds > 0:
                print(f"    {1e6 * seconds / n:7.1f} us/msg  CPU of thread {name}")


class Stages:
    """``BENCH_STAGES=1``: wall time of the relay's steps and of its connection's statements
    (by their first words), reported per message, and the CPU of each of this process's
    threads (``ThreadCpu``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.threads = ThreadCpu()

    def _add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def _timed(self, name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._add(name, time.perf_counter() - started)

        return wrapper

    def _statement(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            # Savepoints by their verb alone: Django names each one anew.
            words = " ".join(re.sub(r'"s\d+_x\d+"', "", sql).split()[:4])[:60]
            self._add(f"sql: {words}", time.perf_counter() - started)

    def __enter__(self) -> Stages:
        from django.db import connection

        from dlq.plans import relay
        from dlq.plans.relay_publish import Publishers

        self._saved = [(relay, "take_batch", relay.take_batch),
                       (relay, "record_outcomes", relay.record_outcomes),
                       (Publishers, "publish", Publishers.publish)]  # fmt: skip
        relay.take_batch = self._timed("step: claim (take_batch)", relay.take_batch)
        relay.record_outcomes = self._timed("step: record outcomes", relay.record_outcomes)
        Publishers.publish = self._timed("step: publish+confirm (publisher thread)",
                                         Publishers.publish)  # type: ignore[method-assign]  # fmt: skip
        self._wrapper = connection.execute_wrapper(self._statement)
        self._wrapper.__enter__()
        self.threads.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.threads.__exit__()
        self._wrapper.__exit__(None, None, None)
        for owner, name, original in self._saved:
            setattr(owner, name, original)

    def report(self, n: int) -> None:
        """Per message, and how often each ran (a database round trip per statement)."""
        for name, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1])[:14]:
            print(f"    {1e6 * seconds / n:7.1f} us/msg  {self.calls[name]:6d}x  {name}")
        self.threads.report(n)


def _shovel_rate(ch: Any, queue: str, moved: str) -> float:
    """The broker's own "move messages" of the N messages in ``queue``: msgs/s."""
    import httpx

    shovel = {
        "value": {
            "src-protocol": "amqp091", "src-uri": "amqp://", "src-queue": queue,
            "dest-protocol": "amqp091", "dest-uri": "amqp://", "dest-queue": moved,
            "src-delete-after": "queue-length", "ack-mode": "on-confirm",
        }
    }  # fmt: skip
    name = f"bench-{RUN}-{uuid.uuid4().hex[:6]}"
    with httpx.Client(auth=("guest", "guest"), timeout=10) as api:
        started = time.monotonic()
        api.put(f"{API}/parameters/shovel/%2F/{name}", json=shovel).raise_for_status()
        deadline = started + 300
        count = 0
        while count < N and time.monotonic() < deadline:
            count = ch.queue_declare(moved, passive=True).method.message_count or 0
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        api.delete(f"{API}/parameters/shovel/%2F/{name}")
    rate = count / elapsed
    print(f"  shovel move: {count}/{N} in {elapsed:.2f} s = {rate:,.0f} msg/s")
    return rate


def _median_line(label: str, ratios: list[float], target: float = 0.5) -> None:
    shown = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"  {label} ratio: {statistics.median(ratios):.2f}x (median of {shown}; "
          f"target >= {target:g}x)")  # fmt: skip


def bench_rabbitmq() -> None:
    """Per round: fresh entries, the relay replays them into a queue (project), then the
    shovel moves them on (peer); the printed ratio is the median over the rounds."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = connection.channel()
    os.environ["DLO_BROKER_BENCH_RABBIT_URL"] = AMQP_URL
    print(f"RabbitMQ: {N} persistent 1 KiB messages, {ROUNDS} rounds")
    ratios = []
    for round_no in range(ROUNDS):
        queue, moved = f"bench-replay-{RUN}-{round_no}", f"bench-replay-{RUN}-{round_no}-moved"
        ch.queue_declare(queue, durable=True)
        ch.queue_declare(moved, durable=True)
        try:
            channel, _ = make_entries("rabbitmq", queue, "DLO_BROKER_BENCH_RABBIT_URL", round_no)
            relay_rate = relay(channel)
            depth = ch.queue_declare(queue, passive=True).method.message_count
            assert depth == N, depth
            ratios.append(relay_rate / _shovel_rate(ch, queue, moved))
            print(f"  round {round_no + 1}: relay/shovel {ratios[-1]:.2f}x")
        finally:
            ch.queue_delete(queue)
            ch.queue_delete(moved)
    connection.close()
    _median_line("relay/shovel", ratios)


def _raw_publish_rate(kind: str, url: str, target: str) -> float:
    """The same client publishing N messages in pipelined batches, no database: msgs/s."""
    from brokers import get_adapter
    from brokers.base import Address, OutgoingMessage

    body = os.urandom(512).hex().encode()
    messages = [OutgoingMessage(str(i), body, {"Idempotency-Key": f"r-{i}",
                                               "x-dlq-replay-id": f"raw:{RUN}:{target}:{i}"})
                for i in range(N)]  # fmt: skip
    adapter = get_adapter(kind, url)
    with adapter.publisher(Address(target)) as publisher:
        started = time.monotonic()
        confirmed = 0
        for start in range(0, N, 500):
            confirmed += sum(o.confirmed for o in publisher.publish(messages[start : start + 500]))
        elapsed = time.monotonic() - started
    rate = confirmed / elapsed
    print(f"  bare pipelined publish (batches of 500, no database): {confirmed}/{N} in "
          f"{elapsed:.2f} s = {rate:,.0f} msg/s")  # fmt: skip
    return rate


def bench_redis() -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    os.environ["DLO_BROKER_BENCH_REDIS_URL"] = REDIS_URL
    print(f"Redis Streams: {N} 1 KiB messages, {ROUNDS} rounds")
    ratios = []
    for round_no in range(ROUNDS):
        stream = f"bench-replay-{RUN}-{round_no}"
        try:
            channel, _ = make_entries("redis", stream, "DLO_BROKER_BENCH_REDIS_URL", round_no)
            relay_rate = relay(channel)
            ratios.append(relay_rate / _raw_publish_rate("redis", REDIS_URL, f"{stream}-raw"))
            print(f"  round {round_no + 1}: relay/raw {ratios[-1]:.2f}x")
        finally:
            client.delete(stream, f"{stream}-raw")
    client.close()
    # Issue 24: 0.25x here, the peer being a pipelined publish with no bookkeeping at all.
    _median_line("relay/raw", ratios, target=0.25)


def bench_nats() -> None:
    import nats

    async def admin(stream: str, create: bool) -> None:
        nc = await nats.connect(NATS_URL, connect_timeout=2, max_reconnect_attempts=0)
        js = nc.jetstream()
        if create:
            await js.add_stream(name=stream, subjects=[stream, f"{stream}.raw"])
        else:
            await js.delete_stream(stream)
        await nc.close()

    os.environ["DLO_BROKER_BENCH_NATS_URL"] = NATS_URL
    print(f"NATS JetStream: {N} 1 KiB messages, {ROUNDS} rounds")
    ratios = []
    for round_no in range(ROUNDS):
        stream = f"BENCH_REPLAY_{RUN}_{round_no}"
        asyncio.run(admin(stream, True))
        try:
            channel, _ = make_entries("nats", stream, "DLO_BROKER_BENCH_NATS_URL", round_no)
            relay_rate = relay(channel)
            ratios.append(relay_rate / _raw_publish_rate("nats", NATS_URL, f"{stream}.raw"))
            print(f"  round {round_no + 1}: relay/raw {ratios[-1]:.2f}x")
        finally:
            asyncio.run(admin(stream, False))
    _median_line("relay/raw", ratios)


def _bare_stomp_rate(queue: str) -> float:
    """stomp.py alone: N persistent sends, a receipt on every 500th and the last, waited for
    (ActiveMQ handles a connection's frames in order: the last receipt covers the rest)."""
    import threading

    import stomp

    body = os.urandom(512).hex().encode()
    got: set[str] = set()
    cond = threading.Condition()

    class Receipts(stomp.ConnectionListener):
        def on_receipt(self, frame: Any) -> None:
            with cond:
                got.add(frame.headers["receipt-id"])
                cond.notify_all()

    conn = stomp.Connection12([("127.0.0.1", 61613)], auto_decode=False, timeout=10)
    conn.set_listener("r", Receipts())
    conn.connect(wait=True)
    try:
        started = time.monotonic()
        for i in range(N):
            headers = {"persistent": "true", "Idempotency-Key": f"r-{i}"}
            if i % 500 == 499 or i == N - 1:
                headers["receipt"] = f"r{i}"
            conn.send(f"/queue/{queue}", body, headers=headers)
        with cond:
            assert cond.wait_for(lambda: f"r{N - 1}" in got, 120), "no receipt"
        elapsed = time.monotonic() - started
    finally:
        conn.disconnect()
        conn.transport.disconnect_socket()
    rate = N / elapsed
    print(
        f"  bare STOMP publish (stomp.py, no database): {N} in {elapsed:.2f} s = {rate:,.0f} msg/s"
    )
    return rate


def _empty_activemq(queue: str) -> None:
    from brokers import get_adapter
    from brokers.base import Address

    with get_adapter("activemq", STOMP_URL, timeout=10.0).drain(Address(queue)) as session:
        for _ in range(2 * N // 100 + 10):  # ActiveMQ pages 200 at a time: bounded
            batch = session.fetch(500, wait_s=1.0)
            if not batch:
                return
            session.ack(batch)


def bench_activemq() -> None:
    os.environ["DLO_BROKER_BENCH_ACTIVEMQ_URL"] = STOMP_URL
    print(f"ActiveMQ Classic: {N} persistent 1 KiB messages, {ROUNDS} rounds")
    ratios = []
    for round_no in range(ROUNDS):
        queue = f"bench-replay-{RUN}-{round_no}"
        try:
            channel, _ = make_entries("activemq", queue, "DLO_BROKER_BENCH_ACTIVEMQ_URL", round_no)
            relay_rate = relay(channel)
            ratios.append(relay_rate / _bare_stomp_rate(f"{queue}-raw"))
            print(f"  round {round_no + 1}: relay/bare STOMP {ratios[-1]:.2f}x")
        finally:
            _empty_activemq(queue)
            _empty_activemq(f"{queue}-raw")
    _median_line("relay/bare STOMP", ratios)


def main() -> None:
    setup_django()
    try:
        for name, run in (("rabbitmq", bench_rabbitmq), ("redis", bench_redis),
                          ("nats", bench_nats), ("activemq", bench_activemq)):  # fmt: skip
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
