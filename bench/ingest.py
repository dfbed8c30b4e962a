"""Ingest throughput (hand-run): ``DATABASE_URL=postgres://…/db python -m bench.ingest``.

Drains N dead letters (default 20,000 persistent messages; 1 KiB JSON bodies with the headers
real dead letters carry: x-death, x-first-death-*, an idempotency key, an exception class and
message, a trace id, a tenant) from one durable RabbitMQ queue into PostgreSQL through
``dlq.capture.ingest`` (COPY + INSERT ON CONFLICT DO NOTHING, failure groups, one audit event per
batch, commit, then ack, then the search index), versus a bare pika consume + multiple-ack
loop over the same N messages on the same queue. Peer and project run interleaved
``BENCH_ROUNDS`` times (default 3) in one run; the ratio line is the median of the rounds.
Target: ingest >= 0.5x the bare loop. The queue is deleted at the end; the rows stay.

Search freshness is measured from outside, on a connection of its own: every 200 ms during
ingest, the age of the oldest stored entry of the round that the text filter cannot find yet
(no ``SearchText`` row); the report gives its p50, p95 and maximum over the polls.

CPU per message is printed for both sides (medians over the rounds): this process's (user +
system, every thread) and the whole machine's busy time (``/proc/stat``: the broker, PostgreSQL
and the kernel included), beside what the machine had (cores × wall time per message). On a
machine that is nearly all busy during ingest, the ratio can only rise by using less CPU per
message somewhere, not by overlapping more.

The process settles its heap after start-up as a Celery worker does (``config.celery``);
``BENCH_SETTLE_HEAP=0`` leaves it as it is, to compare.
"""

from __future__ import annotations

import datetime as dt
import os
import resource
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable

import django
import pika

