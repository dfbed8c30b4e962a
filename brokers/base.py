"""The one small interface every broker adapter implements.

Plain Python: nothing here (or in any adapter module) imports Django. The dashboard turns a
Broker declaration into an adapter with ``brokers.get_adapter()`` and calls it from its polling,
ingest and replay actions.

Contracts shared by every method:

1. Every network call is bounded by ``self.timeout`` seconds (connect and each request).
2. Every failure leaves the adapter as ``BrokerError``; ``permanent=True`` means retrying the same
   call will not help (bad credentials, unknown vhost, malformed URL), ``False`` means it might
   (refused connection, timeout, a broker restarting). ``connection_lost=True`` is the one typed
   way to say "the broker could not be reached or the connection broke": the session is
   unusable and must be reopened, and nothing is known about the message (callers never parse
   the message text to find this out).
3. ``None`` in a measurement means *unknown*, never zero. An adapter that cannot measure a field
   leaves it ``None``; the dashboard renders that as "unknown", not as a healthy 0.
4. Loops are bounded: paging stops at ``max_pages``; fetches stop at ``max_batch``.
"""

from __future__ import annotations

import abc
import dataclasses
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

# ``scheme://user:password@`` anywhere in a text (a library echoing the URL it was given).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/\s]*):[^@\s]*@")
URL_PLACEHOLDER = "[broker URL]"


