"""Reference consumers: DOMAIN.md's delivery discipline as working code.

The discipline is broker-neutral and lives in ``ReferenceConsumer.handle``, which turns one
delivery into a ``Decision``; each broker link then *settles* the decision with that broker's
own mechanisms. Per delivery:

1. Read the idempotency key from the ``Idempotency-Key`` header. The key is per message (the
   producer's UUID), never per producer. No key: the message breaks the contract → poison.
2. Dedup check: a key marked within the TTL is a redelivery or a duplicate → ack, no effect.
3. Parse and validate the body (schema ``orders.OrderPlaced`` v1). Unparseable or invalid →
   poison, routed at once to the poison address, never retried.
4. Process. Processing and the dedup mark happen under one lock, the in-memory equivalent of
   one transaction (the channel declares ``mark_in_transaction``): a crash loses both or
   neither.
5. Failures: permanent (the customer does not exist) → dead-letter at once; transient (the
   payment gateway answers 503) → retry after exponential backoff with jitter, capped, until
   the retry budget (attempts) is spent → dead-letter. Every dead letter carries its reason:
   ``reason``, ``x-error-class``, ``x-error-message``, ``x-retry-count``, ``x-attempts``,
   ``x-dead-lettered-at``, ``x-original-address`` and the original headers.
6. Ack only after the decision is durably settled (the copy to the DLQ/poison/retry address
   confirmed by the broker). A failure before the ack means redelivery; step 2 absorbs it.

How each broker settles a decision:

- RabbitMQ: retry = publish to the delay queue with a per-message ``expiration``; when it
  expires the delay queue dead-letters it back to the work queue. Dead letter = as real
  consumers do, ``basic.reject`` with ``requeue=false``, so the broker dead-letters it through
  the work queue's DLX to the DLQ and records ``x-death``. A rejection cannot add headers, so
  the reason travels first: the copy with the reason headers and a marker is published back to
  the work queue (confirmed, then the original acked), and the marked copy is rejected when it
  arrives. Poison = publish to the poison queue. Every publish is confirmed (publisher
  confirms + ``mandatory``), then acked.
  The quorum work queue's ``x-delivery-limit`` is the broker-side safety net of the budget.
- Redis Streams: retry = leave the entry pending in the group; the pending list is the durable
  retry schedule and its idle time the backoff clock (``XPENDING … IDLE``, then ``XCLAIM``).
  Dead letter / poison = ``XADD`` to the DLQ / poison stream and ``XACK`` in one MULTI.
- NATS JetStream: retry = ``nak`` with the backoff delay. Permanent failures and poison are
  copied (with the reason headers, and ``Nats-Stream``/``Nats-Sequence``/``Nats-Subject``
  naming the original) to the DLQ / poison stream, then ``term``-inated; a
  message whose budget is spent is copied to the DLQ stream and ``nak``-ed one last time, so
  the server's ``max_deliver`` (= the budget) gives up on it and publishes MAX_DELIVERIES.
  The dashboard ingests those advisories (see brokers/nats_jetstream.py).
- ActiveMQ Classic (STOMP, client-individual acks): retry = the message sent again to the
  work queue with ``AMQ_SCHEDULED_DELAY`` (the broker's scheduler holds it for the backoff)
  and ``x-retry-count``, confirmed, then the original acked. Dead letter / poison = a copy
  with the reason headers sent to ``DLQ.<queue>`` / the poison queue, confirmed, then acked
  (a STOMP NACK would have the broker dead-letter it, but without the reason headers).

Every store here is bounded: the dedup store by TTL and size, the ledger is two counters.
No Django imports: the links take plain addresses.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import dataclasses
import datetime as dt
import enum
import hashlib
import json
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

KEY_HEADER = "Idempotency-Key"
SCHEMA_HEADER = "schema-version"
SCHEMA_VERSION = "1"


# --- failures ------------------------------------------------------------------------------


class Failure(Exception):
    """A processing failure; ``error_class`` names it in the dead letter's headers."""

    error_class = "Failure"


class PoisonMessage(Failure):
    """The message cannot be understood (unparseable, schema-invalid, no key): never retry."""

    error_class = "PoisonMessage"


class PermanentFailure(Failure):
    """Retrying cannot help (a referenced entity does not exist): dead-letter at once."""

    error_class = "CustomerNotFound"


