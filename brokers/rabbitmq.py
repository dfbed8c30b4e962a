"""RabbitMQ adapter: AMQP 0-9-1 through pika, statistics through Prometheus or the management API.

Poll paths, cheapest first (chosen from ``management_url``):

1. Prometheus ``/metrics/detailed`` (``management_url`` ends in ``/metrics`` or uses port 15692):
   one request per node. Several nodes are given as a comma-separated list of node URLs; each
   node reports only the queues whose leader/master it hosts, so the answers are merged.
2. Management API ``/api/queues/<vhost>``: paged (500 a page, at most ``max_pages``), with
   ``columns=`` so the broker serialises only what we read.
3. No ``management_url``: one AMQP connection and a passive ``queue.declare`` per queue.

Dead letters are drained with ``basic.consume`` and manual acks; replays are published with
publisher confirms and ``mandatory`` on an asyncio-driven pika connection so that a batch is
pipelined (a window of outstanding confirms) instead of waiting one round trip per message.

Identity (docs/identity.md). RabbitMQ gives a dead letter no id, and a redelivery after a crash
before the ack is byte-identical, so one death is the dead letter as the broker stored it:
vhost, queue, body, properties and headers (minus a quorum queue's ``x-delivery-count``). A
second death differs in its ``x-death`` entries (time, count) and, after a replay, its
``x-dlq-replay-id``; byte-identical copies delivered in one drain session are numbered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import hashlib
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pika
import pika.exceptions
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.blocking_connection import BlockingChannel
from pika.channel import Channel
from pika.spec import Basic, BasicProperties
from prometheus_client.parser import text_string_to_metric_families

from brokers.base import (
    Address,
    BrokerAdapter,
    BrokerError,
    ChannelStats,
    DeadLetter,
    DrainSession,
    OutgoingMessage,
    PollResult,
    Publisher,
    PublishOutcome,
    RetryView,
    Topology,
    json_safe_headers,
)

log = logging.getLogger(__name__)


class _QuietNotFound(logging.Filter):
    """pika logs every ``404 NOT_FOUND`` channel close as a warning, with the connection's repr.
    A missing queue is the adapter's to report (``exists=False``, or a ``BrokerError``), once,
    in its own words; the pika line is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("(404)" in message and "NOT_FOUND" in message)


logging.getLogger("pika.channel").addFilter(_QuietNotFound())

PAGE_SIZE = 500  # the management API's maximum page size
PUBLISH_WINDOW = 2_000  # outstanding (unconfirmed) publishes per publisher

_POLL_COLUMNS = (
    "name,type,messages,messages_ready,messages_unacknowledged,consumers,"
    "consumer_utilisation,arguments,message_stats.publish,message_stats.deliver_get,"
    "message_stats.ack,message_stats.redeliver"
)
_INSPECT_COLUMNS = "name,type,arguments,policy,operator_policy,effective_policy_definition"
_PROM_FAMILIES = ("queue_coarse_metrics", "queue_consumer_count")
_PROPERTY_NAMES = (
    "message_id",
    "correlation_id",
    "timestamp",
    "content_type",
    "content_encoding",
    "type",
    "app_id",
    "delivery_mode",
    "priority",
    "expiration",
    "user_id",
    "reply_to",
)


