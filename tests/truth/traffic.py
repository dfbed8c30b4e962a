"""Real traffic for the truth scenarios: producers and consumers on the real brokers, each on
its own thread with its own connection (pika, redis-py, nats-py), as an application runs them.

Every worker is bounded: it stops when asked (``stop``) or after ``MAX_RUN_S``, and whatever it
created is deleted by ``Traffic.cleanup``. Consumer behaviours (``mode``):

- ``ack``: acknowledge every message; ``slow``: the same, ``delay_s`` per message;
- ``retry``: acknowledge all but ``retries`` of every ``retry_every`` deliveries, the very
  first one included (so a JetStream ack floor never moves: the issue's case), retried later
  the broker's way (RabbitMQ: rejected into a TTL retry queue that dead-letters back; Redis:
  left pending and claimed later with XAUTOCLAIM; NATS: ``nak`` with a delay, ``nak_delay_s``,
  300 s unless told; ActiveMQ: acknowledged and re-sent with ``AMQ_SCHEDULED_DELAY``, a
  second later);
- ``hang``: take a full prefetch and never acknowledge it, connection kept open;
- ``poison``: reject every message back to the queue at once (requeue / nak / re-claim; on
  ActiveMQ over STOMP, a subscription closed without its ack, another one already open).

Every consumer notes the ``x-dlq-replay-id`` of the replayed messages it acknowledges
(``replayed``): what the relay's confirms say reached the origin, seen from the other side.
``dead_letters(n)`` puts dead letters in the DLQ the way an application gives messages up
(a NATS consumer republishes a copy naming its original), for the product's ingest to capture.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pika
import redis
import stomp
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from brokers.base import Address
from brokers.nats_jetstream import close_loop, close_quietly, copy_consumer_name
from channels_registry.models import installation_id

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
RABBIT_MGMT = "http://guest:guest@127.0.0.1:15672"
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
ACTIVEMQ_URL = "stomp://127.0.0.1:61613"
ACTIVEMQ_HOST = ("127.0.0.1", 61613)
MAX_RUN_S = 1800.0  # past the longest soak: a worker never ends inside a scenario
GROUP = "workers"
REPLAY_ID = "x-dlq-replay-id"


def unique(prefix: str) -> str:
    return f"truth-{prefix}-{uuid.uuid4().hex[:10]}"


class Worker:
    """A thread running ``body(stop_event)``; ``stop()`` asks it to end and waits (bounded)."""

    def __init__(self, body: Callable[[threading.Event], None], name: str) -> None:
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                body(self.stop_event)
            except BaseException as exc:  # reported by the scenario, never swallowed
                self.error = exc

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def stop(self, wait_s: float = 10.0) -> None:
        self.stop_event.set()
        self.thread.join(wait_s)


class Traffic:
    """The producers and consumers of one scenario, and the broker objects it created."""

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self.cleanups: list[Callable[[], None]] = []

    def start(self, body: Callable[[threading.Event], None], name: str) -> Worker:
        worker = Worker(body, name)
        self.workers.append(worker)
        return worker

    def errors(self) -> list[str]:
        return [f"{w.thread.name}: {w.error!r}" for w in self.workers if w.error is not None]

    def cleanup(self) -> None:
        for worker in self.workers:
            worker.stop()
        for clean in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                clean()


def _retried(n: int, every: int, retries: int) -> bool:
    """Whether the ``n``-th delivery (from 1) is retried: ``retries`` of every ``every``, the
    very first delivery included."""
    return 1 <= n % every <= retries


def _deadline() -> float:
    return time.monotonic() + MAX_RUN_S


# --- RabbitMQ ---------------------------------------------------------------------------------


def _delete_queues(names: tuple[str, ...]) -> None:
    """Delete the queues, each on a fresh channel when the last one was closed by an error (a
    failed delete closes its channel: the next deletes would fail with it, silently)."""
    c = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    try:
        ch = c.channel()
        for name in names:
            try:
                ch.queue_delete(name)
            except pika.exceptions.AMQPError as exc:
                print(f"truth cleanup: deleting {name}: {exc!r}")
                ch = c.channel()
    finally:
        c.close()


class Rabbit:
    """A work queue with a DLQ and a poison queue (classic queues, DLX to the DLQ) and, for the
    retry scenario, a TTL retry queue that dead-letters back into the work queue."""

    def __init__(self, traffic: Traffic) -> None:
        self.queue, self.dlq, self.poison = unique("q"), unique("dlq"), unique("poison")
        self.retry = self.queue + ".retry"
        connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
        channel = connection.channel()
        channel.queue_declare(self.dlq, durable=False)
        channel.queue_declare(self.poison, durable=False)
        channel.queue_declare(
            self.queue,
            arguments={
                "x-queue-type": "classic",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.retry,
            },
        )
        channel.queue_declare(
            self.retry,
            arguments={
                "x-message-ttl": 1000,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.queue,
            },
        )
        connection.close()

        def delete() -> None:
            _delete_queues((self.queue, self.retry, self.dlq, self.poison))

        traffic.cleanups.append(delete)
        self.traffic = traffic
        self.replayed: set[str] = set()

    def produce(self, rate: float, queue: str | None = None) -> Worker:
        target = queue or self.queue

        def body(stop: threading.Event) -> None:
            connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
            channel = connection.channel()
            end, n = _deadline(), 0
            while not stop.is_set() and time.monotonic() < end:
                channel.basic_publish("", target, f"m{n}".encode())
                n += 1
                connection.process_data_events(time_limit=1.0 / rate)
            connection.close()

        return self.traffic.start(body, f"rabbit-produce-{target}")

    def burst(self, queue: str, count: int) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
        channel = connection.channel()
        for n in range(count):
            channel.basic_publish("", queue, f"dead {n}".encode())
        connection.close()

    def dead_letters(self, count: int) -> None:
        """``count`` messages dead-lettered from the work queue into the DLQ."""
        connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
        channel = connection.channel()
        for n in range(count):
            headers = {"Idempotency-Key": f"dead-{n}", "x-first-death-queue": self.queue}
            properties = pika.BasicProperties(headers=headers, content_type="application/json")
            channel.basic_publish("", self.dlq, b'{"order": %d}' % n, properties)
        connection.close()

    def consume(
        self,
        mode: str = "ack",
        *,
        delay_s: float = 0.0,
        retry_every: int = 5,
        retries: int = 1,
        prefetch: int = 10,
    ) -> Worker:
        def body(stop: threading.Event) -> None:
            connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=prefetch)
            seen = [0]

            def on_message(ch: Any, method: Any, props: Any, _body: bytes) -> None:
                seen[0] += 1
                if mode == "hang":
                    return  # held unacknowledged while the connection stays open
                if mode == "poison":
                    connection.sleep(0.05)  # a hot loop, throttled for the shared machine
                    ch.basic_nack(method.delivery_tag, requeue=True)
                    return
                if delay_s:
                    connection.sleep(delay_s)
                retried = _retried(seen[0], retry_every, retries)
                if mode == "retry" and retried and not method.redelivered:
                    # Parked in the TTL retry queue, back in the work queue a second later.
                    ch.basic_reject(method.delivery_tag, requeue=False)
                    return
                ch.basic_ack(method.delivery_tag)
                replay_id = (props.headers or {}).get(REPLAY_ID)
                if replay_id:
                    self.replayed.add(str(replay_id))

            channel.basic_consume(self.queue, on_message)
            end = _deadline()
            while not stop.is_set() and time.monotonic() < end:
                connection.process_data_events(time_limit=0.2)
            connection.close()  # killed: unacknowledged messages go back to the queue

        return self.traffic.start(body, f"rabbit-consume-{mode}")

    def truth(self) -> dict[str, int | None]:
        """What the broker says now over AMQP (exact, not the 5 s statistics)."""
        connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
        channel = connection.channel()
        main = channel.queue_declare(self.queue, passive=True).method
        dlq = channel.queue_declare(self.dlq, passive=True).method
        poison = channel.queue_declare(self.poison, passive=True).method
        retry = channel.queue_declare(self.retry, passive=True).method
        connection.close()
        return {
            "retry_waiting": retry.message_count,
            "backlog": main.message_count,
            "consumers": main.consumer_count,
            "dlq_total": dlq.message_count,
            "dlq_pending": dlq.message_count,
            "poison_total": poison.message_count,
        }


# --- Redis streams ----------------------------------------------------------------------------


class RedisStreams:
    """A stream with the group ``workers``, a DLQ stream and a poison stream."""

    def __init__(self, traffic: Traffic) -> None:
        self.stream, self.dlq, self.poison = unique("s"), unique("dlq"), unique("poison")
        client = redis.Redis.from_url(REDIS_URL)
        client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        client.xadd(self.dlq, {"init": "1"})
        client.xtrim(self.dlq, maxlen=0)
        client.xadd(self.poison, {"init": "1"})
        client.xtrim(self.poison, maxlen=0)
        client.close()

        def delete() -> None:
            c = redis.Redis.from_url(REDIS_URL)
            c.delete(self.stream, self.dlq, self.poison)
            c.close()

        traffic.cleanups.append(delete)
        self.traffic = traffic
        self.replayed: set[str] = set()

    def produce(self, rate: float) -> Worker:
        def body(stop: threading.Event) -> None:
            client = redis.Redis.from_url(REDIS_URL)
            end, n = _deadline(), 0
            while not stop.is_set() and time.monotonic() < end:
                client.xadd(self.stream, {"n": n})
                n += 1
                stop.wait(1.0 / rate)
            client.close()

        return self.traffic.start(body, "redis-produce")

    def burst(self, stream: str, count: int) -> None:
        client = redis.Redis.from_url(REDIS_URL)
        for n in range(count):
            client.xadd(stream, {"body": f"dead {n}", "reason": "burst"})
        client.close()

    def dead_letters(self, count: int) -> None:
        """``count`` entries a reaper moved into the DLQ stream (the original's fields plus
        where it came from)."""
        client = redis.Redis.from_url(REDIS_URL)
        for n in range(count):
            fields = {"body": json.dumps({"order": n}), "Idempotency-Key": f"dead-{n}"}
            client.xadd(self.dlq, {**fields, "reason": "gave up"})
        client.close()

    def consume(
        self,
        mode: str = "ack",
        *,
        delay_s: float = 0.0,
        retry_every: int = 5,
        retries: int = 1,
        prefetch: int = 10,
    ) -> Worker:
        name = unique("consumer")

        def body(stop: threading.Event) -> None:
            client = redis.Redis.from_url(REDIS_URL)
            end, n = _deadline(), 0
            held = False
            while not stop.is_set() and time.monotonic() < end:
                if mode == "hang":
                    if not held:
                        client.xreadgroup(GROUP, name, {self.stream: ">"}, count=prefetch)
                        held = True
                    stop.wait(0.2)  # alive, holding its pending entries, reading nothing
                    continue
                if mode in ("retry", "poison"):
                    # Claim what waited long enough (retry: a later attempt; poison: at once).
                    idle = 1000 if mode == "retry" else 0
                    _next, claimed, *_ = client.xautoclaim(
                        self.stream, GROUP, name, min_idle_time=idle, count=prefetch
                    )
                    for entry_id, _fields in claimed:
                        if mode == "retry":
                            client.xack(self.stream, GROUP, entry_id)
                    if mode == "poison" and claimed:
                        stop.wait(0.1)
                        continue
                answer = client.xreadgroup(
                    GROUP, name, {self.stream: ">"}, count=prefetch, block=200
                )
                for _stream, entries in answer or []:
                    for entry_id, fields in entries:
                        n += 1
                        if delay_s:
                            stop.wait(delay_s)
                        retried = mode == "retry" and _retried(n, retry_every, retries)
                        if mode == "poison" or retried:
                            continue  # left pending: claimed again later
                        client.xack(self.stream, GROUP, entry_id)
                        replay_id = fields.get(REPLAY_ID.encode())
                        if replay_id:
                            self.replayed.add(replay_id.decode())
            client.close()

        return self.traffic.start(body, f"redis-consume-{mode}")

    def truth(self) -> dict[str, int | None]:
        client = redis.Redis.from_url(REDIS_URL)
        groups = {g["name"].decode(): g for g in client.xinfo_groups(self.stream)}
        group = groups[GROUP]
        dlq_total = client.xlen(self.dlq)
        poison_total = client.xlen(self.poison)
        dlq_groups = {g["name"].decode(): g for g in client.xinfo_groups(self.dlq)}
        client.close()
        ingest = dlq_groups.get("dlo-ingest")
        dlq_pending = (
            dlq_total if ingest is None else int(ingest["lag"] or 0) + int(ingest["pending"])
        )
        return {
            "backlog": group["lag"],
            "in_flight": group["pending"],
            "retry_waiting": group["pending"],
            "dlq_total": dlq_total,
            "dlq_pending": dlq_pending,
            "poison_total": poison_total,
        }


# --- NATS JetStream ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _connection() -> AsyncIterator[nats.NATS]:
    """A nats-py connection closed however the block ends (an error included), bounded, its
    socket aborted if the close cannot flush: no socket left to the garbage collector."""
    nc = await nats.connect(NATS_URL)
    try:
        yield nc
    finally:
        await close_quietly(nc)


class _Loop:
    """One asyncio loop on a thread, for nats-py."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.loop.is_running():
            close_loop(self.loop)  # what a timed-out run left behind is cancelled, not leaked