class TransientFailure(Failure):
    """Retrying later may help (a downstream timeout or 503): retry with backoff."""

    error_class = "PaymentGatewayUnavailable"


# --- the bounded dedup store -----------------------------------------------------------------


class DedupStore:
    """Idempotency keys processed recently, bounded twice (P6): a key expires ``ttl_s`` after
    it was marked, and beyond ``max_size`` keys the least recently marked one is evicted.

    The TTL should outlive the broker's redelivery window (the channel declares it); the size
    bound caps memory when traffic outruns the TTL, at the price of letting a very late
    duplicate through (the processing must tolerate that: here it is idempotent per key within
    the window). Thread-safe. ``high_water`` is the largest size ever held."""

    def __init__(
        self, ttl_s: float, max_size: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if ttl_s <= 0 or max_size <= 0:
            raise ValueError("a dedup store needs a positive TTL and size bound")
        self.ttl_s = ttl_s
        self.max_size = max_size
        self.clock = clock
        self._marked: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.high_water = 0
        self.evicted = 0
        self.expired = 0

    def _expire(self, now: float) -> None:
        # Oldest mark first, so expiry stops at the first live key: amortised O(1).
        while self._marked:
            key, marked_at = next(iter(self._marked.items()))
            if now - marked_at < self.ttl_s:
                break
            del self._marked[key]
            self.expired += 1

    def seen(self, key: str) -> bool:
        with self._lock:
            self._expire(self.clock())
            return key in self._marked

    def mark(self, key: str) -> None:
        with self._lock:
            now = self.clock()
            self._expire(now)
            self._marked[key] = now
            self._marked.move_to_end(key)
            while len(self._marked) > self.max_size:
                self._marked.popitem(last=False)
                self.evicted += 1
            self.high_water = max(self.high_water, len(self._marked))

    def __len__(self) -> int:
        with self._lock:
            return len(self._marked)


# --- retry budget and backoff --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """The channel's declared budget: ``max_attempts`` deliveries in total (the first one
    included), delays ``base_s * factor ** (n - 1)`` capped at ``cap_s``, with jitter."""

    max_attempts: int = 4
    base_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 4.0
    #: The declared retry window (``retry_ttl_s``): past it a transient failure dead-letters
    #: even with attempts left. None: bounded by the attempts alone.
    ttl_s: float | None = None

    @classmethod
    def from_declaration(cls, channel: Any) -> RetryPolicy:
        return cls(
            max_attempts=int(channel.retry_max_attempts or cls.max_attempts),
            base_s=float(channel.backoff_base_s or cls.base_s),
            factor=float(channel.backoff_factor or cls.factor),
            cap_s=float(channel.backoff_cap_s or cls.cap_s),
            ttl_s=float(channel.retry_ttl_s) if channel.retry_ttl_s else None,
        )

    def window_spent(self, first_attempt_at: float, now: float) -> bool:
        return self.ttl_s is not None and now - first_attempt_at >= self.ttl_s

    def delay_s(self, retry: int, jitter: float) -> float:
        """Delay before retry number ``retry`` (1 = the first retry); see ``backoff_delay``."""
        return backoff_delay(retry, self.base_s, self.factor, self.cap_s, jitter)


def backoff_delay(retry: int, base_s: float, factor: float, cap_s: float, jitter: float) -> float:
    """Exponential backoff with "equal jitter": the capped delay ``d = min(cap, base *
    factor ** (retry - 1))`` is kept half fixed and half random, ``d/2 + jitter * d/2`` with
    ``jitter`` in [0, 1). So every delay lies in [d/2, d] and never exceeds the cap, and
    consumers that failed together do not retry in lock-step."""
    exponent = max(0, retry - 1)
    # Cap before multiplying out, so a large retry number cannot overflow.
    capped = cap_s if exponent > 64 else min(cap_s, base_s * factor**exponent)
    jitter = min(max(jitter, 0.0), 1.0)
    return capped / 2 + jitter * capped / 2


def jitter_fraction(*parts: object) -> float:
    """A jitter in [0, 1) derived from ``parts`` (key and attempt): spread across messages, yet
    the same for one message's attempt however often it is computed (Redis recomputes it)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


# --- one delivery, one decision ------------------------------------------------------------


