"""ActiveMQ Classic adapter: STOMP through stomp.py, statistics through the statistics plugin.

Health: the broker's ``statisticsBrokerPlugin`` answers a message sent to
``ActiveMQ.Statistics.Destination.<queue>`` (with a ``reply-to``) with a map of that queue's
counters; STOMP reads it as JSON when the subscription asks for ``transformation:
jms-map-json``. One connection per poll, one request per queue, all pipelined, each carrying
``ActiveMQ.Statistics.Destination.List.End.With.Null`` so the plugin ends every answer with an
empty map: a queue the broker does not have is that empty answer alone (``exists=False``),
never a wait. Without the plugin nothing answers: every number is unknown, and ``limits`` says
why and how to fix it.

Mapping (docs/health.md): ``size`` is every message not yet acknowledged, so ``retained`` =
size, ``in_flight`` = ``inflightCount`` (dispatched, not acked), ``backlog`` = size − in flight;
``produced`` = ``enqueueCount``, ``delivered`` = ``dispatchCount``, ``acked`` =
``dequeueCount``; ``redelivered`` = dispatches given back (dispatch − dequeue − in flight: a
rollback, a closed consumer), which only grows. ActiveMQ resets these counters when it restarts.

Dead letters: ``ActiveMQ.DLQ`` (shared by every queue, ActiveMQ's default) or ``DLQ.<queue>``
(``individualDeadLetterStrategy``), drained with ``client-individual`` acks. The origin is the
``original-destination`` header; the identity is the JMS message id, which ActiveMQ keeps when
it dead-letters (a replay is a new message with a new id). Replays are sent persistently in
STOMP transactions whose COMMIT carries a ``receipt`` (the broker's confirmation of the batch);
text and bytes bodies both go byte-exact with ``content-length`` (``amq-msg-type: text`` keeps
a TextMessage a text one).

A shared ``ActiveMQ.DLQ`` drained for several channels: each channel's drain is
``Address(SHARED_DLQ, group=<its origin queue>)`` (``shared_dlq_address``) and subscribes with
the selector ``JMSDestination = 'queue://<origin>'``, which ActiveMQ evaluates on the original
destination of a dead letter: each channel takes exactly its own letters, and letters of a
queue no channel declares stay in the DLQ for whoever owns them (tried on 5.17). ActiveMQ pages
at most ``maxPageSize`` (200) messages of a queue into memory for dispatch, and a selector sees
only those: 200 letters nobody drains at the head of the DLQ hide every later one. How many
of the shared DLQ's letters came from one origin is unknown to the statistics plugin: such an
address polls as unknown, with the whole DLQ's size as ``shared_total``; the poller says why on
the channel, and warns once the whole DLQ holds a page (``PAGE_SIZE``) or more.

What STOMP cannot tell: the redelivery policy (``maximumRedeliveries``, backoff) lives in each
JMS client, and the broker's dead-letter strategy is in its XML; neither is readable here.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import logging
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import stomp
import stomp.exception

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

SHARED_DLQ = "ActiveMQ.DLQ"
#: ActiveMQ's default ``maxPageSize``: messages of a queue paged in for dispatch, all a selector
#: can see at once.
PAGE_SIZE = 200
INDIVIDUAL_DLQ_PREFIX = "DLQ."
STATS_PREFIX = "ActiveMQ.Statistics.Destination."
END_LIST = "ActiveMQ.Statistics.Destination.List.End.With.Null"
FIRST_TIMESTAMP = "ActiveMQ.Statistics.Destination.Include.First.Message.Timestamp"
PUBLISH_WINDOW = 500  # messages per STOMP transaction (one receipt, one journal write)

#: STOMP headers that describe the frame or the JMS message rather than the application's
#: properties: kept in ``properties`` (JMS headers) or dropped (frame bookkeeping).
_FRAME_HEADERS = frozenset(
    {"destination", "subscription", "ack", "content-length", "receipt", "transformation"}
)
_JMS_HEADERS = {
    "message-id": "message_id",
    "correlation-id": "correlation_id",
    "type": "type",
    "timestamp": "timestamp",
    "priority": "priority",
    "expires": "expires",
    "persistent": "persistent",
    "redelivered": "redelivered",
    "reply-to": "reply_to",
    "original-destination": "original_destination",
    "JMSXGroupID": "group_id",
    "JMSXGroupSeq": "group_seq",
    "JMSXUserID": "user_id",
    "amq-msg-type": "body_type",
}
#: What a replay may set from the stored JMS headers (the broker assigns id and timestamp).
_REPLAYED_JMS = {
    "correlation_id": "correlation-id",
    "type": "type",
    "priority": "priority",
    "reply_to": "reply-to",
    "group_id": "JMSXGroupID",
    "group_seq": "JMSXGroupSeq",
}
#: Header names a replay never takes from the stored application headers (the frame's own).
_RESERVED = frozenset(
    {
        h.lower()
        for h in (*_FRAME_HEADERS, *_JMS_HEADERS, "id", "login", "passcode", "host", "transaction")
    }
)
_CAUSE_COUNT = re.compile(r"Delivery\[(\d+)\] exceeds redelivery policy limit")
_CAUSE_POLICY = re.compile(r"RedeliveryPolicy \{([^}]*)\}")
#: The RedeliveryPolicy fields a JMS client's poison ack quotes, as a death records them.
_POLICY_FIELDS = (
    "maximumRedeliveries",
    "initialRedeliveryDelay",
    "redeliveryDelay",
    "maximumRedeliveryDelay",
    "useExponentialBackOff",
    "backOffMultiplier",
)


def shared_dlq_address(name: str, origin: str) -> Address:
    """The address draining (and sampling) ``name`` for one channel: the shared ``ActiveMQ.DLQ``
    with the channel's queue as ``group`` (its letters alone, see the module docstring); any
    other DLQ (``DLQ.<queue>``, the queue's own) as it is."""
    return Address(name, origin) if name == SHARED_DLQ and origin else Address(name)


def origin_selector(origin: str) -> str:
    """The STOMP selector taking one origin queue's letters from a shared DLQ: ActiveMQ's
    ``JMSDestination`` is a dead letter's original destination (a string literal doubles its
    quotes)."""
    return "JMSDestination = 'queue://{}'".format(origin.replace("'", "''"))


class ActiveMQAdapter(BrokerAdapter):
    """ActiveMQ Classic queues over STOMP. ``url``: ``stomp://user:password@host:61613`` (or
    ``stomp+ssl://`` / ``stomp+tls://`` for a TLS connector)."""

    kind = "activemq"

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
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError:
            raise BrokerError("bad STOMP URL (unreadable port)", permanent=True) from None
        if parts.scheme not in ("stomp", "stomp+ssl", "stomp+tls") or not parts.hostname:
            raise BrokerError(
                "not a STOMP URL (expected stomp://user:password@host:61613)", permanent=True
            )
        self.host = parts.hostname
        self.port = port or 61613
        self.tls = parts.scheme != "stomp"
        self.user = urllib.parse.unquote(parts.username) if parts.username else None
        self.password = urllib.parse.unquote(parts.password) if parts.password else None

    def _session(self, purpose: str) -> _Stomp:
        return _Stomp(self, purpose)

    # -- ping / poll ---------------------------------------------------------------------

    def ping(self) -> None:
        self._session("ping").close()

    def poll(self, addresses: Sequence[Address]) -> PollResult:
        started = time.monotonic()
        now = time.time()
        maps, answered, errors = self._statistics([a.name for a in addresses])
        stats: dict[Address, ChannelStats] = {}
        limits: list[str] = []
        for address in addresses:
            if address.name not in answered or address.group:
                # Not answered, or one origin's share of a shared DLQ (which no statistic
                # counts): exists, every number unknown; the whole DLQ's size beside it.
                whole = maps.get(address.name) if address.group else None
                total = _int(whole.get("size")) if whole else None
                stats[address] = ChannelStats(
                    address, exists=True, shared_total=total, observed_at=now
                )
                continue
            found = maps.get(address.name)
            if found is None:
                stats[address] = _absent(address, now)
                continue
            stats[address] = _sample(address, found, now)
        if len(answered) < len({a.name for a in addresses}):
            limits.append(
                "The ActiveMQ statistics plugin did not answer: depth, consumers and counters"
                " are unknown. Add <statisticsBrokerPlugin/> to the broker's <plugins> (and"
                " XStream/Jettison on its classpath for STOMP's jms-map-json) and restart it."
            )
        trips = 1 + (1 if addresses else 0)  # connect; the pipelined requests and answers
        return PollResult(stats, trips, time.monotonic() - started, errors, limits)

    def _statistics(
        self, names: Sequence[str]
    ) -> tuple[dict[str, dict[str, Any]], set[str], list[str]]:
        """(statistics map by queue name, the names whose answer ended, errors). Bounded by
        the timeout as a whole: an answer that has not ended by then stays unknown."""
        wanted = list(dict.fromkeys(names))
        maps: dict[str, dict[str, Any]] = {}
        ended: set[str] = set()
        errors: list[str] = []
        if not wanted:
            return maps, ended, errors
        session = self._session("poll")
        try:
            reply = f"/temp-queue/dlo-stats-{uuid.uuid4().hex[:12]}"
            sub = session.subscribe(reply, ack="auto", transformation="jms-map-json")
            by_id = {f"s{i}": name for i, name in enumerate(wanted)}
            for corr, name in by_id.items():
                session.send(
                    f"/queue/{STATS_PREFIX}{name}",
                    b"",
                    {
                        "reply-to": reply,
                        "correlation-id": corr,
                        END_LIST: "true",
                        FIRST_TIMESTAMP: "true",
                    },
                )
            deadline = time.monotonic() + self.timeout
            while len(ended) < len(by_id):
                frame = session.next_message(sub, deadline)
                if frame is None:
                    break
                found_name = by_id.get(frame.headers.get("correlation-id", ""))
                if found_name is None:
                    continue
                name = found_name
                entries = _stats_map(frame.body)
                if entries is None:
                    errors.append(f"statistics of {name!r}: not a map answer")
                    continue
                if not entries:
                    ended.add(name)
                elif _destination_name(entries) in (f"queue://{name}", None):
                    maps[name] = entries
        finally:
            session.close()
        return maps, ended, errors

    # -- inspect / retries ---------------------------------------------------------------

    def inspect(self, addresses: Sequence[Address]) -> dict[Address, Topology]:
        """What STOMP can read: existence and consumers. The dead-letter strategy and the
        redelivery policy cannot be read over STOMP, and say so in ``raw['notes']``."""
        maps, answered, _errors = self._statistics([a.name for a in addresses])
        result: dict[Address, Topology] = {}
        for address in addresses:
            if address.name not in answered:
                result[address] = Topology(address, exists=True)
                continue
            found = maps.get(address.name)
            result[address] = Topology(
                address,
                exists=found is not None or _is_dead_letter_name(address.name),
                kind="activemq-queue",
                raw={
                    "statistics": {k: v for k, v in (found or {}).items() if k != "brokerId"},
                    "notes": [
                        "The redelivery policy (maximumRedeliveries, initialRedeliveryDelay,"
                        " useExponentialBackOff, backOffMultiplier) is set in each JMS client's"
                        " connection factory, not on the broker: it cannot be read over STOMP.",
                        "The dead-letter strategy (shared ActiveMQ.DLQ or individual"
                        " DLQ.<queue>) is in the broker's activemq.xml, not readable over"
                        " STOMP; by default every queue shares ActiveMQ.DLQ.",
                        "Non-persistent messages are not dead-lettered by default"
                        " (processNonPersistent=false): they are dropped.",
                    ],
                },
            )
        return result

    def retries(self, address: Address, retry_address: str = "", limit: int = 50) -> RetryView:
        return RetryView(
            notes=[
                "ActiveMQ redelivers from the JMS client's session (its RedeliveryPolicy), not"
                " from a broker-side retry queue: the broker cannot list what waits for a"
                " retry, nor when. Over STOMP a message given back is simply redelivered."
            ]
        )

    # -- drain / publish -----------------------------------------------------------------

    def open_drain(self, address: Address) -> DrainSession:
        return ActiveMQDrainSession(self, address)

    def open_publisher(self, target: Address) -> Publisher:
        return ActiveMQPublisher(self, target)


class _Stomp(stomp.ConnectionListener):
    """One STOMP 1.2 connection with bounded waits: stomp.py's own waits are not bounded, so
    every frame is handed to this listener and waited for here, on one condition."""

    def __init__(self, adapter: ActiveMQAdapter, purpose: str) -> None:
        self.adapter = adapter
        self.purpose = purpose
        self.cond = threading.Condition()
        self.connected = False
        self.lost = False
        self.error: str | None = None
        self.error_receipts: dict[str, str] = {}
        self.receipts: set[str] = set()
        self.queues: dict[str, collections.deque[Any]] = {}
        self._next_sub = 0
        self.conn = stomp.Connection12(
            [(adapter.host, adapter.port)],
            heartbeats=(0, 0),
            auto_decode=False,
            timeout=adapter.timeout,
            reconnect_attempts_max=1,
            prefer_localhost=False,
            try_loopback_connect=False,
        )
        if adapter.tls:
            self.conn.set_ssl([(adapter.host, adapter.port)])
        self.conn.set_listener("dlo", self)
        try:
            self.conn.connect(
                adapter.user, adapter.password, wait=False, headers={"host": adapter.host}
            )
            self._wait(lambda: self.connected, time.monotonic() + adapter.timeout, "connect")
        except BaseException as exc:
            self.close()
            raise _stomp_error(exc, f"{purpose}: connect") from None

    # -- listener (stomp.py's receiver thread) --------------------------------------------

    def on_connected(self, frame: Any) -> None:
        with self.cond:
            self.connected = True
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        text = str(frame.headers.get("message") or "ERROR frame")[:300]
        with self.cond:
            receipt = frame.headers.get("receipt-id")
            if receipt:
                self.error_receipts[receipt] = text
            else:
                self.error = text
            self.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.cond:
            self.lost = True
            self.cond.notify_all()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self.cond.notify_all()

    def on_message(self, frame: Any) -> None:
        with self.cond:
            self.queues.setdefault(frame.headers.get("subscription", ""), collections.deque())
            self.queues[frame.headers.get("subscription", "")].append(frame)
            self.cond.notify_all()

    # -- caller side ---------------------------------------------------------------------

    def _wait(self, ready: Callable[[], bool], deadline: float, action: str) -> None:
        with self.cond:
            while not ready():
                self._raise_broken(action)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BrokerError(
                        f"activemq {self.purpose}: {action}: no answer in time (timeout)",
                        connection_lost=True,
                    )
                self.cond.wait(remaining)

    def _raise_broken(self, action: str) -> None:
        if self.error is not None:
            permanent = not self.connected and _refused_login(self.error)
            raise BrokerError(
                f"activemq {self.purpose}: {action}: {self.error}",
                permanent=permanent,
                connection_lost=not permanent,
            )
        if self.lost:
            raise BrokerError(
                f"activemq {self.purpose}: {action}: connection closed", connection_lost=True
            )

    def subscribe(self, destination: str, *, ack: str, **headers: str) -> str:
        self._next_sub += 1
        sub = f"dlo-{self._next_sub}"
        with self.cond:
            self.queues.setdefault(sub, collections.deque())
        self._call(lambda: self.conn.subscribe(destination, sub, ack=ack, headers=headers))
        return sub

    def send(self, destination: str, body: bytes, headers: dict[str, str]) -> None:
        self._call(lambda: self.conn.send(destination, body, headers=headers))

    def _call(self, action: Callable[[], None]) -> None:
        with self.cond:
            self._raise_broken("send")
        try:
            action()
        except Exception as exc:
            raise _stomp_error(exc, f"{self.purpose}: send") from None

    def next_message(self, sub: str, deadline: float) -> Any | None:
        """The next frame of ``sub``, or None when none came by ``deadline``."""
        with self.cond:
            queue = self.queues.setdefault(sub, collections.deque())
            while not queue:
                self._raise_broken("receive")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.cond.wait(remaining)
            return queue.popleft()

    def take(self, sub: str, limit: int) -> list[Any]:
        with self.cond:
            queue = self.queues.setdefault(sub, collections.deque())
            return [queue.popleft() for _ in range(min(limit, len(queue)))]

    def ack(self, ack_ids: Sequence[str], action: str) -> None:
        """ACK each id, the last one with a receipt, and wait for it: STOMP frames are handled
        in order on one connection, so the receipt means every ACK before it was processed."""
        receipt = f"ack-{uuid.uuid4().hex}"
        for n, ack_id in enumerate(ack_ids):
            with_receipt = receipt if n == len(ack_ids) - 1 else None
            self._call(functools.partial(self.conn.ack, ack_id, receipt=with_receipt))
        self._wait(
            lambda: receipt in self.receipts or receipt in self.error_receipts,
            time.monotonic() + self.adapter.timeout,
            action,
        )
        with self.cond:
            refused = self.error_receipts.pop(receipt, None)
            self.receipts.discard(receipt)
        if refused is not None:
            raise BrokerError(f"activemq {self.purpose}: {action}: refused: {refused}")

    def close(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is None:
            return
        with contextlib.suppress(Exception):
            if self.connected and not self.lost and self.error is None:
                conn.disconnect()
                with self.cond:
                    self.cond.wait_for(lambda: self.lost, timeout=min(1.0, self.adapter.timeout))
        with contextlib.suppress(Exception):
            conn.transport.disconnect_socket()
        with contextlib.suppress(Exception):
            conn.remove_listener("dlo")


class ActiveMQDrainSession(DrainSession):
    """``client-individual`` consumption of a dead-letter queue: nothing leaves the broker
    until ``ack``, which waits for a receipt after its ACK frames. ActiveMQ pages a queue in
    ``maxPageSize`` (200) messages at a time and unacked ones hold the page: a fetch returns at
    most that many until the caller acks, as ingest does after each stored batch."""

    def __init__(self, adapter: ActiveMQAdapter, address: Address) -> None:
        self.adapter = adapter
        self.address = address
        self._session = adapter._session(f"drain {address.name}")
        self._sub: str | None = None
        self._outstanding: set[str] = set()

    def fetch(self, max_batch: int, wait_s: float) -> list[DeadLetter]:
        if max_batch <= 0:
            return []
        if self._sub is None:
            prefetch = str(min(max(2 * max_batch, 1), 10_000))
            headers = {"activemq.prefetchSize": prefetch}
            if self.address.group:  # one origin's letters of a shared DLQ
                headers["selector"] = origin_selector(self.address.group)
            self._sub = self._session.subscribe(
                f"/queue/{self.address.name}", ack="client-individual", **headers
            )
        first = self._session.next_message(self._sub, time.monotonic() + max(wait_s, 0.0))
        if first is None:
            return []
        frames = [first, *self._session.take(self._sub, max_batch - 1)]
        letters = [_dead_letter(self.address.name, f) for f in frames]
        self._outstanding.update(str(letter.token) for letter in letters)
        return letters

    def ack(self, letters: Sequence[DeadLetter]) -> None:
        ids = [str(letter.token) for letter in letters]
        unknown = [i for i in ids if i not in self._outstanding]
        if unknown:
            raise BrokerError(f"ack ids not outstanding on this session: {unknown[:5]}")
        if not ids:
            return
        self._session.ack(ids, f"ack {self.address.name}")
        self._outstanding.difference_update(ids)

    def close(self) -> None:
        self._outstanding.clear()
        self._session.close()


class ActiveMQPublisher(Publisher):
    """Persistent sends to one queue in STOMP transactions of up to ``PUBLISH_WINDOW``
    messages: BEGIN, the sends, COMMIT with a receipt. ActiveMQ answers the receipt once the
    transaction is stored, so it confirms every message of it, at one journal write per batch
    instead of one per message (a receipt on each send makes every send synchronous). A
    connection lost before that receipt leaves the batch uncommitted: reported lost (in
    doubt, though the broker drops an uncommitted transaction)."""

    def __init__(self, adapter: ActiveMQAdapter, target: Address) -> None:
        self.adapter = adapter
        self.target = target
        self._session = adapter._session(f"publish {target.name}")

    def publish(self, messages: Sequence[OutgoingMessage]) -> list[PublishOutcome]:
        outcomes: list[PublishOutcome] = []
        lost = ""
        for start in range(0, len(messages), PUBLISH_WINDOW):
            chunk = messages[start : start + PUBLISH_WINDOW]
            if lost:
                outcomes.extend(PublishOutcome.lost(m.key, f"not sent: {lost}") for m in chunk)
                continue
            try:
                outcomes.extend(self._commit(chunk))
            except BrokerError as exc:
                lost = str(exc)
                outcomes.extend(PublishOutcome.lost(m.key, lost) for m in chunk)
        return outcomes

    def _commit(self, chunk: Sequence[OutgoingMessage]) -> list[PublishOutcome]:
        session = self._session
        tx, receipt = f"tx-{uuid.uuid4().hex}", f"commit-{uuid.uuid4().hex}"
        outcomes: list[PublishOutcome | None] = [None] * len(chunk)
        session._call(functools.partial(session.conn.begin, tx))
        for index, message in enumerate(chunk):
            headers = _frame_headers(message, tx)
            too_big = _over_frame_limits(headers, message.body)
            if too_big:
                # The broker would answer with an ERROR and drop the connection, which reads
                # as an outage: refused here instead, permanently (it will never fit).
                outcomes[index] = PublishOutcome(
                    message.key, False, too_big, permanent=True, refused=True
                )
                continue
            session.send(f"/queue/{self.target.name}", message.body, headers)
        session._call(functools.partial(session.conn.commit, tx, headers={"receipt": receipt}))
        session._wait(
            lambda: receipt in session.receipts or receipt in session.error_receipts,
            time.monotonic() + self.adapter.timeout,
            f"commit to {self.target.name}",
        )
        with session.cond:
            refused = session.error_receipts.pop(receipt, None)
            session.receipts.discard(receipt)
        return [
            outcome
            if outcome is not None
            else PublishOutcome(message.key, True)
            if refused is None
            else PublishOutcome(message.key, False, f"refused: {refused}", refused=True)
            for outcome, message in zip(outcomes, chunk, strict=True)
        ]

    def close(self) -> None:
        self._session.close()


# -- helpers -----------------------------------------------------------------------------


def _stomp_error(exc: BaseException, action: str) -> BrokerError:
    if isinstance(exc, BrokerError):
        return exc
    detail = str(exc) or type(exc).__name__
    lost = isinstance(
        exc,
        stomp.exception.ConnectFailedException
        | stomp.exception.NotConnectedException
        | OSError
        | TimeoutError,
    )
    return BrokerError(
        f"activemq {action}: {type(exc).__name__}: {detail}"[:500], connection_lost=lost
    )


def _refused_login(message: str) -> bool:
    low = message.lower()
    return any(w in low for w in ("password", "user name", "authentication", "not authorized"))


def _is_dead_letter_name(name: str) -> bool:
    return name == SHARED_DLQ or name.startswith(INDIVIDUAL_DLQ_PREFIX)


def _stats_map(body: bytes) -> dict[str, Any] | None:
    """The statistics plugin's map message as jms-map-json writes it (XStream's JSON):
    ``{"map": {"entry": [{"string": "size", "long": 3}, {"string": ["k", "text"]}, …]}}``;
    ``{"map": ""}`` is the empty map ending an answer. None when it is not that shape."""
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(document, dict) or "map" not in document:
        return None
    inner = document["map"]
    if inner in ("", None):
        return {}
    if not isinstance(inner, dict):
        return None
    entries = inner.get("entry")
    if isinstance(entries, dict):
        entries = [entries]
    out: dict[str, Any] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        key = entry.get("string")
        if isinstance(key, list) and len(key) == 2:
            out[str(key[0])] = key[1]
            continue
        others = [v for k, v in entry.items() if k != "string"]
        if isinstance(key, str) and len(others) == 1:
            out[key] = others[0]
    return out


def _destination_name(entries: dict[str, Any]) -> str | None:
    value = entries.get("destinationName")
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _sample(address: Address, m: dict[str, Any], now: float) -> ChannelStats:
    size, inflight = _int(m.get("size")), _int(m.get("inflightCount"))
    dispatched, dequeued = _int(m.get("dispatchCount")), _int(m.get("dequeueCount"))
    consumers = _int(m.get("consumerCount"))
    backlog = max(size - inflight, 0) if size is not None and inflight is not None else None
    given_back = None
    if dispatched is not None and dequeued is not None and inflight is not None:
        given_back = max(dispatched - dequeued - inflight, 0)
    first = _int(m.get("firstMessageTimestamp"))
    oldest = max(0.0, now - first / 1000.0) if first and size else None
    return ChannelStats(
        address,
        backlog=backlog,
        in_flight=inflight,
        retained=size,
        consumers=consumers,
        active_consumers=consumers,
        redelivered=given_back,
        oldest_message_age_s=oldest,
        produced=_int(m.get("enqueueCount")),
        delivered=dispatched,
        acked=dequeued,
        observed_at=now,
    )


def _absent(address: Address, now: float) -> ChannelStats:
    """A queue the broker does not have. ActiveMQ creates a dead-letter queue with its first
    dead letter, so an absent ``ActiveMQ.DLQ`` / ``DLQ.<queue>`` holds none: 0, not missing."""
    if _is_dead_letter_name(address.name):
        return ChannelStats(
            address, backlog=0, in_flight=0, retained=0, consumers=0, observed_at=now
        )
    return ChannelStats(address, exists=False, observed_at=now)


def _queue_name(destination: str | None) -> str | None:
    if not destination:
        return None
    for prefix in ("/queue/", "queue://"):
        if destination.startswith(prefix):
            return destination[len(prefix) :]
    return destination


def _dead_letter(dlq: str, frame: Any) -> DeadLetter:
    raw: dict[str, str] = dict(frame.headers)
    body: bytes = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
    properties: dict[str, Any] = {}
    headers: dict[str, Any] = {}
    for name, value in raw.items():
        if name in _FRAME_HEADERS:
            continue
        if name in _JMS_HEADERS:
            properties[_JMS_HEADERS[name]] = value
        else:
            headers[name] = value
    for name in ("timestamp", "priority", "expires", "group_seq"):
        if name in properties:
            properties[name] = _int(properties[name])
    for name in ("persistent", "redelivered"):
        if name in properties:
            properties[name] = str(properties[name]).lower() == "true"
    # A frame without content-length is a TextMessage; amq-msg-type says so explicitly.
    if "body_type" not in properties:
        properties["body_type"] = "bytes" if "content-length" in raw else "text"
    origin = _queue_name(raw.get("original-destination"))
    cause = raw.get("dlqDeliveryFailureCause")
    error_class, error_message = _cause(cause)
    counted = _CAUSE_COUNT.search(cause or "")
    message_id = raw.get("message-id") or ""
    identity = message_id or hashlib.sha256(body).hexdigest()
    return DeadLetter(
        dedupe_key=f"amq:{dlq}:{identity}",
        body=body,
        headers=json_safe_headers(headers),
        properties=json_safe_headers(properties),
        token=raw.get("ack", ""),
        broker_id=message_id,
        redelivery_count=int(counted.group(1)) if counted else None,
        reason="delivery-limit" if counted else ("dead-lettered" if cause else None),
        error_class=error_class,
        error_message=error_message,
        first_death_queue=origin,
        dead_lettered_at=None,
        death_history=_death(cause, origin, counted),
    )


def _death(cause: str | None, origin: str | None, counted: Any) -> list[dict[str, Any]]:
    """The one death ActiveMQ records: where from, why, and, when a JMS client gave up past
    its RedeliveryPolicy, that policy as the client quoted it (the only place the broker side
    ever sees a client's maximumRedeliveries and backoff)."""
    if not cause and not origin:
        return []
    death: dict[str, Any] = {"queue": origin, "reason": "delivery-limit" if counted else None}
    if counted:
        death["deliveries"] = int(counted.group(1))
    quoted = _CAUSE_POLICY.search(cause or "")
    if quoted:
        fields = dict(
            part.strip().split(" = ", 1) for part in quoted.group(1).split(",") if " = " in part
        )
        death["redelivery_policy"] = {
            name: _policy_value(fields[name]) for name in _POLICY_FIELDS if name in fields
        }
    return [death]


def _policy_value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


def _cause(cause: str | None) -> tuple[str | None, str | None]:
    """(exception class, message) from ``dlqDeliveryFailureCause`` ("java.lang.Throwable:
    Delivery[7] exceeds …" or a consumer's own exception text)."""
    if not cause:
        return None, None
    head, sep, rest = cause.partition(": ")
    if sep and re.fullmatch(r"[A-Za-z_$][\w$.]*", head):
        return head[:200], rest[:2000]
    return None, cause[:2000]


def _frame_headers(message: OutgoingMessage, transaction: str) -> dict[str, str]:
    """The SEND frame's headers: the application's properties as they were (reserved frame
    names excepted), the replayable JMS headers, persistent, byte-exact length, the
    transaction it is committed in."""
    headers: dict[str, str] = {}
    for name, value in (message.headers or {}).items():
        if str(name).lower() in _RESERVED or value is None:
            continue
        headers[escape_name(str(name))] = _header_text(value)
    for prop, header in _REPLAYED_JMS.items():
        value = (message.properties or {}).get(prop)
        if value is not None and value != "":
            headers[header] = _header_text(value)
    if (message.properties or {}).get("body_type") == "text":
        headers["amq-msg-type"] = "text"
    headers["persistent"] = "true"
    headers["content-length"] = str(len(message.body))
    headers["transaction"] = transaction
    return headers


#: ActiveMQ's STOMP frame limits (its defaults: transport.maxHeaders, maxHeaderLength,
#: maxDataLength); a frame past them is answered with an ERROR and a closed connection.
MAX_HEADERS = 1000
MAX_HEADER_LENGTH = 10 * 1024
MAX_DATA_LENGTH = 100 * 1024 * 1024


def _over_frame_limits(headers: dict[str, str], body: bytes) -> str:
    """Why this SEND frame is past ActiveMQ's default STOMP limits, or ""."""
    if len(headers) + 1 > MAX_HEADERS:  # + destination
        return f"too many headers for ActiveMQ's STOMP ({len(headers)} > {MAX_HEADERS - 1})"
    for name, value in headers.items():
        escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
        if len(f"{name}:{escaped}".encode()) > MAX_HEADER_LENGTH:
            return (
                f"header {name[:60]!r} longer than ActiveMQ's STOMP limit ({MAX_HEADER_LENGTH} B)"
            )
    if len(body) > MAX_DATA_LENGTH:
        return f"body larger than ActiveMQ's STOMP limit ({MAX_DATA_LENGTH} B)"
    return ""


def escape_name(name: str) -> str:
    """A header *name* escaped as STOMP 1.2 requires (stomp.py escapes values only: a name
    with a colon would otherwise be split by the broker at that colon)."""
    return name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace(":", "\\c")


def _header_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


__all__ = ["PAGE_SIZE", "SHARED_DLQ", "ActiveMQAdapter", "origin_selector", "shared_dlq_address"]
