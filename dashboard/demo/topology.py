"""What the demo needs on each broker and in the registry.

1. ``detect``: which brokers answer on loopback (URLs overridable by environment variables).
2. ``names_for``: every address of one demo channel, derived from a prefix (default ``demo``).
3. ``contract``: a complete, clean delivery contract (no declaration finding, and nothing the
   declared-vs-observed comparison objects to once the topology exists).
4. ``declare``: the Broker and Channel rows through the audited registry actions; re-running
   changes nothing (no duplicate rows, no audit event when nothing changed).
5. ``create_topology`` / ``teardown_topology``: the queues, streams and consumers (idempotent
   create; delete for ``--reset`` and the tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
from typing import Any

import httpx

from audit.actions import Actor
from brokers import get_adapter
from brokers.base import Address, BrokerError
from brokers.nats_jetstream import ADVISORY_STREAM, drain_consumer_name
from channels_registry.actions import do_save_broker, do_save_channel
from channels_registry.models import Broker, BrokerKind, Channel, redact_url
from dashboard.demo.consumers import nats_connect

#: kind → (URL variable, default URL): where the demo looks for each broker.
URL_ENV: dict[str, tuple[str, str]] = {
    BrokerKind.RABBITMQ: ("DEMO_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"),
    BrokerKind.REDIS: ("DEMO_REDIS_URL", "redis://127.0.0.1:6379/0"),
    BrokerKind.NATS: ("DEMO_NATS_URL", "nats://127.0.0.1:4222"),
    BrokerKind.ACTIVEMQ: ("DEMO_ACTIVEMQ_URL", "stomp://127.0.0.1:61613"),
}
MANAGEMENT_ENV = ("DEMO_RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672")
KINDS = (BrokerKind.RABBITMQ, BrokerKind.REDIS, BrokerKind.NATS, BrokerKind.ACTIVEMQ)
PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,19}$")

RETRY_MAX_ATTEMPTS = 4
PREFETCH = 20
RETENTION_S = 86_400
STREAM_MAX_MSGS = 200_000


class TopologyError(Exception):
    """The broker refused the demo topology (e.g. a queue exists with other arguments)."""


@dataclasses.dataclass(frozen=True)
class Names:
    prefix: str
    kind: str
    broker: str
    slug: str
    address: str
    group: str
    dlq: str
    poison: str
    retry: str = ""  # RabbitMQ: the delay queue
    dlx: str = ""  # RabbitMQ: the work queue's dead-letter exchange
    subject: str = ""  # NATS: where producers publish
    dlq_subject: str = ""
    poison_subject: str = ""


def names_for(prefix: str, kind: str) -> Names:
    if not PREFIX_RE.match(prefix):
        raise ValueError("the prefix is 1-20 lower-case letters or digits, starting with a letter")
    base = {
        "prefix": prefix,
        "kind": kind,
        "broker": f"{prefix}-{kind}",
        "slug": f"{prefix}-{kind}-orders",
    }
    if kind == BrokerKind.RABBITMQ:
        q = f"{prefix}.orders"
        return Names(
            **base,
            address=q,
            group="",
            dlq=f"{q}.dlq",
            poison=f"{q}.poison",
            retry=f"{q}.retry",
            dlx=f"{q}.dlx",
        )
    if kind == BrokerKind.ACTIVEMQ:
        # indiv.> queues dead-letter into their own DLQ.<queue> (the broker's
        # individualDeadLetterStrategy: tests/activemq/activemq.xml), one DLQ per channel.
        q = f"indiv.{prefix}.orders"
        return Names(**base, address=q, group="", dlq=f"DLQ.{q}", poison=f"{prefix}.orders.poison")
    if kind == BrokerKind.REDIS:
        s = f"{prefix}:orders"
        return Names(
            **base, address=s, group="orders-workers", dlq=f"{s}:dlq", poison=f"{s}:poison"
        )
    s = f"{prefix.upper()}_ORDERS"
    return Names(
        **base,
        address=s,
        group="orders-worker",
        dlq=f"{s}_DLQ",
        poison=f"{s}_POISON",
        subject=f"{prefix}.orders.placed",
        dlq_subject=f"{prefix}.orders.dlq",
        poison_subject=f"{prefix}.orders.poison",
    )


# --- 1. detection ----------------------------------------------------------------------------


@dataclasses.dataclass
class Found:
    kind: str
    url_env: str
    url: str
    reachable: bool
    detail: str = ""
    management_url: str = ""

    @property
    def label(self) -> str:
        return str(BrokerKind(self.kind).label)

    def describe(self) -> str:
        where = redact_url(self.url)
        if not self.reachable:
            return f"{self.label:<15} not found at {where} ({self.detail})"
        extra = f" ({self.detail})" if self.detail else ""
        return f"{self.label:<15} found at {where}{extra}"


def detect(timeout: float) -> list[Found]:
    """Ping each broker with a short timeout (every call bounded)."""
    found: list[Found] = []
    for kind in KINDS:
        env, default = URL_ENV[kind]
        url = os.environ.get(env) or default
        item = Found(kind, env, url, reachable=False)
        try:
            get_adapter(kind, url, timeout=timeout).ping()
            if kind == BrokerKind.NATS:
                _jetstream_enabled(url, timeout)
            item.reachable = True
        except BrokerError as exc:
            item.detail = str(exc).splitlines()[0][:200]
        if item.reachable and kind == BrokerKind.RABBITMQ:
            item.management_url, item.detail = _management(url, timeout)
        found.append(item)
    return found


def _jetstream_enabled(url: str, timeout: float) -> None:
    async def check() -> None:
        nc = await nats_connect(url, timeout)
        try:
            await nc.jetstream(timeout=timeout).account_info()
        finally:
            await asyncio.wait_for(nc.close(), timeout=timeout)

    try:
        asyncio.run(check())
    except Exception as exc:
        raise BrokerError(f"NATS answers but JetStream does not: {exc!r}") from None


def _management(amqp_url: str, timeout: float) -> tuple[str, str]:
    """(management URL, note). Without the management API the poller falls back to passive
    declares, which cannot see consumer utilisation or rates."""
    env, default = MANAGEMENT_ENV
    url = os.environ.get(env) or default
    parts = httpx.URL(amqp_url)
    auth = (parts.username or "guest", parts.password or "guest")
    try:
        with httpx.Client(timeout=timeout, auth=auth, trust_env=False) as client:
            client.get(url.rstrip("/") + "/api/overview").raise_for_status()
    except httpx.HTTPError as exc:
        return "", f"management API not reachable at {url}: {type(exc).__name__}; polling by AMQP"
    return url, f"management API at {url}"


# --- 3./4. contract and declarations -------------------------------------------------------


def contract(names: Names) -> dict[str, Any]:
    """The demo channel's declaration: every field the checks look at, stated and consistent
    with what ``create_topology`` builds and what the reference consumer does."""
    return {
        "name": f"Demo orders ({BrokerKind(names.kind).label})",
        "address": names.address,
        "address_group": names.group,
        "owner_team": "demo",
        "description": (
            "Demo traffic from manage.py demo: reference producers and consumers following "
            "the delivery discipline (docs/demo.md)."
        ),
        "semantic": "at-least-once",
        "ordering": "none",
        "ordering_key": "",
        "ordering_rationale": "Orders are independent; retries re-queue, so no order is kept.",
        "single_active_consumer": False,
        "idempotency_source": "header",
        "idempotency_key": "Idempotency-Key",
        "dedup_scope": "per-message",
        "dedup_ttl_s": 600,
        "dedup_store_shared": True,
        "shared_subscription": False,
        "consumer_idempotent": False,
        "mark_in_transaction": True,
        "retry_max_attempts": RETRY_MAX_ATTEMPTS,
        "retry_ttl_s": 120,
        "backoff_base_s": 0.5,
        "backoff_factor": 2.0,
        "backoff_cap_s": 4.0,
        "backoff_jitter": True,
        "max_in_flight": PREFETCH,
        "ack_timeout_s": 30,
        "dlq_strategies": ["ttl-with-backoff", "poison-queue", "dlq-alert"],
        "dlq_address": names.dlq,
        "poison_address": names.poison,
        "retry_address": names.retry,
        "nats_advisory_capture": names.kind == BrokerKind.NATS,
        "dlq_records_reason": True,
        "retention_s": RETENTION_S,
        "schema_name": "orders.OrderPlaced",
        "schema_version": "1",
        "alert_dlq_depth": 10,
        "alert_lag_messages": 150,
        "alert_lag_seconds": 30,
        "alert_oldest_age_s": 120,
        "alert_min_consumers": 1,
        "redact_json_paths": ["$.customer.email"],
        "redact_headers": [],
        "enabled": True,
    }


@dataclasses.dataclass
class Declared:
    broker: Broker
    channel: Channel
    changed: list[str]


def declare(found: Found, names: Names, actor: Actor) -> Declared:
    """Create or update the demo Broker and Channel through the audited actions; nothing is
    saved (and nothing audited) when the rows already match."""
    changed: list[str] = []
    wanted_broker = {
        "kind": found.kind,
        # Stored, not by reference: any process on this database (make run's scheduler, a
        # Celery worker) can then poll the demo brokers without the demo's environment. The
        # URLs are loopback demo credentials; real brokers should use url_env.
        "url_env": "",
        "url_secret": found.url,
        "management_url": found.management_url,
        "enabled": True,
        "poll_interval_s": 5,
    }
    broker = Broker.objects.filter(name=names.broker).first()
    if broker is None:
        broker = do_save_broker(
            Broker(name=names.broker, **wanted_broker), actor=actor, before=None
        )
        changed.append(f"broker {names.broker} declared")
    else:
        before = broker.audit_snapshot()
        old_secret = broker.url_secret
        for field, value in wanted_broker.items():
            setattr(broker, field, value)
        if broker.audit_snapshot() != before or broker.url_secret != old_secret:
            do_save_broker(broker, actor=actor, before=before)
            changed.append(f"broker {names.broker} updated")
    wanted = {"broker": broker, **contract(names)}
    channel = Channel.objects.filter(slug=names.slug).first()
    if channel is None:
        channel = do_save_channel(Channel(slug=names.slug, **wanted), actor=actor, before=None)
        changed.append(f"channel {names.slug} declared")
    else:
        before = channel.audit_snapshot()
        for field, value in wanted.items():
            setattr(channel, field, value)
        if channel.audit_snapshot() != before:
            do_save_channel(channel, actor=actor, before=before)
            changed.append(f"channel {names.slug} updated")
    return Declared(broker, channel, changed)


# --- 5. broker topology --------------------------------------------------------------------


def create_topology(found: Found, names: Names, timeout: float) -> None:
    try:
        {
            BrokerKind.RABBITMQ: _rabbitmq_create,
            BrokerKind.REDIS: _redis_create,
            BrokerKind.NATS: _nats_create,
            BrokerKind.ACTIVEMQ: _activemq_create,
        }[BrokerKind(found.kind)](found.url, names, timeout)
    except TopologyError:
        raise
    except Exception as exc:
        raise TopologyError(
            f"{found.label}: could not create the demo topology: {type(exc).__name__}: {exc}."
            " If it exists with other settings, run `manage.py demo --reset`."
        ) from exc


def teardown_topology(found: Found, names: Names, timeout: float) -> None:
    """Delete the demo's queues/streams/consumers (missing ones are fine)."""
    {
        BrokerKind.RABBITMQ: _rabbitmq_delete,
        BrokerKind.REDIS: _redis_delete,
        BrokerKind.NATS: _nats_delete,
        BrokerKind.ACTIVEMQ: _activemq_delete,
    }[BrokerKind(found.kind)](found.url, names, timeout)