@dataclasses.dataclass
class Delivery:
    """A message as a consumer received it. ``attempt`` counts deliveries, 1 = first."""

    body: bytes
    headers: dict[str, str]
    attempt: int
    token: Any = None

    @property
    def key(self) -> str:
        for name, value in self.headers.items():
            if name.lower() == KEY_HEADER.lower():
                return value
        return ""


class Route(enum.StrEnum):
    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    RETRY = "retry"
    DEAD_LETTER = "dead-letter"
    POISON = "poison"


@dataclasses.dataclass
class Decision:
    route: Route
    delay_s: float = 0.0
    #: For DEAD_LETTER / POISON / RETRY: the headers the copy carries (original + reason).
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    reason: str = ""
    #: DEAD_LETTER only: the budget was spent (vs a permanent failure).
    exhausted: bool = False


def parse_order(body: bytes) -> dict[str, Any]:
    """Parse and validate an ``orders.OrderPlaced`` v1 body; ``PoisonMessage`` otherwise."""
    try:
        order = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PoisonMessage(f"body is not JSON: {exc}") from None
    if not isinstance(order, dict):
        raise PoisonMessage("body is not a JSON object")
    if str(order.get("schema_version")) != SCHEMA_VERSION:
        raise PoisonMessage(f"unknown schema version {order.get('schema_version')!r}")
    missing = [k for k in ("order_id", "customer", "amount") if k not in order]
    if missing:
        raise PoisonMessage(f"missing field(s): {', '.join(missing)}")
    customer = order["customer"]
    if not isinstance(customer, dict) or not isinstance(customer.get("id"), str):
        raise PoisonMessage("customer.id must be a string")
    amount = order["amount"]
    if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
        raise PoisonMessage("amount must be a non-negative number")
    return order


class Ledger:
    """The demo's "business": it books orders. Two counters, so it is bounded too.

    The demo's messages say how the simulated downstream behaves for them (the ``demo`` field),
    so a run is reproducible: ``fail_times`` transient failures, then success."""

    def __init__(self) -> None:
        self.booked = 0
        self.amount = 0.0

    def book(self, order: dict[str, Any], attempt: int) -> None:
        customer = order["customer"]["id"]
        if customer.startswith("cust-unknown"):
            raise PermanentFailure(f"customer {customer} does not exist")
        simulate = order.get("demo") if isinstance(order.get("demo"), dict) else {}
        fail_times = simulate.get("fail_times", 0) if simulate else 0
        if isinstance(fail_times, int) and attempt <= fail_times:
            raise TransientFailure("payment gateway answered 503 Service Unavailable")
        self.booked += 1
        self.amount += float(order["amount"])


FIRST_ATTEMPT_HEADER = "x-first-attempt-at"


def _float_header(headers: dict[str, str], name: str, *, default: float) -> float:
    try:
        return float(headers.get(name, default))
    except ValueError:
        return default