class Nats:
    """A stream with a durable pull consumer (explicit acks), a DLQ stream and a poison stream."""

    def __init__(self, traffic: Traffic, *, max_deliver: int = -1) -> None:
        tag = uuid.uuid4().hex[:10]
        self.stream, self.dlq, self.poison = f"TRUTH_{tag}", f"TRUTH_DLQ_{tag}", f"TRUTH_P_{tag}"
        self.subject, self.consumer = f"truth.{tag}.work", "workers"
        self.dlq_subject, self.poison_subject = f"truth.{tag}.dlq", f"truth.{tag}.poison"
        self.admin = _Loop()

        async def setup() -> None:
            async with _connection() as nc:
                js = nc.jetstream()
                await js.add_stream(name=self.stream, subjects=[self.subject])
                await js.add_stream(name=self.dlq, subjects=[self.dlq_subject])
                await js.add_stream(name=self.poison, subjects=[self.poison_subject])
                await js.add_consumer(
                    self.stream,
                    ConsumerConfig(
                        durable_name=self.consumer,
                        ack_policy=AckPolicy.EXPLICIT,
                        deliver_policy=DeliverPolicy.ALL,
                        ack_wait=30,
                        max_deliver=max_deliver,
                    ),
                )

        self.admin.run(setup())

        def delete() -> None:
            async def drop() -> None:
                async with _connection() as nc:
                    js = nc.jetstream()
                    for name in (self.stream, self.dlq, self.poison):
                        with contextlib.suppress(Exception):
                            await js.delete_stream(name)

            self.admin.run(drop())
            self.admin.close()

        traffic.cleanups.append(delete)
        self.traffic = traffic
        self.replayed: set[str] = set()

    def _worker(self, make: Callable[[threading.Event], Any], name: str) -> Worker:
        def body(stop: threading.Event) -> None:
            asyncio.run(make(stop))

        return self.traffic.start(body, name)

    def produce(self, rate: float) -> Worker:
        async def run(stop: threading.Event) -> None:
            async with _connection() as nc:
                js = nc.jetstream()
                end, n = _deadline(), 0
                while not stop.is_set() and time.monotonic() < end:
                    with contextlib.suppress(nats.errors.TimeoutError):  # a loaded server: go on
                        await js.publish(self.subject, f"m{n}".encode())
                    n += 1
                    await asyncio.sleep(1.0 / rate)

        return self._worker(run, "nats-produce")

    def burst(self, subject: str, count: int) -> None:
        async def run() -> None:
            async with _connection() as nc:
                js = nc.jetstream()
                for n in range(count):
                    await js.publish(subject, f"dead {n}".encode())

        self.admin.run(run())

    def dead_letters(self, count: int) -> None:
        """``count`` copies the consumer republished into the DLQ stream as it gave messages
        up, each naming its original (JetStream's RePublish headers), so a replay goes back to
        the original's subject."""

        async def run() -> None:
            async with _connection() as nc:
                js = nc.jetstream()
                for n in range(count):
                    headers = {
                        "Nats-Stream": self.stream,
                        "Nats-Sequence": str(1_000_000 + n),
                        "Nats-Subject": self.subject,
                        "Nats-Consumer": self.consumer,
                        "Idempotency-Key": f"dead-{n}",
                        "reason": "gave up",
                    }
                    await js.publish(self.dlq_subject, b'{"order": %d}' % n, headers=headers)

        self.admin.run(run())

    def consume(
        self,
        mode: str = "ack",
        *,
        delay_s: float = 0.0,
        retry_every: int = 25,
        retries: int = 1,
        prefetch: int = 10,
        nak_delay_s: float = 300.0,
    ) -> Worker:
        async def run(stop: threading.Event) -> None:
            async with _connection() as nc:
                js = nc.jetstream()
                sub = await js.pull_subscribe_bind(self.consumer, self.stream)
                end, n = _deadline(), 0
                held = False
                while not stop.is_set() and time.monotonic() < end:
                    if mode == "hang" and held:
                        await asyncio.sleep(0.2)  # alive, holding its messages, pulling nothing
                        continue
                    try:
                        msgs = await sub.fetch(prefetch, timeout=1)
                    except (nats.errors.TimeoutError, nats.js.errors.APIError):
                        continue  # nothing to pull (or a 408/409 on a loaded server): pull again
                    held = True
                    for msg in msgs:
                        n += 1
                        if mode == "hang":
                            continue
                        if mode == "poison":
                            await asyncio.sleep(0.05)  # a hot loop, throttled
                            await msg.nak()
                            continue
                        if delay_s:
                            await asyncio.sleep(delay_s)
                        if mode == "retry" and _retried(n, retry_every, retries):
                            await msg.nak(delay=nak_delay_s)  # retried later: backoff
                            continue
                        await msg.ack()
                        replay_id = (msg.headers or {}).get(REPLAY_ID)
                        if replay_id:
                            self.replayed.add(replay_id)

        return self._worker(run, f"nats-consume-{mode}")

    def truth(self) -> dict[str, int | None]:
        # The installation's id is read here, on the caller's thread (its database connection).
        durable = copy_consumer_name(
            self.dlq, Address(self.stream, self.consumer), installation_id()
        )

        async def read() -> dict[str, int | None]:
            async with _connection() as nc:
                js = nc.jetstream()
                info = await js.consumer_info(self.stream, self.consumer)
                dlq = await js.stream_info(self.dlq)
                poison = await js.stream_info(self.poison)
                # Not yet ingested: what the ingest's durable on the copy stream has not
                # acknowledged (an ack removes nothing); every copy before it exists.
                try:
                    ingest = await js.consumer_info(self.dlq, durable)
                except nats.js.errors.NotFoundError:
                    dlq_pending = dlq.state.messages
                else:
                    dlq_pending = ingest.num_pending + ingest.num_ack_pending
            return {
                "backlog": info.num_pending,
                "in_flight": info.num_ack_pending,
                "dlq_total": dlq.state.messages,
                "dlq_pending": dlq_pending,
                "poison_total": poison.state.messages,
            }

        return self.admin.run(read())