class RabbitMQAdapter(BrokerAdapter):
    """RabbitMQ queues. ``url`` is an AMQP URL whose path is the vhost."""

    kind = "rabbitmq"

    def __init__(
        self,
        url: str,
        *,
        management_url: str | None = None,
        timeout: float = 5.0,
        max_pages: int = 100,
        credential_hosts: Sequence[str] = (),
    ) -> None:
        super().__init__(
            url,
            management_url=management_url,
            timeout=timeout,
            max_pages=max_pages,
            credential_hosts=credential_hosts,
        )
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise BrokerError(
                "not an AMQP URL (expected amqp://user:password@host:port/vhost)", permanent=True
            )
        self.vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        self._amqp_user = urllib.parse.unquote(parts.username or "guest")
        self._amqp_password = urllib.parse.unquote(parts.password or "guest")
        self._amqp_host = parts.hostname.lower()
        self._prometheus_urls: list[str] = []
        self._api_base: str | None = None
        self._http_auth: tuple[str, str] | None = (self._amqp_user, self._amqp_password)
        if self.management_url:
            self._configure_http(self.management_url)

    # -- configuration -------------------------------------------------------------------

    def _configure_http(self, management_url: str) -> None:
        urls = [u.strip() for u in management_url.split(",") if u.strip()]
        first = urllib.parse.urlsplit(urls[0])
        if first.username:
            self._http_auth = (
                urllib.parse.unquote(first.username),
                urllib.parse.unquote(first.password or ""),
            )
        if any(_is_prometheus(u) for u in urls):
            for u in urls:
                p = urllib.parse.urlsplit(u)
                path = p.path.rstrip("/")
                if not path.endswith("/metrics/detailed"):
                    path = path[: -len("/metrics")] if path.endswith("/metrics") else path
                    path += "/metrics/detailed"
                self._prometheus_urls.append(f"{p.scheme}://{_hostport(p)}{path}")
        else:
            path = first.path.rstrip("/")
            if path.endswith("/api"):
                path = path[: -len("/api")]
            self._api_base = f"{first.scheme}://{_hostport(first)}{path}/api"

    def _connection_parameters(self) -> pika.URLParameters:
        try:
            params = pika.URLParameters(self.url)
        except Exception as exc:  # pika raises assorted types for a bad URL
            # pika's messages may quote the URL: name the problem's type only.
            raise BrokerError(f"bad AMQP URL ({type(exc).__name__})", permanent=True) from None
        params.socket_timeout = self.timeout
        params.stack_timeout = self.timeout
        params.blocked_connection_timeout = self.timeout
        params.connection_attempts = 1
        params.client_properties = {"connection_name": "dead-letter-office"}
        return params

    def _connect(self) -> pika.BlockingConnection:
        try:
            return pika.BlockingConnection(self._connection_parameters())
        except BrokerError:
            raise
        except Exception as exc:
            raise _amqp_error(exc, "connect") from exc

    def _may_receive_credentials(self, url: str) -> bool:
        """Whether ``url`` is an endpoint the AMQP credentials may go to. Comparing the host
        alone would hand them to any port of the broker's host over plain HTTP (another
        service, or a listener a registry admin started), so:

        1. an entry of ``credential_hosts`` written ``scheme://host:port`` matches exactly
           that scheme, host and port;
        2. the broker's own host, or a bare host name listed there, receives them over HTTPS
           on any port (the certificate proves the host), and over plain HTTP only on
           RabbitMQ's own ports (15672 management, 15692 Prometheus)."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        except ValueError:
            return False
        scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
        if (scheme, host, port) in _endpoints(self.credential_hosts):
            return True
        if host != self._amqp_host and host not in self.credential_hosts:
            return False
        return scheme == "https" or (scheme == "http" and port in RABBITMQ_HTTP_PORTS)

    def _http(self) -> httpx.Client:
        """An HTTP client for the management/metrics URLs. The AMQP credentials ride along
        only when every URL it will call is on the broker's own host or an allowed one: a
        management URL naming another host must not collect them. Redirects are not
        followed, so they cannot carry the credentials elsewhere either."""
        targets = self._prometheus_urls or ([self._api_base] if self._api_base else [])
        auth = self._http_auth
        if auth is not None and not all(self._may_receive_credentials(u) for u in targets):
            auth = None
        return httpx.Client(
            timeout=self.timeout, auth=auth, trust_env=False, follow_redirects=False
        )

    # -- ping ----------------------------------------------------------------------------

    def ping(self) -> None:
        connection = self._connect()
        with contextlib.suppress(Exception):
            connection.close()

    # -- poll ----------------------------------------------------------------------------

    def poll(self, addresses: Sequence[Address]) -> PollResult:
        """Steps: 1. the declared HTTP path (Prometheus or management API); 2. when it is not
        declared, or does not answer (plugin disabled, port closed), AMQP passive declares,
        with ``limits`` saying what that cannot see and how to get it; a refusal that will
        not change (bad credentials) is raised, never hidden behind the fallback."""
        started = time.monotonic()
        limits: list[str] = []
        http_error: BrokerError | None = None
        try:
            if self._prometheus_urls:
                stats, trips, errors = self._poll_prometheus(addresses)
                limits.append(
                    "Polled through the Prometheus endpoint: publish, deliver and ack rates are"
                    " unknown (the plugin reports them per channel only). Declare the"
                    " management API URL (http://host:15672) on the broker to read them."
                )
                return PollResult(stats, trips, time.monotonic() - started, errors, limits)
            if self._api_base:
                stats, trips, errors = self._poll_management(addresses)
                return PollResult(stats, trips, time.monotonic() - started, errors)
        except BrokerError as exc:
            if exc.permanent:
                raise
            http_error = exc
        stats, trips, errors = self._poll_passive(addresses)
        why = (
            "no management URL is declared"
            if http_error is None
            else f"the management URL did not answer: {http_error}"
        )
        if http_error is not None:
            errors.append(f"management API: {http_error}; polled over AMQP instead")
        limits.append(
            f"Polled over AMQP only ({why}): in-flight, publish/deliver/ack rates and"
            " redeliveries are unknown, so traffic, stalls and dead-letter inflow cannot be"
            " judged. Enable the rabbitmq_management plugin and declare its URL on the broker."
        )
        return PollResult(stats, trips, time.monotonic() - started, errors, limits)

    def _poll_prometheus(
        self, addresses: Sequence[Address]
    ) -> tuple[dict[Address, ChannelStats], int, list[str]]:
        now = time.time()
        samples: dict[str, dict[str, float]] = {}
        errors: list[str] = []
        trips = 0
        params: list[tuple[str, str | int | float | bool | None]] = [
            ("family", f) for f in _PROM_FAMILIES
        ]
        params.append(("vhost", self.vhost))
        with self._http() as client:
            for node_url in self._prometheus_urls:
                trips += 1
                try:
                    text = _http_get(client, node_url, params).text
                    _parse_prometheus(text, self.vhost, samples)
                except BrokerError as exc:
                    if len(self._prometheus_urls) == 1:
                        raise
                    errors.append(f"{_redact(node_url)}: {exc}")
        if errors and len(errors) == len(self._prometheus_urls):
            raise BrokerError("; ".join(errors))
        stats: dict[Address, ChannelStats] = {}
        for address in addresses:
            m = samples.get(address.name)
            if m is None:
                # With a node unreachable an absent queue may live there: unknown, not missing.
                stats[address] = ChannelStats(address, exists=bool(errors), observed_at=now)
                continue
            stats[address] = ChannelStats(
                address,
                backlog=_int(m.get("rabbitmq_detailed_queue_messages_ready")),
                in_flight=_int(m.get("rabbitmq_detailed_queue_messages_unacked")),
                retained=_int(m.get("rabbitmq_detailed_queue_messages")),
                consumers=_counted_consumers(
                    _int(m.get("rabbitmq_detailed_queue_consumers")),
                    _int(m.get("rabbitmq_detailed_queue_messages_unacked")),
                ),
                oldest_message_age_s=_age(
                    m.get("rabbitmq_detailed_queue_head_message_timestamp"), now
                ),
                observed_at=now,
            )
            # The detailed per-queue publish/deliver/ack counters exist only per channel in
            # this plugin (channel_queue_metrics): their sum drops when a channel closes, so it
            # is not a queue position. Positions stay None here (the management path has them).
        return stats, trips, errors

    def _list_queues(
        self, client: httpx.Client, columns: str
    ) -> tuple[dict[str, dict[str, Any]], int, list[str]]:
        """Page through ``/api/queues/<vhost>``; returns queues by name, requests made, errors."""
        assert self._api_base is not None
        url = f"{self._api_base}/queues/{urllib.parse.quote(self.vhost, safe='')}"
        queues: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        trips = 0
        page = 1
        while True:
            trips += 1
            params: list[tuple[str, str | int | float | bool | None]] = [
                ("page", str(page)),
                ("page_size", str(PAGE_SIZE)),
                ("pagination", "true"),
                ("sort", "name"),
                ("columns", columns),
            ]
            data = _json(_http_get(client, url, params), url)
            if not isinstance(data, dict):
                raise BrokerError(
                    f"GET {_redact(url)}: not a management API answer", permanent=True
                )
            for item in data.get("items", []):
                queues[item["name"]] = item
            if page >= int(data.get("page_count") or 1):
                break
            if page >= self.max_pages:
                errors.append(
                    f"queue listing truncated at max_pages={self.max_pages} "
                    f"({data.get('filtered_count')} queues); the rest were not sampled"
                )
                break
            page += 1
        return queues, trips, errors

    def _poll_management(
        self, addresses: Sequence[Address]
    ) -> tuple[dict[Address, ChannelStats], int, list[str]]:
        # Stats are not disabled (``disable_stats``): without them the API omits ``consumers``
        # and ``message_stats``; ``columns`` keeps the answer small instead.
        with self._http() as client:
            queues, trips, errors = self._list_queues(client, _POLL_COLUMNS)
        now = time.time()
        stats: dict[Address, ChannelStats] = {}
        for address in addresses:
            q = queues.get(address.name)
            if q is None:
                stats[address] = ChannelStats(address, exists=bool(errors), observed_at=now)
                continue
            ms = q.get("message_stats") or {}
            consumers = _counted_consumers(
                _int(q.get("consumers")), _int(q.get("messages_unacknowledged"))
            )
            stats[address] = ChannelStats(
                address,
                backlog=_int(q.get("messages_ready")),
                in_flight=_int(q.get("messages_unacknowledged")),
                retained=_int(q.get("messages")),
                consumers=consumers,
                active_consumers=_active_consumers(q, consumers),
                redelivered=_int(ms.get("redeliver")),
                produced=_int(ms.get("publish")),
                delivered=_int(ms.get("deliver_get")),
                acked=_int(ms.get("ack")),
                observed_at=now,
            )
        return stats, trips, errors

    def _poll_passive(
        self, addresses: Sequence[Address]
    ) -> tuple[dict[Address, ChannelStats], int, list[str]]:
        declared, trips = self._passive_declare_all(addresses)
        stats: dict[Address, ChannelStats] = {}
        missing = [str(a) for a, (ok, frame, _at) in declared.items() if not ok or frame is None]
        if missing:
            shown = ", ".join(repr(m) for m in missing[:5]) + (" …" if len(missing) > 5 else "")
            log.info("rabbitmq: %d queue(s) do not exist: %s", len(missing), shown)
        for address, (ok, frame, at) in declared.items():
            if not ok or frame is None:
                stats[address] = ChannelStats(address, exists=False, observed_at=at)
                continue
            # declare-ok carries the ready count and the consumer count only.
            stats[address] = ChannelStats(
                address,
                backlog=frame.message_count,
                consumers=frame.consumer_count,
                observed_at=at,
            )
        return stats, trips, []

    def _passive_declare_all(
        self, addresses: Sequence[Address]
    ) -> tuple[dict[Address, tuple[bool, Any, float]], int]:
        connection = self._connect()
        trips = 2  # connection handshake, channel.open
        out: dict[Address, tuple[bool, Any, float]] = {}
        try:
            channel = _open_channel(connection)
            for address in addresses:
                trips += 1
                try:
                    frame = channel.queue_declare(address.name, passive=True)
                    out[address] = (True, frame.method, time.time())
                except pika.exceptions.ChannelClosedByBroker as exc:
                    if exc.reply_code != 404:
                        raise _amqp_error(exc, f"declare {address.name}") from exc
                    out[address] = (False, None, time.time())
                    trips += 1
                    channel = _open_channel(connection)
                except BrokerError:
                    raise
                except Exception as exc:
                    raise _amqp_error(exc, f"declare {address.name}") from exc
        finally:
            with contextlib.suppress(Exception):
                connection.close()
        return out, trips

    # -- inspect -------------------------------------------------------------------------

    def inspect(self, addresses: Sequence[Address]) -> dict[Address, Topology]:
        """The topology through the management API; without it (not declared, or not
        answering) only existence, over AMQP: every other field stays unknown."""
        queues: dict[str, dict[str, Any]] = {}
        consumers: dict[str, list[dict[str, Any]]] = {}
        errors: list[str] = []
        reachable = False
        if self._api_base:
            try:
                with self._http() as client:
                    queues, _trips, errors = self._list_queues(client, _INSPECT_COLUMNS)
                    consumers = self._list_consumers(client)
                reachable = True
            except BrokerError as exc:
                if exc.permanent:
                    raise
        if not reachable:
            declared, _ = self._passive_declare_all(addresses)
            return {a: Topology(a, exists=ok) for a, (ok, _f, _t) in declared.items()}
        result: dict[Address, Topology] = {}
        for address in addresses:
            q = queues.get(address.name)
            if q is None:
                result[address] = Topology(address, exists=bool(errors))
                continue
            result[address] = _topology(address, q, consumers.get(address.name, []))
        return result

    def _list_consumers(self, client: httpx.Client) -> dict[str, list[dict[str, Any]]]:
        """``/api/consumers/<vhost>`` by queue name (prefetch and consumer arguments). Not
        paged by the broker: one bounded request; on failure the topology simply lacks them."""
        assert self._api_base is not None
        url = f"{self._api_base}/consumers/{urllib.parse.quote(self.vhost, safe='')}"
        try:
            items = _http_get(client, url, []).json()
        except (BrokerError, ValueError):
            return {}
        by_queue: dict[str, list[dict[str, Any]]] = {}
        for item in items if isinstance(items, list) else []:
            queue = (item.get("queue") or {}).get("name")
            if isinstance(queue, str):
                by_queue.setdefault(queue, []).append(item)
        return by_queue

    # -- drain / publish -----------------------------------------------------------------

    def retries(self, address: Address, retry_address: str = "", limit: int = 50) -> RetryView:
        """The declared TTL retry queue's depth (one passive declare). RabbitMQ cannot show a
        queue's messages without taking them off it, so nothing is listed."""
        if not retry_address:
            return RetryView(
                notes=[
                    "No retry queue is declared: RabbitMQ itself only requeues at once or "
                    "dead-letters. Declare the TTL retry (delay) queue as the retry address."
                ]
            )
        declared, _trips = self._passive_declare_all([Address(retry_address)])
        ok, frame, _at = declared[Address(retry_address)]
        if not ok or frame is None:
            return RetryView(notes=[f"The retry queue {retry_address!r} does not exist."])
        return RetryView(
            count=int(frame.message_count),
            listable=False,
            notes=[
                f"Messages waiting in the retry queue {retry_address!r}; each goes back to "
                "the work queue when its TTL expires.",
                "RabbitMQ cannot show the messages of a queue, nor their expiry times, without "
                "taking them off it: the list and the next attempt times are unknown.",
            ],
        )

    def open_drain(self, address: Address) -> DrainSession:
        return RabbitMQDrainSession(self, address)

    def open_publisher(self, target: Address) -> Publisher:
        return RabbitMQPublisher(self, target)