def _pika_connection(url: str, timeout: float) -> Any:
    import pika

    params = pika.URLParameters(url)
    params.socket_timeout = timeout
    params.stack_timeout = timeout
    params.blocked_connection_timeout = timeout
    params.connection_attempts = 1
    return pika.BlockingConnection(params)


def _rabbitmq_create(url: str, names: Names, timeout: float) -> None:
    """A quorum work queue dead-lettering at-least-once to its DLX (→ the DLQ), a delay queue
    whose expired messages go back to the work queue, and a poison queue."""
    connection = _pika_connection(url, timeout)
    try:
        ch = connection.channel()
        quorum = {"x-queue-type": "quorum"}
        ch.exchange_declare(names.dlx, "direct", durable=True)
        ch.queue_declare(names.dlq, durable=True, arguments=quorum)
        ch.queue_bind(names.dlq, names.dlx, routing_key=names.address)
        ch.queue_declare(names.poison, durable=True, arguments=quorum)
        ch.queue_declare(
            names.address,
            durable=True,
            arguments={
                **quorum,
                "x-dead-letter-exchange": names.dlx,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
                # The broker-side safety net of the retry budget (redeliveries after crashes).
                "x-delivery-limit": RETRY_MAX_ATTEMPTS,
            },
        )
        ch.queue_declare(
            names.retry,
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": names.address},
        )
    finally:
        with contextlib.suppress(Exception):
            connection.close()