class ReferenceConsumer:
    """The idempotent consumer (see the module docstring for the steps)."""

    def __init__(
        self,
        address: str,
        policy: RetryPolicy,
        dedup: DedupStore,
        ledger: Ledger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.address = address
        self.policy = policy
        self.dedup = dedup
        self.ledger = ledger or Ledger()
        self.clock = clock
        self._process_lock = threading.Lock()

    def handle(self, delivery: Delivery) -> Decision:
        # 1. The key.
        key = delivery.key
        if not key:
            return self._poison(delivery, PoisonMessage(f"no {KEY_HEADER} header"))
        # 2. Dedup check before anything has an effect.
        if self.dedup.seen(key):
            return Decision(Route.DUPLICATE)
        # 3. Parse and validate: poison goes at once, never retried.
        try:
            order = parse_order(delivery.body)
        except PoisonMessage as exc:
            return self._poison(delivery, exc)
        # 4. Process and mark as one unit.
        try:
            with self._process_lock:
                if self.dedup.seen(key):  # a concurrent copy won the race
                    return Decision(Route.DUPLICATE)
                self.ledger.book(order, delivery.attempt)
                self.dedup.mark(key)
        except PermanentFailure as exc:
            return self._dead_letter(delivery, exc, "permanent-failure", exhausted=False)
        except TransientFailure as exc:
            # 5. Retry within the budget (attempts and the declared retry window), else
            #    dead-letter. The first attempt's time travels with the retries.
            now = self.clock()
            first = _float_header(delivery.headers, FIRST_ATTEMPT_HEADER, default=now)
            if self.policy.window_spent(first, now):
                return self._dead_letter(delivery, exc, "retry-window-exhausted", exhausted=True)
            if delivery.attempt < self.policy.max_attempts:
                delay = self.policy.delay_s(
                    delivery.attempt, jitter_fraction(key, delivery.attempt)
                )
                headers = {
                    **delivery.headers,
                    "x-retry-count": str(delivery.attempt),
                    "x-last-error-class": exc.error_class,
                    FIRST_ATTEMPT_HEADER: f"{first:.3f}",
                }
                return Decision(Route.RETRY, delay_s=delay, headers=headers, reason=str(exc))
            return self._dead_letter(delivery, exc, "retry-budget-exhausted", exhausted=True)
        return Decision(Route.PROCESSED)

    def _metadata(self, delivery: Delivery, exc: Failure, reason: str) -> dict[str, str]:
        now = dt.datetime.fromtimestamp(self.clock(), tz=dt.UTC)
        return {
            **delivery.headers,
            "reason": reason,
            "x-error-class": exc.error_class,
            "x-error-message": str(exc)[:500],
            "x-retry-count": str(max(0, delivery.attempt - 1)),
            "x-attempts": str(delivery.attempt),
            "x-dead-lettered-at": now.isoformat(timespec="milliseconds"),
            "x-original-address": self.address,
        }

    def _poison(self, delivery: Delivery, exc: PoisonMessage) -> Decision:
        return Decision(
            Route.POISON, headers=self._metadata(delivery, exc, "poison"), reason=str(exc)
        )

    def _dead_letter(
        self, delivery: Delivery, exc: Failure, reason: str, *, exhausted: bool
    ) -> Decision:
        return Decision(
            Route.DEAD_LETTER,
            headers=self._metadata(delivery, exc, reason),
            reason=f"{reason}: {exc}",
            exhausted=exhausted,
        )


# --- settling decisions on each broker -------------------------------------------------------


class ConsumerLink(abc.ABC):
    """One consuming connection to one broker. Every call is bounded by the link's timeout."""

    @abc.abstractmethod
    def receive(self, max_n: int, wait_s: float) -> list[Delivery]:
        """Up to ``max_n`` deliveries, waiting at most ``wait_s`` for the first."""

    @abc.abstractmethod
    def settle(self, delivery: Delivery, decision: Decision) -> None:
        """Carry out the decision durably, then acknowledge (see the module docstring)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close; unacknowledged deliveries go back to the broker."""


def _text_headers(raw: Mapping[Any, Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in (raw or {}).items():
        key = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        if isinstance(value, bytes):
            out[key] = value.decode("utf-8", "replace")
        elif value is not None:
            out[key] = str(value)
    return out


class RabbitMQConsumerLink(ConsumerLink):
    """Work queue → (delay queue | dead-letter exchange | poison queue), confirmed, then ack."""

    def __init__(
        self,
        url: str,
        *,
        queue: str,
        retry_queue: str,
        dead_letter_exchange: str,
        poison_queue: str,
        prefetch: int,
        timeout: float,
    ) -> None:
        import pika

        params = pika.URLParameters(url)
        params.socket_timeout = timeout
        params.blocked_connection_timeout = timeout
        params.connection_attempts = 1
        params.stack_timeout = timeout
        self.connection = pika.BlockingConnection(params)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.channel.basic_qos(prefetch_count=prefetch)
        self.queue = queue
        self.retry_queue = retry_queue
        self.dead_letter_exchange = dead_letter_exchange
        self.poison_queue = poison_queue
        self._buffer: collections.deque[Delivery] = collections.deque()
        self.rejected = 0  # dead letters handed to the broker's dead-lettering
        self._consumer_tag = self.channel.basic_consume(queue, self._on_message)

    #: Marks the copy carrying a dead letter's reason headers, to be rejected on arrival. Its
    #: value is the replay id the copy was made under ("-" for none): a replay of the dead
    #: letter carries a new ``x-dlq-replay-id``, so it is processed, not rejected again.
    DEAD_LETTER_MARK = "x-demo-dead-letter"
    REPLAY_HEADER = "x-dlq-replay-id"
    #: Broker-owned bookkeeping. A message back from the delay queue carries an ``x-death``
    #: entry with reason ``expired``: that is the backoff, not a death, so it is dropped and
    #: the retry count travels in ``x-retry-count`` instead.
    BROKER_HEADERS = ("x-death", "x-first-death-", "x-last-death-", "x-delivery-count")

    def _on_message(self, _ch: Any, method: Any, props: Any, body: bytes) -> None:
        headers = {
            k: v
            for k, v in _text_headers(props.headers).items()
            if not k.lower().startswith(self.BROKER_HEADERS)
        }
        mark = headers.get(self.DEAD_LETTER_MARK)
        if mark is not None and mark == headers.get(self.REPLAY_HEADER, "-"):
            # The reason is on it: reject it, and the broker dead-letters it with x-death.
            self.channel.basic_reject(method.delivery_tag, requeue=False)
            self.rejected += 1
            return
        retries = headers.get("x-retry-count", "0")
        attempt = (int(retries) if retries.isdigit() else 0) + 1
        self._buffer.append(
            Delivery(body=body, headers=headers, attempt=attempt, token=(method, props))
        )

    def receive(self, max_n: int, wait_s: float) -> list[Delivery]:
        if not self._buffer:
            # Bounded: process_data_events returns after at most wait_s.
            self.connection.process_data_events(time_limit=wait_s)
        out: list[Delivery] = []
        while self._buffer and len(out) < max_n:
            out.append(self._buffer.popleft())
        return out

    def _publish(self, exchange: str, routing_key: str, delivery: Delivery, **props: Any) -> None:
        import pika

        _method, original = delivery.token
        self.channel.basic_publish(
            exchange,
            routing_key,
            delivery.body,
            pika.BasicProperties(
                delivery_mode=2,
                content_type=original.content_type,
                message_id=original.message_id,
                timestamp=original.timestamp,
                **props,
            ),
            mandatory=True,  # unroutable raises UnroutableError: then we do not ack
        )

    def settle(self, delivery: Delivery, decision: Decision) -> None:
        method, _props = delivery.token
        if decision.route == Route.RETRY:
            self._publish(
                "",
                self.retry_queue,
                delivery,
                headers=decision.headers,
                expiration=str(max(1, round(decision.delay_s * 1000))),
            )
        elif decision.route == Route.DEAD_LETTER:
            mark = delivery.headers.get(self.REPLAY_HEADER, "-")
            headers = {**decision.headers, self.DEAD_LETTER_MARK: mark}
            self._publish("", self.queue, delivery, headers=headers)
        elif decision.route == Route.POISON:
            self._publish("", self.poison_queue, delivery, headers=decision.headers)
        self.channel.basic_ack(method.delivery_tag)

    def close(self) -> None:
        import pika.exceptions

        try:
            if self.connection.is_open:
                self.connection.close()  # unacked deliveries return to the queue
        except pika.exceptions.AMQPError:
            pass


class RedisConsumerLink(ConsumerLink):
    """Stream + group → (pending for retry | DLQ stream | poison stream); see module docstring."""

    def __init__(
        self,
        url: str,
        *,
        stream: str,
        group: str,
        consumer: str,
        dlq_stream: str,
        poison_stream: str,
        policy: RetryPolicy,
        timeout: float,
        dlq_maxlen: int = 100_000,
    ) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # Any: redis-py's return types are unions over its sync and async clients.
        self.client: Any = redis.Redis.from_url(
            url,
            socket_timeout=timeout + 1.0,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self.stream, self.group, self.consumer = stream, group, consumer
        self.dlq_stream, self.poison_stream = dlq_stream, poison_stream
        self.policy = policy
        self.timeout = timeout
        self.dlq_maxlen = dlq_maxlen

    def _due_retries(self, max_n: int) -> list[Delivery]:
        """Pending entries whose backoff has elapsed, claimed (XCLAIM with that idle time, so
        two consumers cannot both claim one). Bounded: one page of 4 * max_n entries."""
        min_idle = max(1, round(self.policy.delay_s(1, 0.0) * 1000))
        pending = self.client.xpending_range(
            self.stream, self.group, "-", "+", max_n * 4, idle=min_idle
        )
        due: dict[int, list[Any]] = {}
        for entry in pending:
            entry_id, delivered = entry["message_id"], int(entry["times_delivered"])
            if delivered >= self.policy.max_attempts:
                # Crashed past the budget before dead-lettering: claim now, the consumer
                # dead-letters it on this attempt.
                wait_ms = min_idle
            else:
                wait_ms = round(self.policy.delay_s(delivered, jitter_fraction(entry_id)) * 1000)
            if int(entry["time_since_delivered"]) >= wait_ms:
                due.setdefault(wait_ms, []).append(entry_id)
            if sum(map(len, due.values())) >= max_n:
                break
        counts = {e["message_id"]: int(e["times_delivered"]) for e in pending}
        out: list[Delivery] = []
        for wait_ms, ids in due.items():
            for entry_id, fields in self.client.xclaim(
                self.stream, self.group, self.consumer, wait_ms, ids
            ):
                if fields is None:  # trimmed away meanwhile
                    continue
                out.append(self._delivery(entry_id, fields, counts.get(entry_id, 0) + 1))
        return out

    def _delivery(self, entry_id: bytes, fields: dict[bytes, bytes], attempt: int) -> Delivery:
        body = fields.get(b"body", b"")
        headers = _text_headers({k: v for k, v in fields.items() if k != b"body"})
        return Delivery(body=body, headers=headers, attempt=attempt, token=entry_id)

    def receive(self, max_n: int, wait_s: float) -> list[Delivery]:
        out = self._due_retries(max_n)
        if out:
            return out
        response = self.client.xreadgroup(
            self.group,
            self.consumer,
            {self.stream: ">"},
            count=max_n,
            block=max(1, round(min(wait_s, self.timeout) * 1000)),
        )
        for _stream, entries in response or []:
            out.extend(self._delivery(eid, fields, 1) for eid, fields in entries)
        return out

    def settle(self, delivery: Delivery, decision: Decision) -> None:
        entry_id = delivery.token
        if decision.route == Route.RETRY:
            return  # stays pending: _due_retries claims it after its backoff
        pipe = self.client.pipeline(transaction=True)  # MULTI/EXEC: copy and ack together
        if decision.route in (Route.DEAD_LETTER, Route.POISON):
            target = self.dlq_stream if decision.route == Route.DEAD_LETTER else self.poison_stream
            fields: dict[Any, Any] = {"body": delivery.body}
            fields.update(decision.headers)
            fields.update(
                source_stream=self.stream,
                source_id=entry_id,
                delivery_count=str(delivery.attempt),
            )
            pipe.xadd(target, fields, maxlen=self.dlq_maxlen, approximate=True)
        pipe.xack(self.stream, self.group, entry_id)
        pipe.execute()

    def close(self) -> None:
        self.client.close()  # pending entries stay in the group, claimed again later


class PrivateLoop:
    """A private event loop for a synchronous wrapper around nats-py (one thread only)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        try:
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            if tasks:
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()


async def nats_connect(url: str, timeout: float) -> Any:
    import nats

    async def quiet(_exc: Exception) -> None:
        return None

    return await nats.connect(
        url,
        connect_timeout=timeout,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        error_cb=quiet,
    )


class NatsConsumerLink(ConsumerLink):
    """Durable pull consumer → (nak with delay | DLQ/poison stream copy + term/nak)."""

    def __init__(
        self,
        url: str,
        *,
        stream: str,
        durable: str,
        dlq_subject: str,
        poison_subject: str,
        timeout: float,
    ) -> None:
        self.timeout = timeout
        self.dlq_subject, self.poison_subject = dlq_subject, poison_subject
        self._loop = PrivateLoop()
        try:
            self.nc = self._loop.run(nats_connect(url, timeout))
            self.js = self.nc.jetstream(timeout=timeout)
            self.sub = self._loop.run(self.js.pull_subscribe_bind(durable, stream))
        except BaseException:
            self._loop.close()
            raise

    def receive(self, max_n: int, wait_s: float) -> list[Delivery]:
        async def fetch() -> list[Any]:
            try:
                msgs: list[Any] = await self.sub.fetch(max_n, timeout=max(0.1, wait_s))
            except TimeoutError:
                return []
            return msgs

        return [
            Delivery(
                body=bytes(msg.data),
                headers=dict(msg.headers or {}),
                attempt=int(msg.metadata.num_delivered),
                token=msg,
            )
            for msg in self._loop.run(fetch())
        ]

    def settle(self, delivery: Delivery, decision: Decision) -> None:
        msg = delivery.token

        async def settle() -> None:
            if decision.route in (Route.PROCESSED, Route.DUPLICATE):
                await msg.ack_sync(timeout=self.timeout)
                return
            if decision.route == Route.RETRY:
                await msg.nak(delay=decision.delay_s)
                return
            subject = self.poison_subject if decision.route == Route.POISON else self.dlq_subject
            # The copy names its original (JetStream's RePublish header names), so the
            # dashboard stores one entry per death: the copy, with the cause in its headers.
            named = {
                **(decision.headers or {}),
                "Nats-Stream": msg.metadata.stream,
                "Nats-Sequence": str(msg.metadata.sequence.stream),
                "Nats-Subject": msg.subject,
            }
            # The copy first (PubAck awaited), then give the message up.
            await self.js.publish(subject, delivery.body, headers=named)
            if decision.exhausted:
                await msg.nak()  # max_deliver is reached: the server gives up and advises
            else:
                await msg.term()
            await self.nc.flush(timeout=max(1, round(self.timeout)))

        self._loop.run(asyncio.wait_for(settle(), timeout=self.timeout * 2))

    def close(self) -> None:
        async def shutdown() -> None:
            try:
                await asyncio.wait_for(self.nc.close(), timeout=self.timeout)
            except Exception:  # best effort: the socket goes with the loop
                return

        try:
            self._loop.run(shutdown())
        finally:
            self._loop.close()


class ActiveMQConsumerLink(ConsumerLink):
    """Work queue → (work queue, scheduled | DLQ.<queue> | poison queue), each copy confirmed
    by a receipt, then the original acknowledged (client-individual)."""

    #: ActiveMQ's scheduling headers: set anew on each retry, never carried over.
    SCHEDULE_HEADERS = ("AMQ_SCHEDULED_DELAY", "scheduledJobId")

    def __init__(
        self, url: str, *, queue: str, dlq: str, poison_queue: str, timeout: float
    ) -> None:
        from brokers.activemq import ActiveMQAdapter
        from brokers.base import Address

        self.adapter = ActiveMQAdapter(url, timeout=timeout)
        self.session = self.adapter.open_drain(Address(queue))
        self.queue, self.dlq, self.poison_queue = queue, dlq, poison_queue
        self.timeout = timeout
        self.publishers: dict[str, Any] = {}

    def receive(self, max_n: int, wait_s: float) -> list[Delivery]:
        out = []
        for letter in self.session.fetch(max_n, min(wait_s, self.timeout)):
            headers = {
                k: v
                for k, v in _text_headers(letter.headers).items()
                if k not in self.SCHEDULE_HEADERS
            }
            retries = headers.get("x-retry-count", "0")
            attempt = (int(retries) if retries.isdigit() else 0) + 1
            out.append(Delivery(body=letter.body, headers=headers, attempt=attempt, token=letter))
        return out

    def _send(self, queue: str, delivery: Delivery, headers: dict[str, str]) -> None:
        from brokers.base import Address, BrokerError, OutgoingMessage

        publisher = self.publishers.get(queue)
        if publisher is None:
            publisher = self.publishers[queue] = self.adapter.open_publisher(Address(queue))
        message = OutgoingMessage(
            str(delivery.token.broker_id), delivery.body, headers, {"body_type": "text"}
        )
        (outcome,) = publisher.publish([message])
        if not outcome.confirmed:  # not acked: the broker redelivers the original
            raise BrokerError(f"copy to {queue} not confirmed: {outcome.reason}")

    def settle(self, delivery: Delivery, decision: Decision) -> None:
        if decision.route == Route.RETRY:
            delay_ms = str(max(1, round(decision.delay_s * 1000)))
            headers = {**decision.headers, "AMQ_SCHEDULED_DELAY": delay_ms}
            self._send(self.queue, delivery, headers)
        elif decision.route == Route.DEAD_LETTER:
            self._send(self.dlq, delivery, decision.headers)
        elif decision.route == Route.POISON:
            self._send(self.poison_queue, delivery, decision.headers)
        self.session.ack([delivery.token])

    def close(self) -> None:
        for publisher in self.publishers.values():
            try:
                publisher.close()
            except Exception:  # closing a broken session must not hide the others
                continue
        self.session.close()  # unacknowledged deliveries go back to the queue
