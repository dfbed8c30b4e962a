"""Reference producers: the demo's order mix and one confirmed publisher per broker.

Every message carries a fresh UUID as its idempotency key (header ``Idempotency-Key``, and the
AMQP ``message_id``), its schema version, and JSON content. The mix (``MIX``) is what makes
every path of the dashboard light up: valid orders; poison (unparseable bytes, or JSON that
breaks the schema); permanent failures (an unknown customer); transient failures that succeed
within the retry budget; some that exhaust it; and duplicates (the same message sent twice,
as an at-least-once producer does after a lost confirm), which the consumers' dedup absorbs.

Publishing is confirmed on every broker (RabbitMQ publisher confirms + ``mandatory``; Redis
``XADD`` reply; JetStream ``PubAck``) and bounded by the link's timeout.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import json
import random
import uuid
from typing import Any

from dashboard.demo.consumers import (
    KEY_HEADER,
    SCHEMA_HEADER,
    SCHEMA_VERSION,
    PrivateLoop,
    nats_connect,
)

#: Share of each kind of message (the rest are valid orders).
MIX: dict[str, float] = {
    "poison": 0.05,
    "permanent": 0.05,
    "transient": 0.15,
    "exhaust": 0.03,
    "duplicate": 0.02,
}
KINDS = ("valid", *MIX)


@dataclasses.dataclass(frozen=True)
class Outgoing:
    key: str
    body: bytes
    headers: dict[str, str]
    kind: str


class OrderFactory:
    """Deterministic for a given seed. Remembers the last 64 valid orders (bounded) to resend
    some as duplicates."""

    def __init__(self, rng: random.Random, *, max_attempts: int) -> None:
        self.rng = rng
        self.max_attempts = max_attempts
        self.seq = 0
        self._recent: collections.deque[Outgoing] = collections.deque(maxlen=64)

    def _kind(self) -> str:
        roll = self.rng.random()
        for kind, share in MIX.items():
            if roll < share:
                return kind
            roll -= share
        return "valid"

    def next(self) -> Outgoing:
        self.seq += 1
        kind = self._kind()
        if kind == "duplicate":
            if self._recent:
                original = self.rng.choice(self._recent)
                return dataclasses.replace(original, kind="duplicate")
            kind = "valid"
        key = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        headers = {
            KEY_HEADER: key,
            SCHEMA_HEADER: SCHEMA_VERSION,
            "content-type": "application/json",
        }
        if kind == "poison":
            return Outgoing(key, self._poison_body(), headers, kind)
        order: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "order_id": f"ord-{self.seq:07d}",
            "customer": {
                "id": f"cust-{self.rng.randrange(1, 500):04d}",
                "email": f"buyer{self.rng.randrange(1, 500)}@example.test",
            },
            "amount": round(self.rng.uniform(5, 500), 2),
            "currency": "EUR",
            "items": [
                {"sku": f"SKU-{self.rng.randrange(100, 999)}", "qty": self.rng.randrange(1, 4)}
                for _ in range(self.rng.randrange(1, 4))
            ],
        }
        if kind == "permanent":
            order["customer"]["id"] = f"cust-unknown-{self.rng.randrange(1, 50)}"
        elif kind == "transient":
            # Fails 1..budget-1 times, then succeeds within the budget.
            order["demo"] = {"fail_times": self.rng.randrange(1, max(2, self.max_attempts))}
        elif kind == "exhaust":
            order["demo"] = {"fail_times": self.max_attempts + 5}
        body = json.dumps(order, separators=(",", ":")).encode()
        out = Outgoing(key, body, headers, kind)
        if kind == "valid":
            self._recent.append(out)
        return out

    def _poison_body(self) -> bytes:
        choice = self.rng.randrange(4)
        if choice == 0:
            return b'{"schema_version": "1", "order_id": "ord-trunc'  # truncated JSON
        if choice == 1:
            return bytes([0xFF, 0xFE, 0x00, 0x13]) + b"binary garbage"
        if choice == 2:
            return b'{"schema_version": "7", "order_id": "ord-future", "amount": 1}'
        return b'{"schema_version": "1", "order_id": "ord-bad", "amount": "lots"}'


class ProducerLink(abc.ABC):
    @abc.abstractmethod
    def send(self, message: Outgoing) -> None:
        """Publish and wait (bounded) for the broker's confirmation; raise otherwise."""

    @abc.abstractmethod
    def close(self) -> None: ...


class RabbitMQProducerLink(ProducerLink):
    def __init__(self, url: str, *, queue: str, timeout: float) -> None:
        import pika

        params = pika.URLParameters(url)
        params.socket_timeout = timeout
        params.blocked_connection_timeout = timeout
        params.connection_attempts = 1
        params.stack_timeout = timeout
        self.connection = pika.BlockingConnection(params)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.queue = queue

    def send(self, message: Outgoing) -> None:
        import time

        import pika

        self.channel.basic_publish(
            "",
            self.queue,
            message.body,
            pika.BasicProperties(
                delivery_mode=2,
                content_type="application/json",
                message_id=message.key,
                timestamp=int(time.time()),
                headers={k: v for k, v in message.headers.items() if k != "content-type"},
            ),
            mandatory=True,
        )

    def close(self) -> None:
        import pika.exceptions

        try:
            if self.connection.is_open:
                self.connection.close()
        except pika.exceptions.AMQPError:
            pass


class RedisProducerLink(ProducerLink):
    def __init__(self, url: str, *, stream: str, timeout: float, maxlen: int = 100_000) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
        )
        self.stream = stream
        self.maxlen = maxlen

    def send(self, message: Outgoing) -> None:
        fields: dict[Any, Any] = {"body": message.body, **message.headers}
        # Approximate MAXLEN bounds the stream (retention), far above what a demo produces.
        self.client.xadd(self.stream, fields, maxlen=self.maxlen, approximate=True)

    def close(self) -> None:
        self.client.close()


class NatsProducerLink(ProducerLink):
    def __init__(self, url: str, *, subject: str, timeout: float) -> None:
        self.subject = subject
        self.timeout = timeout
        self._loop = PrivateLoop()
        try:
            self.nc = self._loop.run(nats_connect(url, timeout))
            self.js = self.nc.jetstream(timeout=timeout)
        except BaseException:
            self._loop.close()
            raise

    def send(self, message: Outgoing) -> None:
        self._loop.run(self.js.publish(self.subject, message.body, headers=message.headers))

    def close(self) -> None:
        async def shutdown() -> None:
            try:
                import asyncio

                await asyncio.wait_for(self.nc.close(), timeout=self.timeout)
            except Exception:  # best effort
                return

        try:
            self._loop.run(shutdown())
        finally:
            self._loop.close()


class ActiveMQProducerLink(ProducerLink):
    """Persistent STOMP sends, each confirmed by the broker's receipt (the adapter's
    publisher): a TextMessage, as a JMS producer of JSON sends it."""

    def __init__(self, url: str, *, queue: str, timeout: float) -> None:
        from brokers.activemq import ActiveMQAdapter
        from brokers.base import Address

        self.publisher = ActiveMQAdapter(url, timeout=timeout).open_publisher(Address(queue))

    def send(self, message: Outgoing) -> None:
        from brokers.base import BrokerError, OutgoingMessage

        headers = {k: v for k, v in message.headers.items() if k != "content-type"}
        outgoing = OutgoingMessage(message.key, message.body, headers, {"body_type": "text"})
        (outcome,) = self.publisher.publish([outgoing])
        if not outcome.confirmed:
            raise BrokerError(f"not confirmed: {outcome.reason}")

    def close(self) -> None:
        self.publisher.close()