def redact_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it replaced."""
    return _USERINFO.sub(r"\g<scheme>\g<user>:***@", text)


def scrub(text: str, url: str) -> str:
    """``text`` safe to store, log or show although it may quote ``url``, a connection URL
    (or a comma-separated list of them) whose value nobody but the server may read.

    1. The whole URL and each server in it are replaced by a placeholder: a value that does
       not even parse (someone named the wrong variable) is never echoed.
    2. Each password, and a bare user-info token (``nats://TOKEN@host``), raw and
       percent-decoded, is replaced wherever it still appears.
    3. Any other ``scheme://user:password@`` loses its password.
    """
    if url:
        servers = sorted({url, *(s.strip() for s in url.split(","))} - {""}, key=len, reverse=True)
        secrets: set[str] = set()
        for server in servers:
            text = text.replace(server, URL_PLACEHOLDER)
            try:
                parts = urlsplit(server)
                password, user = parts.password, parts.username
            except ValueError:
                continue
            token = password if password is not None else user
            if token:
                secrets |= {token, unquote(token)}
        for secret in sorted(secrets, key=len, reverse=True):
            if len(secret) >= 3:  # shorter would garble the text; it guards nothing anyway
                text = text.replace(secret, "***")
    return redact_credentials(text)


class BrokerError(Exception):
    """The one error type adapters raise. ``permanent`` says whether a retry could help;
    ``connection_lost`` that the broker is unreachable (refused, timed out, connection broken)
    and the session must be reopened. The two never go together."""

    def __init__(
        self, message: str, *, permanent: bool = False, connection_lost: bool = False
    ) -> None:
        # No message leaves an adapter with a URL's password in it, whatever a library said.
        super().__init__(redact_credentials(message))
        self.permanent = permanent
        self.connection_lost = connection_lost and not permanent


@dataclasses.dataclass(frozen=True, order=True)
class Address:
    """Where a channel lives on its broker.

    - RabbitMQ: ``name`` is the queue; ``group`` is unused ("").
    - Redis Streams: ``name`` is the stream key; ``group`` is the consumer group.
    - NATS JetStream: ``name`` is the stream; ``group`` is the durable consumer.
    """

    name: str
    group: str = ""

    def __str__(self) -> str:
        return f"{self.name}/{self.group}" if self.group else self.name


@dataclasses.dataclass
class ChannelStats:
    """One broker-neutral sample of one address. ``None`` means unknown, never 0.

    Gauges: ``backlog`` (ready/pending, not yet delivered), ``in_flight`` (delivered, unacked),
    ``retained`` (stored in total), ``consumers``/``active_consumers``, ``redelivered`` (messages
    delivered more than once, as the broker counts them), ``oldest_message_age_s`` (age of the
    oldest undelivered message), ``oldest_unacked_age_s`` (idle time of the oldest pending one).

    Positions are monotonic counters for rates and trends: ``produced`` (published into the
    address), ``delivered``, ``acked`` and ``dead_lettered``. They may reset when a broker restarts;
    consumers of this class treat a decrease as a reset, not as negative progress.
    """

    address: Address
    exists: bool = True
    backlog: int | None = None
    in_flight: int | None = None
    retained: int | None = None
    consumers: int | None = None
    active_consumers: int | None = None
    redelivered: int | None = None
    oldest_message_age_s: float | None = None
    oldest_unacked_age_s: float | None = None
    produced: int | None = None
    delivered: int | None = None
    acked: int | None = None
    dead_lettered: int | None = None
    #: The highest delivery count among pending (delivered, unacked) messages, where the broker
    #: tells it cheaply (Redis: XPENDING of the oldest pending entries).
    max_deliveries: int | None = None
    #: With ``exists=False``: what exactly is missing when the address is only partly there
    #: ("stream 'orders' exists but has no consumer group 'workers'"); "" = nothing of it.
    missing: str = ""
    #: One consumer's share of a queue shared by several (``Address.group`` on ActiveMQ's
    #: shared DLQ): the whole queue's message count, where only that is counted; else None.
    shared_total: int | None = None
    observed_at: float = dataclasses.field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["address"] = str(self.address)
        return data


@dataclasses.dataclass
class PollResult:
    """What one poll of many addresses returned, and what it cost."""

    stats: dict[Address, ChannelStats]
    round_trips: int
    duration_s: float
    errors: list[str] = dataclasses.field(default_factory=list)
    #: What this poll could not measure on any address, why, and how to get it ("over AMQP
    #: only: in-flight and rates unknown; enable the management plugin and declare its URL").
    #: Shown beside every channel's state; empty when the broker told everything.
    limits: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Topology:
    """What the broker actually has configured for one address (for declared-vs-observed).

    ``None`` means the adapter could not tell. ``raw`` keeps the broker's own description (queue
    arguments plus effective policy; consumer config) for display.
    """

    address: Address
    exists: bool
    kind: str | None = None  # "classic" | "quorum" | "stream" | "redis-stream" | "jetstream"
    dead_letter_target: str | None = None  # DLX / DLQ the broker routes to, "" if none
    delivery_limit: int | None = None  # quorum delivery-limit / JetStream max_deliver; -1 = none
    dead_letter_strategy: str | None = None  # "at-most-once" | "at-least-once"
    overflow: str | None = None  # "drop-head" | "reject-publish" | "reject-publish-dlx"
    ack_policy: str | None = None  # JetStream: "none" | "all" | "explicit"
    max_ack_pending: int | None = None  # JetStream max_ack_pending; -1 = unbounded
    prefetch: int | None = None  # RabbitMQ: largest consumer prefetch_count; 0 = unbounded
    #: How long one delivery may stay unacknowledged before the broker acts (RabbitMQ consumer
    #: timeout set on the queue or consumer, JetStream ack_wait); None when not visible.
    ack_timeout_s: float | None = None
    #: Retention the broker enforces: by age (message TTL, stream max age, or the age of the
    #: oldest entry left after visible trimming) and by count (max length / max messages).
    retention_s: float | None = None
    retention_count: int | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class DeadLetter:
    """One message read from a dead-letter (or poison) address, not yet acknowledged.

    ``dedupe_key`` is the adapter's stable identity of this dead letter: reading the same message
    twice (after a crash before the ack) yields the same key, so the store can insert it once.
    ``token`` is what ``DrainSession.ack`` needs to acknowledge it on the broker.
    ``headers`` are JSON-safe (bytes decoded as text where possible, else ``{"$bytes": hex}``).
    """

    dedupe_key: str
    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any]
    token: Any
    broker_id: str
    redelivery_count: int | None = None
    reason: str | None = None
    #: The application's error where the broker (not a header) carries it: a NATS ``term``
    #: reason. It wins over the message's headers at ingest (those may be an earlier death's).
    error_class: str | None = None
    error_message: str | None = None
    first_death_queue: str | None = None
    first_death_exchange: str | None = None
    first_death_at: float | None = None
    dead_lettered_at: float | None = None
    death_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RetryingMessage:
    """One message waiting for its next attempt, as the broker shows it without consuming it.
    ``None`` means the broker does not tell."""

    broker_id: str
    attempts: int | None = None  # deliveries so far
    last_delivered_at: float | None = None  # epoch seconds
    next_attempt_at: float | None = None  # epoch seconds, where the broker knows it
    holder: str = ""  # the consumer holding it (Redis), if any


@dataclasses.dataclass
class RetryView:
    """Messages of one channel waiting for a retry (the Sidekiq "Retry set" of a broker).

    ``count`` is how many wait (``None``: the broker cannot tell; ``at_most`` then bounds it
    where it can); ``messages`` the first of them the broker lists without consuming, oldest
    first (empty with ``listable=False`` when it cannot list them at all); ``next_attempt_at``
    the earliest known next attempt; ``notes`` say what the broker could not tell and why."""

    count: int | None = None
    at_most: int | None = None
    redelivered: int | None = None
    next_attempt_at: float | None = None
    listable: bool = False
    messages: list[RetryingMessage] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class OutgoingMessage:
    """A message to publish (replay). ``key`` identifies it in the results."""

    key: str
    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PublishOutcome:
    """The broker's verdict on one published message: confirmed, or not with a reason.

    An unconfirmed outcome is one of three kinds, told apart by flags, never by ``reason``:

    - ``refused``: the broker answered and did not take the message (nack, unroutable/returned,
      rejected by the stream); ``permanent`` when the same message will be refused again.
    - ``connection_lost``: the broker could not be reached, the connection broke, or it did not
      answer within the timeout. The message may or may not be stored (in doubt); the
      publisher is unusable and must be reopened. This is not the message's fault.
    - neither: no verdict for another reason (treated as in doubt).
    """

    key: str
    confirmed: bool
    reason: str = ""
    permanent: bool = False
    refused: bool = False
    connection_lost: bool = False

    @classmethod
    def lost(cls, key: str, reason: str) -> PublishOutcome:
        return cls(key, False, reason, connection_lost=True)


class DrainSession(abc.ABC):
    """An open consuming session on one dead-letter address, with manual acknowledgement."""

    #: Whether ``fetch`` hands out the next batch while the one before is unacknowledged (up
    #: to twice the batch): ingest then stores one batch while it fetches and builds the next
    #: (``dlq.capture.store_stage``). False where the broker holds further messages back until
    #: the ack (ActiveMQ's page), and by default.
    fetch_ahead: bool = False

    @abc.abstractmethod
    def fetch(self, max_batch: int, wait_s: float) -> list[DeadLetter]:
        """Return up to ``max_batch`` unacknowledged dead letters, waiting at most ``wait_s``
        for the first. Messages stay on the broker until ``ack``; an empty list means drained."""

    @abc.abstractmethod
    def ack(self, letters: Sequence[DeadLetter]) -> None:
        """Acknowledge (remove from the broker) exactly these letters. Call only after the
        store has durably committed them."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the session; unacknowledged letters go back to the broker."""

    def waiting(self) -> int | None:
        """How many dead letters the broker says wait for this drain (not yet delivered, or
        delivered to someone and not acknowledged); ``None`` when it cannot tell. Ingest asks
        after a run that fetched nothing: a positive answer means the drain is stalled."""
        return None