class RabbitMQDrainSession(DrainSession):
    """``basic.consume`` with manual ack on one queue, pipelined with the caller.

    pika's ``BlockingConnection`` only reads frames while someone calls into it, so a caller
    that spends most of a batch inside its database transaction used to leave the next batch
    sitting undecoded in the socket. Here a background thread owns the connection: it reads,
    decodes each delivery into a ``DeadLetter`` (frame decoding, headers, the dedupe hash) and
    queues it while the caller commits; ``fetch`` only takes from that queue. Prefetch is twice
    the batch, so one batch is ready while the previous one is stored.

    Acks stay where the contract puts them: ``ack`` hands the ``basic.ack`` to the connection's
    thread (``add_callback_threadsafe``, the one thread-safe pika call) and *waits* until it is
    written, so it is never sent before the caller asked, and its errors still raise here.
    """

    fetch_ahead = True  # the prefetch is twice the batch (_ensure_consuming)

    _IDLE_WAIT_S = 0.5  # how long the I/O thread sleeps in select() when nothing happens

    def __init__(self, adapter: RabbitMQAdapter, address: Address) -> None:
        self.adapter = adapter
        self.address = address
        self._ready: collections.deque[DeadLetter] = collections.deque()
        self._cond = threading.Condition()  # guards _ready, _outstanding and _error
        self._outstanding: set[int] = set()  # delivered to us, not yet acked
        self._copies: collections.Counter[str] = collections.Counter()  # identity -> copies
        self._error: BaseException | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._prefetch = 0
        self._consumer_tag: str | None = None
        self._connection = adapter._connect()
        try:
            self._channel = _open_channel(self._connection)
        except BaseException:
            self.close()
            raise

    # -- the I/O thread ----------------------------------------------------------------

    def _on_message(
        self, _ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes
    ) -> None:
        letter = _dead_letter(self.adapter.vhost, self.address.name, method, props, body)
        # Byte-identical dead letters delivered in one session are distinct deaths: a broker
        # never hands one unacked message to the same channel twice. The n-th copy (n > 1)
        # gets "#n", so a crash before the ack redelivers the same copies with the same keys.
        self._copies[letter.dedupe_key] += 1
        copies = self._copies[letter.dedupe_key]
        if copies > 1:
            letter.dedupe_key = f"{letter.dedupe_key}#{copies}"
        with self._cond:
            self._ready.append(letter)
            self._outstanding.add(int(method.delivery_tag or 0))
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._connection.process_data_events(time_limit=self._IDLE_WAIT_S)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by fetch/ack
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _on_io_thread(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the connection's thread and wait for it; re-raise its error."""
        done = threading.Event()
        failure: list[BaseException] = []

        def call() -> None:
            try:
                action()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(exc)
            finally:
                done.set()

        self._raise_thread_error()
        self._connection.add_callback_threadsafe(call)
        while not done.wait(self._IDLE_WAIT_S):
            self._raise_thread_error()  # the thread died: the call will never run
        if failure:
            raise failure[0]

    def _raise_thread_error(self) -> None:
        if self._error is not None:
            raise self._error

    # -- the caller's side -------------------------------------------------------------

    def _ensure_consuming(self, max_batch: int) -> None:
        wanted = min(max(2 * max_batch, 1), 65_535)
        if self._thread is None:
            self._channel.basic_qos(prefetch_count=wanted)
            self._prefetch = wanted
            self._consumer_tag = self._channel.basic_consume(
                self.address.name, self._on_message, auto_ack=False
            )
            self._thread = threading.Thread(
                target=self._run, name=f"rabbitmq-drain-{self.address.name}", daemon=True
            )
            self._thread.start()
        elif wanted > self._prefetch:
            self._on_io_thread(lambda: self._channel.basic_qos(prefetch_count=wanted))
            self._prefetch = wanted

    def fetch(self, max_batch: int, wait_s: float) -> list[DeadLetter]:
        if max_batch <= 0:
            return []
        try:
            self._ensure_consuming(max_batch)
            deadline = time.monotonic() + max(wait_s, 0.0)
            with self._cond:
                # Wait (bounded) for the first letter; take whatever else is already decoded.
                while not self._ready and self._error is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                self._raise_thread_error()
                take = min(max_batch, len(self._ready))
                return [self._ready.popleft() for _ in range(take)]
        except pika.exceptions.ChannelClosedByBroker as exc:
            raise BrokerError(
                f"consume {self.address.name}: {exc.reply_code} {exc.reply_text}",
                permanent=exc.reply_code in (403, 404),
            ) from exc
        except Exception as exc:
            raise _amqp_error(exc, f"consume {self.address.name}") from exc

    def ack(self, letters: Sequence[DeadLetter]) -> None:
        tags = sorted({int(letter.token) for letter in letters})
        if not tags:
            return
        with self._cond:
            unknown = [t for t in tags if t not in self._outstanding]
            if unknown:
                raise BrokerError(f"delivery tags not outstanding on this session: {unknown[:5]}")
            lowest = sorted(self._outstanding)[: len(tags)]

        def send() -> None:
            if lowest == tags:
                # Contiguous prefix of the outstanding tags: one ack covers them all.
                self._channel.basic_ack(delivery_tag=tags[-1], multiple=True)
            else:
                for tag in tags:
                    self._channel.basic_ack(delivery_tag=tag)

        try:
            if self._thread is None:
                send()
            else:
                self._on_io_thread(send)
        except Exception as exc:
            raise _amqp_error(exc, f"ack {self.address.name}") from exc
        with self._cond:
            self._outstanding.difference_update(tags)

    def close(self) -> None:
        thread = getattr(self, "_thread", None)
        if thread is not None:
            self._stopping = True
            with contextlib.suppress(Exception):
                self._connection.add_callback_threadsafe(lambda: None)  # wake select()
            thread.join(timeout=self.adapter.timeout + self._IDLE_WAIT_S)
        self._ready.clear()
        self._outstanding.clear()
        connection = getattr(self, "_connection", None)
        if connection is not None and connection.is_open:
            with contextlib.suppress(Exception):
                connection.close()


class RabbitMQPublisher(Publisher):
    """Confirmed, mandatory, persistent publishing to the default exchange (routing key = queue).

    pika's blocking channel waits for each confirm before the next publish. Here an asyncio
    pika connection on a private event loop keeps up to ``PUBLISH_WINDOW`` publishes in flight:
    1. publish while the window has room, recording delivery tag → message;
    2. a ``basic.return`` (always sent before that message's ack) marks the oldest outstanding
       message with the same body as unroutable (returns come in publish order, and every
       message of one publisher has the same routing key);
    3. ``basic.ack``/``basic.nack`` (possibly ``multiple``) settle tags up to the given one;
    4. when no confirm arrives for ``timeout`` seconds, the rest are settled as "timeout".
    """

    def __init__(self, adapter: RabbitMQAdapter, target: Address) -> None:
        self.adapter = adapter
        self.target = target
        self._loop = asyncio.new_event_loop()
        self._connection: AsyncioConnection | None = None
        self._channel: Channel | None = None
        self._closed_reason: str | None = None
        self._next_tag = 0
        self._pending: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._returned: set[int] = set()
        self._return_reason: dict[int, str] = {}
        self._outcomes: list[PublishOutcome | None] = []
        self._batch: Sequence[OutgoingMessage] = ()
        self._progress = asyncio.Event()
        try:
            self._loop.run_until_complete(asyncio.wait_for(self._open(), adapter.timeout))
        except BaseException as exc:
            self.close()
            if isinstance(exc, BrokerError):
                raise
            if isinstance(exc, TimeoutError | asyncio.TimeoutError):
                raise BrokerError("publisher open timed out", connection_lost=True) from exc
            raise _amqp_error(exc, "open publisher") from exc

    async def _open(self) -> None:
        opened: asyncio.Future[None] = self._loop.create_future()

        def on_open(_conn: Any) -> None:
            _conn.channel(on_open_callback=on_channel)

        def on_open_error(_conn: Any, err: BaseException | str) -> None:
            if not opened.done():
                exc = err if isinstance(err, BaseException) else Exception(str(err))
                opened.set_exception(_amqp_error(exc, "connect"))

        def on_channel(channel: Channel) -> None:
            self._channel = channel
            channel.add_on_close_callback(self._on_channel_closed)
            channel.add_on_return_callback(self._on_return)
            channel.confirm_delivery(
                ack_nack_callback=self._on_confirm,
                callback=lambda _frame: _resolve(opened),
            )

        self._connection = AsyncioConnection(
            self.adapter._connection_parameters(),
            on_open_callback=on_open,
            on_open_error_callback=on_open_error,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._loop,
        )
        await opened

    def _on_connection_closed(self, _conn: Any, reason: BaseException) -> None:
        self._closed_reason = self._closed_reason or f"connection closed: {reason}"
        self._progress.set()

    def _on_channel_closed(self, _ch: Any, reason: BaseException) -> None:
        self._closed_reason = self._closed_reason or f"channel closed: {reason}"
        self._progress.set()

    def _on_return(
        self, _ch: Any, method: Basic.Return, props: BasicProperties, body: bytes
    ) -> None:
        for tag, index in self._pending.items():
            if tag in self._returned:
                continue
            if self._batch[index].body == body:
                self._returned.add(tag)
                self._return_reason[tag] = f"unroutable: {method.reply_code} {method.reply_text}"
                break

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        positive = isinstance(method, Basic.Ack)
        upto = method.delivery_tag
        tags = [t for t in self._pending if t <= upto] if method.multiple else [upto]
        for tag in tags:
            index = self._pending.pop(tag, None)
            if index is None:
                continue
            key = self._batch[index].key
            if tag in self._returned:
                reason = self._return_reason.pop(tag, "unroutable")
                outcome = PublishOutcome(key, False, reason, refused=True)
                self._returned.discard(tag)
            elif positive:
                outcome = PublishOutcome(key, True)
            else:
                outcome = PublishOutcome(key, False, "nacked", refused=True)
            self._outcomes[index] = outcome
        self._progress.set()

    def publish(self, messages: Sequence[OutgoingMessage]) -> list[PublishOutcome]:
        if not messages:
            return []
        if self._channel is None or self._closed_reason:
            raise BrokerError(
                f"publisher is closed ({self._closed_reason or 'not open'})", connection_lost=True
            )
        self._batch = messages
        self._outcomes = [None] * len(messages)
        self._pending.clear()
        self._returned.clear()
        self._return_reason.clear()
        self._loop.run_until_complete(self._publish_all())
        return [
            o if o is not None else PublishOutcome.lost(m.key, "timeout: no confirm in time")
            for o, m in zip(self._outcomes, messages, strict=True)
        ]

    async def _publish_all(self) -> None:
        assert self._channel is not None
        timeout = self.adapter.timeout
        for index, msg in enumerate(self._batch):
            while len(self._pending) >= PUBLISH_WINDOW and not self._closed_reason:
                if not await self._wait_progress(timeout):
                    return
            if self._closed_reason:
                break
            self._next_tag += 1
            self._pending[self._next_tag] = index
            self._channel.basic_publish(
                exchange="",
                routing_key=self.target.name,
                body=msg.body,
                properties=_outgoing_properties(msg),
                mandatory=True,
            )
            if index % 200 == 199:
                await asyncio.sleep(0)  # let the transport write and confirms come in
        while self._pending and not self._closed_reason:
            if not await self._wait_progress(timeout):
                return
        if self._closed_reason:
            for index in self._pending.values():
                self._outcomes[index] = PublishOutcome.lost(
                    self._batch[index].key, self._closed_reason
                )
            for index, outcome in enumerate(self._outcomes):
                if outcome is None:
                    self._outcomes[index] = PublishOutcome.lost(
                        self._batch[index].key, f"not sent: {self._closed_reason}"
                    )
            self._pending.clear()

    async def _wait_progress(self, timeout: float) -> bool:
        self._progress.clear()
        try:
            await asyncio.wait_for(self._progress.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        connection = self._connection
        if connection is not None and not (connection.is_closed or connection.is_closing):
            done: asyncio.Future[None] = self._loop.create_future()
            connection.add_on_close_callback(lambda *_: _resolve(done))
            with contextlib.suppress(Exception):
                connection.close()
                self._loop.run_until_complete(asyncio.wait_for(done, self.adapter.timeout))
        self._connection = None
        self._channel = None
        self._closed_reason = self._closed_reason or "closed"
        if not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()


# -- helpers -----------------------------------------------------------------------------


#: The plain-HTTP ports of RabbitMQ's management and Prometheus plugins (their defaults).
RABBITMQ_HTTP_PORTS = frozenset({15672, 15692})


def _endpoints(entries: frozenset[str]) -> set[tuple[str, str, int | None]]:
    """``(scheme, host, port)`` of the ``scheme://host:port`` entries (bare hosts skipped)."""
    found: set[tuple[str, str, int | None]] = set()
    for entry in entries:
        if "://" not in entry:
            continue
        try:
            p = urllib.parse.urlsplit(entry)
            port = p.port or {"http": 80, "https": 443}.get(p.scheme)
        except ValueError:
            continue
        found.add((p.scheme, (p.hostname or "").lower(), port))
    return found


def _is_prometheus(url: str) -> bool:
    p = urllib.parse.urlsplit(url)
    return p.path.rstrip("/").endswith(("/metrics", "/metrics/detailed")) or p.port == 15692


def _hostport(p: urllib.parse.SplitResult) -> str:
    host = p.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{p.port}" if p.port else host


def _redact(url: str) -> str:
    p = urllib.parse.urlsplit(url)
    if p.password is None:
        return url
    return urllib.parse.urlunsplit(p._replace(netloc=f"{p.username}:***@{_hostport(p)}"))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _http_get(
    client: httpx.Client, url: str, params: list[tuple[str, str | int | float | bool | None]]
) -> httpx.Response:
    try:
        response = client.get(url, params=params)
    except httpx.TimeoutException:
        raise BrokerError(f"GET {_redact(url)}: no answer in time (timeout)") from None
    except httpx.ConnectError:
        raise BrokerError(f"GET {_redact(url)}: connection refused or host unreachable") from None
    except httpx.HTTPError as exc:
        raise BrokerError(f"GET {_redact(url)}: request failed ({type(exc).__name__})") from None
    if response.status_code in (401, 403):
        hint = (
            " (no credentials sent: they go only to the broker's own host over HTTPS or on"
            " RabbitMQ's own ports 15672/15692, unless the operator lists this endpoint"
            " (scheme://host:port) in DLO_BROKER_CREDENTIAL_HOSTS)"
            if client.auth is None
            else ""
        )
        raise BrokerError(f"GET {_redact(url)}: HTTP {response.status_code}{hint}", permanent=True)
    if response.is_redirect:
        # Not followed: a redirect could take the credentials to another host.
        raise BrokerError(
            f"GET {_redact(url)}: HTTP {response.status_code} redirect, not followed; give the "
            "final URL",
            permanent=True,
        )
    if response.status_code == 404:
        raise BrokerError(f"GET {_redact(url)}: not found (unknown vhost?)", permanent=True)
    if response.status_code >= 400:
        raise BrokerError(f"GET {_redact(url)}: HTTP {response.status_code}")
    return response


def _json(response: httpx.Response, url: str) -> Any:
    """The answer's JSON; a classified error, never the body, when it is not JSON."""
    try:
        return response.json()
    except ValueError:
        raise BrokerError(
            f"GET {_redact(url)}: the answer is not JSON (not the management API?)",
            permanent=True,
        ) from None


def _parse_prometheus(text: str, vhost: str, into: dict[str, dict[str, float]]) -> None:
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                queue = sample.labels.get("queue")
                if queue is None or sample.labels.get("vhost") != vhost:
                    continue
                into.setdefault(queue, {})[sample.name] = sample.value
    except ValueError:
        # The parser's message quotes the offending line: never show another service's answer.
        raise BrokerError("the answer is not Prometheus text (not the metrics endpoint?)") from None


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and value != value:  # NaN
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _age(head_timestamp: float | None, now: float) -> float | None:
    """Prometheus head_message_timestamp is the publisher's ``timestamp`` property (seconds),
    present only when the head message has one."""
    if head_timestamp is None or head_timestamp != head_timestamp or head_timestamp <= 0:
        return None
    return max(0.0, now - head_timestamp)


def _counted_consumers(consumers: int | None, unacked: int | None) -> int | None:
    """The statistics' consumer count, or None (unknown) where the same statistics contradict
    it. RabbitMQ returns a closed channel's unacknowledged messages to the queue at once, so
    unacknowledged messages mean a live channel holds them: a consumer the statistics have not
    counted yet (the management agent collects the consumer count and the message counts
    separately, up to one statistics interval apart, seen on a new queue) or a ``basic.get``
    poller, which no consumer count includes. Neither is "no consumer"."""
    if consumers == 0 and unacked:
        return None
    return consumers


def _active_consumers(queue: dict[str, Any], consumers: int | None) -> int | None:
    """Single-active-consumer queues have at most one active consumer; on other queues every
    consumer is active (the ``active`` flag RabbitMQ reports for each is true)."""
    if consumers is None:
        return None
    if (queue.get("arguments") or {}).get("x-single-active-consumer") is True:
        return min(consumers, 1)
    return consumers


def _setting(q: dict[str, Any], name: str) -> tuple[Any, Any]:
    """(queue argument ``x-<name>``, effective policy ``<name>``)."""
    args = q.get("arguments") or {}
    policy = q.get("effective_policy_definition") or {}
    if not isinstance(policy, dict):
        policy = {}
    return args.get(f"x-{name}"), policy.get(name)


_AGE_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}


def _stream_age_s(value: Any) -> float | None:
    """A stream ``x-max-age`` such as ``"7D"`` or ``"12h"`` in seconds; None if unreadable."""
    text = str(value or "")
    if len(text) < 2 or text[-1] not in _AGE_UNITS or not text[:-1].isdigit():
        return None
    return float(int(text[:-1]) * _AGE_UNITS[text[-1]])


def _first(arg: Any, policy: Any) -> Any:
    return arg if arg is not None else policy


def _consumer_view(
    q: dict[str, Any], consumers: list[dict[str, Any]]
) -> tuple[int | None, float | None]:
    """(largest prefetch among the queue's consumers, 0 = unbounded; the consumer timeout in
    seconds set on a consumer, else on the queue by argument or policy). The node-wide
    ``consumer_timeout`` is not visible through the management API, so it stays unknown."""
    prefetches = [
        c["prefetch_count"] for c in consumers if isinstance(c.get("prefetch_count"), int)
    ]
    prefetch = None
    if prefetches:
        prefetch = 0 if 0 in prefetches else max(prefetches)
    timeouts: list[int] = []
    for c in consumers:
        value = (c.get("arguments") or {}).get("x-consumer-timeout")
        if isinstance(value, int):
            timeouts.append(value)
    queue_timeout = _first(*_setting(q, "consumer-timeout"))
    timeout_ms = max(timeouts) if timeouts else queue_timeout
    timeout_s = timeout_ms / 1000.0 if isinstance(timeout_ms, int) and timeout_ms > 0 else None
    return prefetch, timeout_s


def _topology(
    address: Address, q: dict[str, Any], consumers: list[dict[str, Any]] | None = None
) -> Topology:
    args = q.get("arguments") or {}
    kind = q.get("type") or args.get("x-queue-type") or "classic"
    # Precedence as in RabbitMQ: a queue argument beats the policy for the DLX, the routing key,
    # overflow and strategy; for delivery-limit the smaller value wins.
    dlx_arg, dlx_pol = _setting(q, "dead-letter-exchange")
    dlx = dlx_arg if dlx_arg is not None else dlx_pol
    rk_arg, rk_pol = _setting(q, "dead-letter-routing-key")
    routing_key = rk_arg if rk_arg is not None else rk_pol
    if dlx is None:
        target = ""
    elif dlx == "":
        target = routing_key or "amq.default"  # the default exchange routes by queue name
    else:
        target = str(dlx)
    over_arg, over_pol = _setting(q, "overflow")
    overflow = over_arg if over_arg is not None else over_pol
    if overflow is None and kind != "stream":
        overflow = "drop-head"  # the broker's default
    limits = [v for v in _setting(q, "delivery-limit") if isinstance(v, int) and v >= 0]
    no_limit = None if kind == "stream" else -1  # -1: none; streams do not redeliver
    delivery_limit = min(limits) if limits else no_limit
    strategy: str | None = None
    if dlx is not None:
        strat_arg, strat_pol = _setting(q, "dead-letter-strategy")
        declared = strat_arg if strat_arg is not None else strat_pol
        # at-least-once needs a quorum queue with reject-publish; otherwise RabbitMQ falls back.
        if kind == "quorum" and declared == "at-least-once" and overflow == "reject-publish":
            strategy = "at-least-once"
        else:
            strategy = "at-most-once"
    ttl_ms = _first(*_setting(q, "message-ttl"))
    retention_s = ttl_ms / 1000.0 if isinstance(ttl_ms, int) and ttl_ms >= 0 else None
    if kind == "stream":
        retention_s = _stream_age_s(_first(*_setting(q, "max-age")))
    max_length = _first(*_setting(q, "max-length"))
    prefetch, ack_timeout_s = _consumer_view(q, consumers or [])
    return Topology(
        address,
        exists=True,
        kind=str(kind),
        dead_letter_target=target,
        delivery_limit=delivery_limit,
        dead_letter_strategy=strategy,
        overflow=str(overflow) if overflow is not None else None,
        prefetch=prefetch,
        ack_timeout_s=ack_timeout_s,
        retention_s=retention_s,
        retention_count=max_length if isinstance(max_length, int) else None,
        raw={
            "arguments": args,
            "effective_policy_definition": q.get("effective_policy_definition") or {},
            "policy": q.get("policy"),
            "operator_policy": q.get("operator_policy"),
        },
    )


def _open_channel(connection: pika.BlockingConnection) -> BlockingChannel:
    try:
        return connection.channel()
    except Exception as exc:
        raise _amqp_error(exc, "channel.open") from exc


def _amqp_error(exc: BaseException, action: str) -> BrokerError:
    if isinstance(exc, BrokerError):
        return exc
    permanent = isinstance(
        exc,
        pika.exceptions.ProbableAuthenticationError
        | pika.exceptions.AuthenticationError
        | pika.exceptions.ProbableAccessDeniedError,
    )
    if isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
        # 403 ACCESS_REFUSED, 530 NOT_ALLOWED (unknown vhost / no permission) will not heal.
        permanent = exc.reply_code in (403, 530)
    detail = str(exc) or type(exc).__name__
    # Unreachable or broken: refused/reset sockets, timeouts, a connection or channel the broker
    # (or the network) closed. Typed here so no caller has to read pika's wording.
    lost = isinstance(
        exc,
        pika.exceptions.AMQPConnectionError
        | pika.exceptions.ConnectionWrongStateError
        | pika.exceptions.ChannelWrongStateError
        | pika.exceptions.ChannelClosed
        | OSError
        | TimeoutError,
    )
    return BrokerError(
        f"rabbitmq {action}: {type(exc).__name__}: {detail}",
        permanent=permanent,
        connection_lost=lost,
    )


def _epoch(value: Any) -> float | None:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _properties(props: BasicProperties) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _PROPERTY_NAMES:
        value = getattr(props, name, None)
        if value is not None:
            out[name] = value
    return json_safe_headers(out)


#: Headers a broker may change when it redelivers the *same* dead letter, so they are not part
#: of its identity: quorum queues count deliveries in ``x-delivery-count``.
_REDELIVERY_HEADERS = frozenset({"x-delivery-count"})


def _dedupe_key(
    vhost: str, queue: str, body: bytes, properties: dict[str, Any], headers: dict[str, Any]
) -> str:
    """The identity of one death on RabbitMQ (see docs/identity.md).

    RabbitMQ gives a dead letter no id of its own, and a redelivery after a crash before the
    ack carries the very same bytes, properties and headers (only the ``redelivered`` flag of
    the delivery and a quorum queue's ``x-delivery-count`` change). So the key is the content
    of the dead letter as the broker stored it: vhost, queue, body, every property and every
    header except ``x-delivery-count``. What differs between two deaths of one message is in
    there: a replay's ``x-dlq-replay-id``; the ``x-death`` entries the dead-lettering writes
    (queue, reason, count and the time of that death); a producer's new ``timestamp``/
    ``message_id``. Two deaths identical in all of that (a producer resending the same bytes
    that die in the same second) are told apart by the drain session's occurrence suffix.
    ``properties`` and ``headers`` are the JSON-safe ones the letter carries (converted once).
    """
    canonical = json.dumps(
        [
            vhost,
            queue,
            hashlib.sha256(body).hexdigest(),
            properties,
            {k: v for k, v in headers.items() if k.lower() not in _REDELIVERY_HEADERS},
        ],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        default=repr,
    )
    return "rmq:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _dead_letter(
    vhost: str, queue: str, method: Basic.Deliver, props: BasicProperties, body: bytes
) -> DeadLetter:
    headers: dict[str, Any] = dict(props.headers or {})
    deaths_raw = headers.get("x-death")
    deaths: list[dict[str, Any]] = (
        [d for d in deaths_raw if isinstance(d, dict)] if isinstance(deaths_raw, list) else []
    )
    first_queue = _text(headers.get("x-first-death-queue"))
    first_exchange = _text(headers.get("x-first-death-exchange"))
    reason = _text(headers.get("x-first-death-reason"))
    if first_queue is None and deaths:
        first_queue = _text(deaths[-1].get("queue"))
    if first_exchange is None and deaths:
        first_exchange = _text(deaths[-1].get("exchange"))
    if reason is None and deaths:
        reason = _text(deaths[0].get("reason"))
    redelivery_count: int | None = None
    first_death_at: float | None = None
    if deaths:
        mine = [d for d in deaths if _text(d.get("queue")) == first_queue] or deaths[-1:]
        counts = [_int(d.get("count")) for d in mine]
        redelivery_count = (
            sum(c for c in counts if c is not None) if any(c is not None for c in counts) else None
        )
        first_death_at = _epoch(mine[-1].get("time"))
    elif headers.get("x-delivery-count") is not None:
        redelivery_count = _int(headers.get("x-delivery-count"))
    dead_lettered_at = _epoch(deaths[0].get("time")) if deaths else None
    safe_headers, properties = json_safe_headers(headers), _properties(props)
    # The history is the headers' own converted ``x-death`` entries (converted once; nested
    # two levels deeper there, so a table nested more than 30 levels is cut two levels sooner).
    history = (
        [
            s
            for raw, s in zip(deaths_raw, safe_headers["x-death"], strict=True)
            if isinstance(raw, dict)
        ]
        if deaths and isinstance(deaths_raw, list)
        else []
    )
    return DeadLetter(
        dedupe_key=_dedupe_key(vhost, queue, body, properties, safe_headers),
        body=body,
        headers=safe_headers,
        properties=properties,
        token=method.delivery_tag,
        broker_id=str(method.delivery_tag),
        redelivery_count=redelivery_count,
        reason=reason,
        first_death_queue=first_queue,
        first_death_exchange=first_exchange,
        first_death_at=first_death_at,
        dead_lettered_at=dead_lettered_at,
        death_history=history,
    )


def _outgoing_properties(msg: OutgoingMessage) -> BasicProperties:
    """Copy the known AMQP properties from the message; always persistent."""
    allowed: dict[str, Any] = {k: v for k, v in msg.properties.items() if k in _PROPERTY_NAMES}
    allowed.pop("delivery_mode", None)
    ts = allowed.get("timestamp")
    if ts is not None and not isinstance(ts, int):
        epoch = _epoch(ts)
        allowed["timestamp"] = int(epoch) if epoch is not None else None
    if "priority" in allowed and allowed["priority"] is not None:
        allowed["priority"] = int(allowed["priority"])
    if "expiration" in allowed and allowed["expiration"] is not None:
        allowed["expiration"] = str(allowed["expiration"])
    return BasicProperties(delivery_mode=2, headers=dict(msg.headers or {}) or None, **allowed)


__all__ = ["RabbitMQAdapter"]
