"""Running the demo: one producer and one consumer thread per broker, poll + ingest in the
calling (main) thread, a clean stop, a summary.

1. Threads never touch the database; only the main thread does (poll, ingest, declarations),
   so SQLite sees one writer from this process and Ctrl-C lands where the signal handler runs.
2. Pacing: the consumers alternate a *slow* phase (half the producers' rate: backlog grows,
   the board goes LAGGING) and a *fast* one (2.5 times: the backlog drains, CATCHING_UP).
3. Every loop checks the stop event and waits on it (never a bare sleep); every broker call is
   bounded by the links' timeout; a failing link is closed and reopened after a capped,
   jittered backoff. A message whose publish failed is sent again with the same key.
4. Stop (``--seconds`` elapsed, Ctrl-C, SIGTERM): set the event, join each thread with a
   timeout, close the links (unacknowledged deliveries go back to the broker), then one last
   poll + ingest, so the dashboard shows where the run ended.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db.models import Count

from alerts.evaluate import do_evaluate_alerts
from channels_registry.models import BrokerKind, Channel
from channels_registry.polling import do_poll_broker
from dashboard.demo import consumers as c
from dashboard.demo import producers as p
from dashboard.demo.topology import PREFETCH, Found, Names
from dlq.capture.ingest import do_ingest_channel
from dlq.models import DeadLetter

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 5.0  # = the demo brokers' declared poll interval
INGEST_INTERVAL_S = 10.0  # an ingest pass waits ~1 s per empty address: less often
RECONNECT_MAX_S = 5.0
BATCH = 10


@dataclasses.dataclass
class Pace:
    """When consumers are slow and how long each message takes them."""

    rate: float
    slow_s: float
    fast_s: float

    @classmethod
    def for_run(cls, rate: float, seconds: float) -> Pace:
        if seconds:
            return cls(rate, slow_s=min(45.0, 0.4 * seconds), fast_s=max(60.0, seconds))
        return cls(rate, slow_s=45.0, fast_s=60.0)  # cycles until stopped

    def slow(self, elapsed: float) -> bool:
        return elapsed % (self.slow_s + self.fast_s) < self.slow_s

    def work_s(self, elapsed: float) -> float:
        # Fast: 2.5x, since retries add about a third to the load.
        capacity = self.rate * (0.5 if self.slow(elapsed) else 2.5)
        return 1.0 / capacity


@dataclasses.dataclass
class Counters:
    produced: int = 0
    processed: int = 0
    duplicates: int = 0
    retried: int = 0
    dead_lettered: int = 0
    poison: int = 0
    errors: int = 0
    last_error: str = ""
    sent_kinds: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    ROUTE_FIELD = {
        c.Route.PROCESSED: "processed",
        c.Route.DUPLICATE: "duplicates",
        c.Route.RETRY: "retried",
        c.Route.DEAD_LETTER: "dead_lettered",
        c.Route.POISON: "poison",
    }

    def route(self, route: c.Route) -> None:
        with self.lock:
            name = self.ROUTE_FIELD[route]
            setattr(self, name, getattr(self, name) + 1)

    def sent(self, kind: str) -> None:
        with self.lock:
            self.produced += 1
            self.sent_kinds[kind] += 1

    def error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.errors += 1
            self.last_error = f"{where}: {type(exc).__name__}: {exc}"[:300]
        log.warning("demo %s: %s", where, exc)


class BrokerRun:
    """The demo traffic on one broker: its producer, its consumer, their counters."""

    def __init__(
        self,
        found: Found,
        names: Names,
        channel: Channel,
        *,
        pace: Pace,
        started: float,
        seed: int,
        timeout: float,
        dedup_max: int,
    ) -> None:
        self.found, self.names, self.pace, self.started = found, names, pace, started
        self.timeout = timeout
        self.policy = c.RetryPolicy.from_declaration(channel)
        self.dedup = c.DedupStore(ttl_s=float(channel.dedup_ttl_s or 600), max_size=dedup_max)
        self.consumer = c.ReferenceConsumer(channel.address, self.policy, self.dedup)
        self.factory = p.OrderFactory(random.Random(seed), max_attempts=self.policy.max_attempts)
        self.counters = Counters()
        self._unsent: p.Outgoing | None = None
        self.threads: list[threading.Thread] = []

    @property
    def label(self) -> str:
        return self.found.label

    # -- links ----------------------------------------------------------------------------

    def producer_link(self) -> p.ProducerLink:
        n, url, t = self.names, self.found.url, self.timeout
        if self.found.kind == BrokerKind.RABBITMQ:
            return p.RabbitMQProducerLink(url, queue=n.address, timeout=t)
        if self.found.kind == BrokerKind.REDIS:
            return p.RedisProducerLink(url, stream=n.address, timeout=t)
        if self.found.kind == BrokerKind.ACTIVEMQ:
            return p.ActiveMQProducerLink(url, queue=n.address, timeout=t)
        return p.NatsProducerLink(url, subject=n.subject, timeout=t)

    def consumer_link(self) -> c.ConsumerLink:
        n, url, t = self.names, self.found.url, self.timeout
        if self.found.kind == BrokerKind.RABBITMQ:
            return c.RabbitMQConsumerLink(
                url,
                queue=n.address,
                retry_queue=n.retry,
                dead_letter_exchange=n.dlx,
                poison_queue=n.poison,
                prefetch=PREFETCH,
                timeout=t,
            )
        if self.found.kind == BrokerKind.REDIS:
            return c.RedisConsumerLink(
                url,
                stream=n.address,
                group=n.group,
                consumer="demo-worker-1",
                dlq_stream=n.dlq,
                poison_stream=n.poison,
                policy=self.policy,
                timeout=t,
            )
        if self.found.kind == BrokerKind.ACTIVEMQ:
            return c.ActiveMQConsumerLink(
                url, queue=n.address, poison_queue=n.poison, prefetch=PREFETCH, timeout=t
            )
        return c.NatsConsumerLink(
            url,
            stream=n.address,
            durable=n.group,
            dlq_subject=n.dlq_subject,
            poison_subject=n.poison_subject,
            timeout=t,
        )

    # -- loops ----------------------------------------------------------------------------

    def produce(self, link: p.ProducerLink, stop: threading.Event) -> None:
        next_at = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now < next_at:
                stop.wait(next_at - now)
                continue
            if self._unsent is None:
                self._unsent = self.factory.next()
            link.send(self._unsent)  # raises: kept, sent again (same key) after reconnecting
            self.counters.sent(self._unsent.kind)
            self._unsent = None
            next_at = max(next_at + 1.0 / self.pace.rate, now - 1.0)  # no long bursts

    def consume(self, link: c.ConsumerLink, stop: threading.Event) -> None:
        while not stop.is_set():
            for delivery in link.receive(BATCH, 0.5):
                # The simulated work happens first: a stop here leaves the delivery unhandled
                # and unacknowledged, so the broker redelivers it to the next run.
                if stop.wait(self.pace.work_s(time.monotonic() - self.started)):
                    return
                decision = self.consumer.handle(delivery)
                link.settle(delivery, decision)
                self.counters.route(decision.route)

    def _supervise(
        self,
        where: str,
        open_link: Callable[[], Any],
        body: Callable[[Any, threading.Event], None],
        stop: threading.Event,
    ) -> None:
        """Run ``body`` on a fresh link until stopped; reconnect with capped, jittered backoff."""
        failures = 0
        while not stop.is_set():
            link = None
            try:
                link = open_link()
                failures = 0
                body(link, stop)
            except Exception as exc:
                failures += 1
                self.counters.error(f"{self.label} {where}", exc)
                delay = min(RECONNECT_MAX_S, 0.5 * 2 ** min(failures, 6))
                stop.wait(delay * random.uniform(0.5, 1.0))
            finally:
                if link is not None:
                    try:
                        link.close()
                    except Exception as exc:
                        self.counters.error(f"{self.label} {where} close", exc)

    def start(self, stop: threading.Event) -> None:
        for where, opener, body in (
            ("producer", self.producer_link, self.produce),
            ("consumer", self.consumer_link, self.consume),
        ):
            thread = threading.Thread(
                target=self._supervise,
                args=(where, opener, body, stop),
                name=f"demo-{self.found.kind}-{where}",
                daemon=True,  # a thread stuck past its join timeout must not block exit
            )
            thread.start()
            self.threads.append(thread)

    def join(self, timeout: float) -> list[str]:
        """Join each thread (bounded); return the names of those still running."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def report(self) -> dict[str, Any]:
        k = self.counters
        return {
            "broker": self.found.kind,
            "channel": self.names.slug,
            "produced": k.produced,
            "sent_kinds": dict(k.sent_kinds),
            "processed": k.processed,
            "duplicates": k.duplicates,
            "retried": k.retried,
            "dead_lettered": k.dead_lettered,
            "poison": k.poison,
            "errors": k.errors,
            "last_error": k.last_error,
            "dedup_size": len(self.dedup),
            "dedup_high_water": self.dedup.high_water,
            "dedup_bound": self.dedup.max_size,
            "dedup_evicted": self.dedup.evicted,
        }