class Publisher(abc.ABC):
    """An open publishing session to one target with broker confirmation."""

    @abc.abstractmethod
    def publish(self, messages: Sequence[OutgoingMessage]) -> list[PublishOutcome]:
        """Publish persistently and wait (bounded) for the broker's verdict on each message.

        A message is ``confirmed`` only after a positive broker acknowledgement and, where the
        broker can say so, proof that it was routed (RabbitMQ: no ``basic.return``). A lost
        connection is reported per message (``PublishOutcome.connection_lost``) or raised as
        ``BrokerError(connection_lost=True)``; either way the caller opens a new publisher."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the session."""


class BrokerAdapter(abc.ABC):
    """One broker connection description; cheap to build, opens connections per call."""

    kind: str = ""
    #: This dashboard's stable id; durable state the adapter creates on a shared broker is named
    #: after it (NATS drain consumers), so two dashboards do not share one consumer.
    installation_id: str = ""
    #: A consumer silent (no delivery, ack or pull) for longer than this no longer counts as
    #: attached, where the broker counts consumers by activity (Redis, NATS pull consumers).
    active_idle_s: float = 60.0

    def __init__(
        self,
        url: str,
        *,
        management_url: str | None = None,
        timeout: float = 5.0,
        max_pages: int = 100,
        credential_hosts: Sequence[str] = (),
    ) -> None:
        """``credential_hosts``: hosts besides the URL's own that may receive its credentials
        (an adapter sends them nowhere else, whatever ``management_url`` names)."""
        self.url = url
        self.management_url = management_url or None
        self.timeout = timeout
        self.max_pages = max_pages
        self.credential_hosts = frozenset(h.strip().lower() for h in credential_hosts if h)

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise ``BrokerError`` unless the broker answers within the timeout."""

    @abc.abstractmethod
    def poll(self, addresses: Sequence[Address]) -> PollResult:
        """Sample every address in as few round trips as the broker allows (independent of the
        number of addresses where the broker has a bulk call). Addresses the broker does not
        have come back with ``exists=False``. Raises ``BrokerError`` only when the broker as a
        whole cannot be read."""

    @abc.abstractmethod
    def inspect(self, addresses: Sequence[Address]) -> dict[Address, Topology]:
        """Read the configuration behind each address (less often than ``poll``)."""

    def prepare_drain(self, address: Address) -> None:
        """Idempotently create what draining ``address`` needs on the broker, so that no dead
        letter is lost while the ingester is down (Redis: the dashboard's consumer group on the
        DLQ stream; NATS: the stream capturing MAX_DELIVERIES/TERMINATED advisories). The
        default does nothing (RabbitMQ's DLQ is a queue that keeps its messages)."""
        return None

    def retries(self, address: Address, retry_address: str = "", limit: int = 50) -> RetryView:
        """The messages of ``address`` waiting for a retry (``retry_address``: the declared
        retry queue, where the broker keeps them apart). Bounded: one or two requests, at
        most ``limit`` messages listed. Never consumes (no destructive peek); what the broker
        cannot show without consuming is ``None`` with a note saying so."""
        return RetryView(notes=[f"The {self.kind or 'broker'} adapter does not read retries."])

    @abc.abstractmethod
    def open_drain(self, address: Address) -> DrainSession:
        """Open a manual-ack consuming session on a dead-letter address. Never destructive:
        nothing is removed until ``DrainSession.ack``."""

    @abc.abstractmethod
    def open_publisher(self, target: Address) -> Publisher:
        """Open a confirmed publishing session to ``target`` (where a replay goes). Raises
        ``BrokerError(connection_lost=True)`` when the broker cannot be reached now."""

    @contextmanager
    def drain(self, address: Address) -> Iterator[DrainSession]:
        session = self.open_drain(address)
        try:
            yield session
        finally:
            session.close()

    @contextmanager
    def publisher(self, target: Address) -> Iterator[Publisher]:
        session = self.open_publisher(target)
        try:
            yield session
        finally:
            session.close()


def json_safe_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers as JSON-safe data: text stays text, bytes become text when valid UTF-8, else
    ``{"$bytes": "<hex>"}``; nested tables and lists are converted recursively; other scalars are
    kept when JSON can hold them, else their ``repr``. Values are never evaluated."""
    return _safe_table(headers or {}, 0)


#: Exact types kept as they are without a call of ``_json_safe`` (the common header values;
#: their subclasses take the general path, with the same result).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def _safe_table(table: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    """A table's entries made JSON-safe: ``_json_safe`` per value, inlined for plain values
    (a dead letter's dozen headers, each converted on the drain's thread)."""
    if depth > 32:
        return {str(k): _json_safe(v, depth) for k, v in table.items()}  # each its marker
    out: dict[str, Any] = {}
    for k, v in table.items():
        out[k if type(k) is str else str(k)] = v if type(v) in _PLAIN else _json_safe(v, depth)
    return out


def _json_safe(value: Any, depth: int) -> Any:
    if depth > 32:
        return "…(nested too deep)"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"$bytes": raw.hex()}
    if isinstance(value, Mapping):
        return _safe_table(value, depth + 1)
    if isinstance(value, list | tuple):
        return [_json_safe(v, depth + 1) for v in value]
    if hasattr(value, "timestamp"):
        return value.timestamp()
    return repr(value)