def _rabbitmq_delete(url: str, names: Names, timeout: float) -> None:
    connection = _pika_connection(url, timeout)
    try:
        for queue in (names.address, names.retry, names.dlq, names.poison):
            ch = connection.channel()
            ch.queue_delete(queue)
        connection.channel().exchange_delete(names.dlx)
    finally:
        with contextlib.suppress(Exception):
            connection.close()


def _redis_client(url: str, timeout: float) -> Any:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def _redis_create(url: str, names: Names, timeout: float) -> None:
    """The work stream with its group; the DLQ and poison streams, created with the dashboard's
    drain group (what ingest would create) so that the poller samples them from the start."""
    import redis

    client = _redis_client(url, timeout)
    try:
        try:
            client.xgroup_create(names.address, names.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
    finally:
        client.close()
    adapter = get_adapter(BrokerKind.REDIS, url, timeout=timeout)
    for stream in (names.dlq, names.poison):
        adapter.prepare_drain(Address(stream))


def _redis_delete(url: str, names: Names, timeout: float) -> None:
    client = _redis_client(url, timeout)
    try:
        client.delete(names.address, names.dlq, names.poison)
    finally:
        client.close()


def _run_nats(url: str, timeout: float, work: Any) -> None:
    async def run() -> None:
        nc = await nats_connect(url, timeout)
        try:
            await work(nc.jetstream(timeout=timeout))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=timeout)

    asyncio.run(run())