N = int(os.environ.get("BENCH_MESSAGES", "20000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BODY_BYTES = 1024
URL = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def fill(queue: str, run: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    for i in range(N):
        head = (
            b'{"order": {"id": %d, "customer": "c-%d", "lines": [{"sku": "A-1", "qty": 2}]},'
            b' "run": "%s", "note": "' % (i, i % 977, run.encode())
        )
        # Exactly 1 KiB, with varied text so the search text is as long as a real one.
        filler = (b"%d lorem ipsum dolor sit amet " % i) * 40
        body = head + filler[: BODY_BYTES - len(head) - 2] + b'"}'
        death = {
            "count": 3,
            "reason": "rejected",
            "queue": "orders",
            "exchange": "orders.exchange",
            "routing-keys": ["orders.created"],
            "time": now,
        }
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
                    "x-exception-class": "com.example.orders.OrderNotFoundException",
                    "x-exception-message": f"order {i} not found in the orders service",
                    "x-exception-stacktrace": "at com.example.orders.Handler.handle(Handler"
                    f".java:{40 + i % 60})\nat com.example.Listener.onMessage(Listener.java:88)",
                    "traceparent": f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
                    "x-tenant": f"tenant-{i % 31}",
                    "schema-version": "3",
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


def _cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class CpuMeter:
    """CPU used during a block, per message: this process's and the machine's (busy time from
    ``/proc/stat``; none where there is no such file), and the machine's capacity (cores ×
    wall)."""

    def __init__(self) -> None:
        self.process: list[float] = []
        self.machine: list[float] = []
        self.capacity: list[float] = []

    @staticmethod
    def _machine_busy() -> float | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        # user, nice, system, irq, softirq (guest time is inside user); not idle, iowait, or
        # steal (time the hypervisor gave to someone else).
        busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
        return busy / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _process() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def measure(self, run: Callable[[], float]) -> float:
        """Run ``run()`` (it returns its wall time in seconds); note its CPU per message."""
        process, machine = self._process(), self._machine_busy()
        wall = run()
        self.process.append(1e6 * (self._process() - process) / N)
        busy = self._machine_busy()
        if machine is not None and busy is not None:
            self.machine.append(1e6 * (busy - machine) / N)
            self.capacity.append(1e6 * _cpus() * wall / N)
        return wall

    def line(self) -> str:
        text = f"process {statistics.median(self.process):4.0f} us/msg"
        if self.machine:
            text += (
                f", machine busy {statistics.median(self.machine):4.0f} us/msg of"
                f" {statistics.median(self.capacity):4.0f} (cores x wall)"
            )
        return text


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


class FreshnessProbe:
    """Polls the age of the oldest stored, not yet searchable entry of a channel (see the
    module docstring) on its own thread and connection until stopped."""

    POLL_S = 0.2

    def __init__(self, channel_id: int, after_id: int) -> None:
        self.channel_id, self.after_id = channel_id, after_id
        self.ages: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FreshnessProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import psycopg

        # The first entry by id with no index row: one ingester stores a channel's entries in
        # id order with non-decreasing times, so it is the oldest not yet searchable, and every
        # entry before it is searchable for good. The next poll starts there instead of at the
        # round's first entry (walking the whole round every poll cost ~5 % of the machine's
        # CPU during ingest, which the ingest it measures then lacked).
        sql = (
            "SELECT d.id, extract(epoch FROM clock_timestamp() - d.ingested_at) "
            "FROM dlq_deadletter d WHERE d.channel_id = %s AND d.id > %s "
            "AND d.search_text <> '' AND NOT EXISTS "
            "(SELECT 1 FROM dlq_searchtext s WHERE s.entry_id = d.id) ORDER BY d.id LIMIT 1"
        )
        after = self.after_id
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
            for _ in range(100_000):  # bounded: ~5.5 hours of polls
                if self._stop.wait(self.POLL_S):
                    return
                row = conn.execute(sql, (self.channel_id, after)).fetchone()
                if row is None:
                    self.ages.append(0.0)
                    continue
                after = row[0] - 1
                self.ages.append(float(row[1]))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("Set DATABASE_URL to a PostgreSQL database for the benchmark.")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # As production runs (DEBUG is off there): no per-statement SQL log (DEBUG=1 to compare).
    os.environ.setdefault("DEBUG", "0")
    os.environ["DLO_BROKER_BENCH_INGEST_URL"] = URL
    django.setup()
    from django.core.management import call_command

    from channels_registry.models import Broker, Channel
    from dlq.capture.ingest import ingest_channel
    from dlq.models import DeadLetter

    call_command("migrate", verbosity=0)
    if os.environ.get("BENCH_SETTLE_HEAP", "1") != "0":
        # As a Celery worker does once it is ready (config.celery): ingest runs there.
        from config.startup import settle_process_heap

        print(f"heap settled as a worker's at start: {settle_process_heap():,} objects frozen")
    run = uuid.uuid4().hex[:8]
    queue = f"bench.ingest.{run}.dlq"
    broker, _ = Broker.objects.update_or_create(
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
    bare_rates: list[float] = []
    ingest_rates: list[float] = []
    bare_cpu, ingest_cpu = CpuMeter(), CpuMeter()
    results = []

    def ingest() -> float:
        started = time.perf_counter()
        results.append(ingest_channel(channel, max_batches=10_000))
        return time.perf_counter() - started

    ages: list[float] = []
    stored = batches = 0
    for r in range(ROUNDS):
        # Interleaved: each round fills the queue for the peer, drains it, then for ingest.
        fill(queue, f"{run}{r}a")
        bare_rates.append(N / bare_cpu.measure(lambda: bare_loop(queue)))
        fill(queue, f"{run}{r}b")
        after_id = DeadLetter.objects.order_by("-id").values_list("id", flat=True).first() or 0
        with FreshnessProbe(channel.pk, after_id) as probe:
            ingest_rates.append(N / ingest_cpu.measure(ingest))
        result = results[-1]
        ages += probe.ages
        batches += result.batches
        print(
            f"round {r + 1}: bare {bare_rates[-1]:9.0f} msg/s, ingest {ingest_rates[-1]:9.0f}"
            f" msg/s, ratio {ingest_rates[-1] / bare_rates[-1]:.2f}x",
            flush=True,
        )
    stored = DeadLetter.objects.filter(channel=channel).count()
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    left = connection.channel().queue_declare(queue, passive=True).method.message_count
    connection.channel().queue_delete(queue)
    connection.close()
    ratios = [i / b for i, b in zip(ingest_rates, bare_rates, strict=True)]
    print(f"messages: {N} per side per round, {ROUNDS} rounds; stored {stored}, left {left}")
    print(f"bare consume+ack : {statistics.median(bare_rates):9.0f} msg/s (median)")
    print(f"dlq ingest       : {statistics.median(ingest_rates):9.0f} msg/s (median)")
    print(f"CPU, bare        : {bare_cpu.line()}")
    print(f"CPU, ingest      : {ingest_cpu.line()}")
    print(f"ratio ingest/bare: {statistics.median(ratios):.2f}x (target >= 0.5x)")
    print(
        f"search freshness : oldest stored entry not yet searchable, over {len(ages)} polls: "
        f"p50 {_quantile(ages, 0.5):.2f} s, p95 {_quantile(ages, 0.95):.2f} s, "
        f"max {max(ages or [0.0]):.2f} s"
    )


if __name__ == "__main__":
    main()