# -- poll and ingest (main thread) ------------------------------------------------------------


@dataclasses.dataclass
class Ops:
    """The same actions the periodic jobs run (``channels_registry.tasks.poll_broker_task`` and
    ``dlq.tasks.ingest_channel_task`` wrap them), for the demo's own brokers and channels only:
    a process that has only the DEMO_* variables must not poll other brokers (it would mark
    them STALE)."""

    broker_ids: list[int]
    channel_ids: list[int]
    polls: int = 0
    ingested: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)

    def run_once(self) -> None:
        self.poll()
        self.ingest()
        self.evaluate_alerts()

    def evaluate_alerts(self) -> None:
        """As the periodic job does, so the demo's DLQ inflow and lag page without make run."""
        try:
            do_evaluate_alerts()
        except Exception as exc:  # logged and retried at the next tick, like the scheduler
            log.exception("demo alert evaluation failed")
            self.errors.append(f"alerts: {exc}")

    def poll(self) -> None:
        for broker_id in self.broker_ids:
            try:
                outcome = do_poll_broker(broker_id)
                self.polls += outcome.status == "ok"
                self.errors.extend(outcome.errors[:3])
            except Exception as exc:  # logged and retried at the next tick, like the scheduler
                log.exception("demo poll of broker %s failed", broker_id)
                self.errors.append(f"poll: {exc}")
        del self.errors[:-20]  # bounded

    def ingest(self) -> None:
        for channel_id in self.channel_ids:
            try:
                result = do_ingest_channel(channel_id, max_batches=20)
                self.ingested += result.inserted
                self.errors.extend(result.errors[:3])
            except Exception as exc:
                log.exception("demo ingest of channel %s failed", channel_id)
                self.errors.append(f"ingest: {exc}")
        del self.errors[:-20]  # bounded


def ingested_counts(channel: Channel) -> dict[str, int]:
    rows = DeadLetter.objects.filter(channel=channel).values("source").annotate(n=Count("pk"))
    return {str(row["source"]): int(row["n"]) for row in rows}