def _nats_create(url: str, names: Names, timeout: float) -> None:
    """Three streams (work, DLQ copy, poison copy) bounded by age and count with discard=new
    (publishers see back-pressure; nothing unconsumed is silently dropped), and a durable pull
    consumer with explicit acks, ``max_deliver`` = the retry budget and bounded in-flight."""
    from nats.js.api import (
        AckPolicy,
        ConsumerConfig,
        DeliverPolicy,
        DiscardPolicy,
        RetentionPolicy,
        StorageType,
        StreamConfig,
    )

    async def work(js: Any) -> None:
        for name, subject in (
            (names.address, names.subject),
            (names.dlq, names.dlq_subject),
            (names.poison, names.poison_subject),
        ):
            await js.add_stream(
                StreamConfig(
                    name=name,
                    subjects=[subject],
                    retention=RetentionPolicy.LIMITS,
                    storage=StorageType.FILE,
                    discard=DiscardPolicy.NEW,
                    max_msgs=STREAM_MAX_MSGS,
                    max_age=RETENTION_S,
                )
            )
        await js.add_consumer(
            names.address,
            ConsumerConfig(
                durable_name=names.group,
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=30,
                max_deliver=RETRY_MAX_ATTEMPTS,
                max_ack_pending=PREFETCH,
                description="Dead Letter Office demo consumer",
            ),
        )

    _run_nats(url, timeout, work)
    # The advisory stream must exist before the first dead letter, or its advisory is lost.
    get_adapter(BrokerKind.NATS, url, timeout=timeout).prepare_drain(
        Address(names.address, names.group)
    )


def _nats_delete(url: str, names: Names, timeout: float) -> None:
    import nats.js.errors

    from channels_registry.models import installation_id

    installation = installation_id()

    async def work(js: Any) -> None:
        for name in (names.address, names.dlq, names.poison):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(name)
        # The dashboard's drain consumers for this channel on its advisory stream.
        durable = drain_consumer_name(Address(names.address, names.group), installation)
        for suffix in ("_md", "_term"):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_consumer(ADVISORY_STREAM, durable + suffix)

    _run_nats(url, timeout, work)


def _activemq_create(url: str, names: Names, timeout: float) -> None:
    """ActiveMQ creates a queue with its first consumer (or message); STOMP has no "declare".
    The work and poison queues are created by subscribing once (nothing is taken: the drain
    session acknowledges nothing), so the poller finds them empty from the start. The DLQ
    appears with its first dead letter (an absent DLQ.<queue> holds none)."""
    adapter = get_adapter(BrokerKind.ACTIVEMQ, url, timeout=timeout)
    for queue in (names.address, names.poison):
        with adapter.drain(Address(queue)) as session:
            session.fetch(1, 0.0)  # subscribes; a message taken goes back on close


def _activemq_delete(url: str, names: Names, timeout: float) -> None:
    """STOMP cannot delete a queue: the demo's queues are emptied (bounded) and the broker
    removes empty, unused queues itself (gcInactiveDestinations in tests/activemq)."""
    adapter = get_adapter(BrokerKind.ACTIVEMQ, url, timeout=timeout)
    for queue in (names.address, names.dlq, names.poison):
        with adapter.drain(Address(queue)) as session:
            for _ in range(1000):  # at most 500,000 messages
                batch = session.fetch(500, 0.5)
                if not batch:
                    break
                session.ack(batch)