# --- ActiveMQ Classic (STOMP) -----------------------------------------------------------------


class _StompApp(stomp.ConnectionListener):
    """One STOMP connection of an application, its deliveries queued for the worker."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.frames: list[Any] = []
        self.conn = stomp.Connection12([ACTIVEMQ_HOST], auto_decode=False, timeout=5)
        self.conn.set_listener("app", self)
        self.conn.connect(wait=True)

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.frames.append(frame)
            self.cond.notify_all()

    def next(self, timeout: float) -> Any | None:
        with self.cond:
            self.cond.wait_for(lambda: bool(self.frames), timeout)
            return self.frames.pop(0) if self.frames else None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.conn.is_connected():
                self.conn.disconnect()
        self.conn.transport.disconnect_socket()  # killed: unacknowledged messages go back


@contextlib.contextmanager
def _stomp_app() -> Any:
    app = _StompApp()
    try:
        yield app
    finally:
        app.close()


class ActiveMQ:
    """A work queue ``indiv.truth-…`` (the test broker gives ``indiv.>`` queues their own
    ``DLQ.<queue>``, the declared DLQ) and a poison queue."""

    def __init__(self, traffic: Traffic) -> None:
        self.queue = f"indiv.{unique('q')}"
        self.dlq, self.poison = f"DLQ.{self.queue}", unique("poison")
        # A subscription creates a queue (as RabbitMQ's declare does): the poison queue exists
        # from the start. ActiveMQ creates the DLQ with its first dead letter.
        with _stomp_app() as app:
            app.conn.subscribe(f"/queue/{self.poison}", "create", "auto", {"receipt": "made"})
            time.sleep(0.2)

        def delete() -> None:
            # STOMP cannot delete a queue: empty them; the broker removes empty unused queues.
            with _stomp_app() as app:
                for n, name in enumerate((self.queue, self.dlq, self.poison)):
                    app.conn.subscribe(f"/queue/{name}", f"empty-{n}", ack="auto")
                end = time.monotonic() + 20.0
                while time.monotonic() < end and app.next(1.0) is not None:
                    pass

        traffic.cleanups.append(delete)
        self.traffic = traffic
        self.replayed: set[str] = set()

    def produce(self, rate: float) -> Worker:
        def body(stop: threading.Event) -> None:
            with _stomp_app() as app:
                end, n = _deadline(), 0
                while not stop.is_set() and time.monotonic() < end:
                    app.conn.send(f"/queue/{self.queue}", f"m{n}", headers={"persistent": "true"})
                    n += 1
                    stop.wait(1.0 / rate)

        return self.traffic.start(body, "activemq-produce")

    def burst(self, queue: str, count: int) -> None:
        with _stomp_app() as app:
            for n in range(count):
                receipt = f"burst-{n}" if n == count - 1 else None
                headers = {"persistent": "true", **({"receipt": receipt} if receipt else {})}
                app.conn.send(f"/queue/{queue}", f"dead {n}", headers=headers)
            time.sleep(0.5)  # the last receipt's way back; the sends are stored in order

    def dead_letters(self, count: int) -> None:
        """``count`` dead letters in the work queue's ``DLQ.<queue>``, named after their origin
        as the broker names one it dead-letters (``original-destination``)."""
        with _stomp_app() as app:
            for n in range(count):
                headers = {
                    "persistent": "true",
                    "original-destination": f"/queue/{self.queue}",
                    "Idempotency-Key": f"dead-{n}",
                    "content-type": "application/json",
                    **({"receipt": "dead-last"} if n == count - 1 else {}),
                }
                app.conn.send(f"/queue/{self.dlq}", f'{{"order": {n}}}', headers=headers)
            time.sleep(0.5)  # the last receipt's way back; the sends are stored in order

    def consume(
        self,
        mode: str = "ack",
        *,
        delay_s: float = 0.0,
        retry_every: int = 5,
        retries: int = 1,
        prefetch: int = 10,
    ) -> Worker:
        def body(stop: threading.Event) -> None:
            with _stomp_app() as app:
                headers = {"activemq.prefetchSize": str(prefetch)}
                subs = ["a", "b"]
                app.conn.subscribe(f"/queue/{self.queue}", subs[0], "client-individual", headers)
                end, n = _deadline(), 0
                while not stop.is_set() and time.monotonic() < end:
                    frame = app.next(0.2)
                    if frame is None or mode == "hang":
                        continue  # hang: held unacknowledged while the connection stays open
                    n += 1
                    if mode == "poison":
                        # Given back at once: a second subscription first (never no consumer),
                        # then the first closed without its ack; ActiveMQ redelivers.
                        stop.wait(0.05)
                        app.conn.subscribe(
                            f"/queue/{self.queue}", subs[1], "client-individual", headers
                        )
                        app.conn.unsubscribe(subs[0])
                        subs.reverse()
                        continue
                    if delay_s:
                        stop.wait(delay_s)
                    redelivered = frame.headers.get("redelivered") == "true"
                    retried = _retried(n, retry_every, retries)
                    if mode == "retry" and retried and not redelivered:
                        # Retried a second later, the broker's way: re-sent with a delay.
                        app.conn.send(
                            f"/queue/{self.queue}",
                            frame.body,
                            headers={"persistent": "true", "AMQ_SCHEDULED_DELAY": "1000"},
                        )
                    app.conn.ack(frame.headers["ack"])
                    replay_id = frame.headers.get(REPLAY_ID)
                    if replay_id:
                        self.replayed.add(str(replay_id))

        return self.traffic.start(body, f"activemq-consume-{mode}")

    def truth(self) -> dict[str, int | None]:
        """The statistics plugin's own answer for the three queues (an absent DLQ: none)."""
        names = (self.queue, self.dlq, self.poison)
        found: dict[str, dict[str, Any]] = {}
        with _stomp_app() as app:
            app.conn.subscribe(
                "/temp-queue/truth", "stats", "auto", {"transformation": "jms-map-json"}
            )
            for name in names:
                app.conn.send(
                    f"/queue/ActiveMQ.Statistics.Destination.{name}",
                    "",
                    headers={
                        "reply-to": "/temp-queue/truth",
                        "correlation-id": name,
                        "ActiveMQ.Statistics.Destination.List.End.With.Null": "true",
                    },
                )
            ended: set[str] = set()
            end = time.monotonic() + 10.0
            while len(ended) < len(names) and time.monotonic() < end:
                frame = app.next(1.0)
                if frame is None:
                    continue
                name = frame.headers.get("correlation-id", "")
                entry = json.loads(frame.body)["map"]
                if not entry:
                    ended.add(name)
                    continue
                entries = entry["entry"] if isinstance(entry["entry"], list) else [entry["entry"]]
                found[name] = {
                    e["string"]: next(v for k, v in e.items() if k != "string")
                    for e in entries
                    if isinstance(e.get("string"), str)
                }
        assert len(ended) == len(names), f"statistics answered for {sorted(ended)} only"
        main = found.get(self.queue, {})
        size, inflight = int(main.get("size", 0)), int(main.get("inflightCount", 0))
        dlq = int(found.get(self.dlq, {}).get("size", 0))
        return {
            "backlog": size - inflight,
            "in_flight": inflight,
            "consumers": int(main.get("consumerCount", 0)),
            "dlq_total": dlq,
            "dlq_pending": dlq,
            "poison_total": int(found.get(self.poison, {}).get("size", 0)),
        }
