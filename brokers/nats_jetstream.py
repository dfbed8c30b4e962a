"""NATS JetStream adapter (kind ``"nats"``).

``Address.name`` is the stream and ``Address.group`` the durable consumer (``""`` samples the
stream alone). nats-py is asyncio; this adapter is synchronous, so every one-shot call runs on
a private event loop that it closes afterwards, and drain/publish sessions own one loop each.
Every connection uses ``connect_timeout=self.timeout`` and no reconnects; every request is
bounded by ``self.timeout``; every connection is closed.

Polling uses the paged list APIs: ``$JS.API.STREAM.LIST`` (256 stream infos per page, all
pages after the first requested concurrently) and, per stream that has consumers to sample,
``$JS.API.CONSUMER.LIST.<stream>`` (or ``CONSUMER.INFO`` when fewer consumers are wanted than
the list has pages). ``round_trips`` counts JetStream API requests: it grows with the number of
*streams* holding sampled consumers (JetStream has no account-wide consumer list without the
system account or the monitoring port), never with the number of consumers. Requests run
concurrently, at most ``max_in_flight`` at a time.

With a ``management_url`` (the server's monitoring port, ``http://host:8222``), ``poll`` and
``inspect`` read ``GET /jsz?streams=true&consumers=true&config=true`` instead: every stream and
consumer of every JetStream account in one HTTP request (the server pages *accounts*, 1024 per
``offset``/``limit`` page, never streams), so ``round_trips`` counts HTTP requests and does not
grow with the channel count. ``?acc=<account>`` on the management URL restricts it to one
account. The answer is authoritative for a single server: a stream or consumer it does not list
does not exist. Where it cannot be (a clustered server lists only the streams and consumers it
hosts; a stream name found in several accounts; accounts beyond ``max_pages``), those addresses
alone are resolved through the JetStream API as above, and those requests are counted too.

Dead letters. JetStream has no DLQ; when a consumer gives up on a message it publishes a
``MAX_DELIVERIES`` or ``MSG_TERMINATED`` advisory. ``prepare_drain`` creates the dashboard-owned
stream ``DLO_ADVISORIES`` (file storage, bounded by age and count) capturing both advisory
subjects for the whole account, so none is lost while the ingester is down. ``open_drain``
binds a durable pull consumer on it filtered to one stream/consumer; each advisory becomes a
``DeadLetter`` whose body and headers are read back from the original stream by sequence.

Identity (docs/identity.md): one death is one advisory. The key is
``nats:<stream>:<stream_seq>:<consumer>:<advisory id>``: a redelivered advisory has the same id,
a replay that dies again is a new stream sequence, and the same message given up by a second
consumer (or a recreated one) is a second advisory.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

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

T = TypeVar("T")

API = "$JS.API"
ADVISORY_STREAM = "DLO_ADVISORIES"
DRAIN_SUFFIXES = ("_md", "_term")  # one drain consumer per advisory kind
MAX_DELIVERIES_PREFIX = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
TERMINATED_PREFIX = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED"
ADVISORY_SUBJECTS = [f"{MAX_DELIVERIES_PREFIX}.>", f"{TERMINATED_PREFIX}.>"]
#: ``Address.group`` prefix of a *copy stream* drain: a stream of copies the application's
#: consumer republished (its DLQ or poison stream), followed by the channel's own
#: ``stream/consumer`` (``copy_address``). Not a consumer name (">" cannot be in one).
COPY_GROUP = ">copies:"
#: Headers by which a copy names the message it copies (JetStream's own RePublish names;
#: ``Nats-Consumer``, optional, names the durable that gave it up).
COPY_STREAM_HEADER, COPY_SEQUENCE_HEADER, COPY_SUBJECT_HEADER, COPY_CONSUMER_HEADER = (
    "Nats-Stream",
    "Nats-Sequence",
    "Nats-Subject",
    "Nats-Consumer",
)
# ``term`` reasons shaped like ``CustomerNotFound: customer c-7 does not exist``.
_CLASS_PREFIX = re.compile(r"^([A-Za-z_][\w.$:]{0,199}?)\s*:\s+(.+)$", re.DOTALL)
LIST_PAGE = 256  # JetStream's page size for STREAM.LIST / CONSUMER.LIST
JSZ_PAGE = 1024  # accounts per /jsz page (the server's default limit)
PUBLISH_WINDOW = 256
CLOSE_TIMEOUT_S = 5.0  # how long a close may flush before the socket is aborted
_VALID_SCHEMES = {"nats", "tls", "ws", "wss"}
_STREAM_NAME = re.compile(r"[^.*>\s]+")  # what JetStream accepts as a stream name
_HEADER_NAME = re.compile(r"^[!-9;-~]+$")  # printable ASCII except ':' (RFC 7230 token-ish)


# --- event loop plumbing ---------------------------------------------------------------------


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what nats-py left behind, then close the loop (no ResourceWarning leaks)."""
    try:
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def _run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on ``loop``; from a thread that already runs a loop (an async
    caller of this sync API), run it on a helper thread instead of failing."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return loop.run_until_complete(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(loop.run_until_complete, coro).result()


def _run_once(coro: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.new_event_loop()
    try:
        return _run_on(loop, coro)
    finally:
        close_loop(loop)


# --- errors and parsing ----------------------------------------------------------------------


def _broker_error(exc: BaseException, what: str) -> BrokerError:
    if isinstance(exc, BrokerError):
        return exc
    permanent = isinstance(
        exc,
        nats.errors.AuthorizationError
        | nats.errors.InvalidUserCredentialsError
        | nats.errors.SecureConnRequiredError
        | nats.errors.SecureConnWantedError
        | nats.errors.NoRespondersError  # on $JS.API: JetStream is not enabled for the account
        | ValueError,
    )
    if isinstance(exc, nats.js.errors.APIError):
        permanent = exc.code is not None and 400 <= exc.code < 500
    message = str(exc) or type(exc).__name__
    if isinstance(exc, nats.errors.NoRespondersError):
        message = "no responders (JetStream not enabled for this account?)"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        message = "timed out"
    if isinstance(exc, nats.errors.NoServersError):
        message = "no server reachable (connection refused or closed)"
    # The connection is gone or the server does not answer: reopen (sessions never reconnect
    # on their own, see ``_connect``) rather than blame the message.
    lost = isinstance(
        exc,
        nats.errors.ConnectionClosedError
        | nats.errors.ConnectionDrainingError
        | nats.errors.ConnectionReconnectingError
        | nats.errors.StaleConnectionError
        | nats.errors.UnexpectedEOF
        | nats.errors.NoServersError
        | nats.errors.OutboundBufferLimitError
        | nats.errors.TimeoutError
        | asyncio.TimeoutError
        | TimeoutError
        | OSError,
    )
    return BrokerError(
        f"nats {what}: {type(exc).__name__}: {message}",
        permanent=permanent,
        connection_lost=lost,
    )


_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def _parse_ts(value: Any) -> float | None:
    """RFC 3339 with nanoseconds (Go's format) → epoch seconds; the zero time → ``None``."""
    if not isinstance(value, str):
        return None
    match = _TS.match(value)
    if not match:
        return None
    base, frac, zone = match.groups()
    if base.startswith("0001-"):
        return None
    parsed = dt.datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    return parsed.timestamp() + (float("0." + frac) if frac else 0.0)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_headers(raw: bytes) -> dict[str, Any]:
    """``NATS/1.0\\r\\nK: v\\r\\n…`` → ``{K: v}`` (a repeated header becomes a list)."""
    headers: dict[str, Any] = {}
    lines = raw.decode("utf-8", "backslashreplace").split("\r\n")
    for line in lines[1:]:
        if not line or ":" not in line:
            continue
        key, _, value = line.partition(":")
        value = value.strip()
        if key in headers:
            previous = headers[key]
            headers[key] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            headers[key] = value
    return headers


def _death_key(stream: str, stream_seq: int, advisory: dict[str, Any], advisory_seq: int) -> str:
    """The identity of one death on NATS (see docs/identity.md): the advisory's own id.

    The server publishes one advisory per death and gives it a unique ``id``; a redelivery of
    that advisory (a crash before our ack) carries the same id, while a new death of the same
    message gets a new advisory: a replay is a new stream message (new ``stream_seq``), and the
    same stored message given up by a second consumer, or by a consumer recreated under the
    same name, is a second advisory. ``stream:stream_seq`` stays in the key for people reading
    it; without an ``id`` (never seen from a server) the advisory's sequence stands in."""
    death = str(advisory.get("id") or f"advisory-seq-{advisory_seq}")
    consumer = str(advisory.get("consumer") or "")
    key = f"nats:{stream}:{stream_seq}:{consumer}:{death}"
    if len(key) > 200:
        key = "nats:" + hashlib.sha256(key.encode()).hexdigest()
    return key


def drain_consumer_name(address: Address, installation: str = "") -> str:
    """``dlo_<installation>_<stream>_<consumer>``: one set of drain consumers per dashboard
    installation, so two dashboards on one account each see every advisory. Without an
    installation id: the name used before ids existed (the legacy consumer)."""
    prefix = f"dlo_{installation}_" if installation else "dlo_"
    name = f"{prefix}{address.name}_{address.group or 'all'}"
    if len(name) > 120 or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        name = prefix + hashlib.sha256(str(address).encode()).hexdigest()[:32]
    return name


def _stats(
    address: Address,
    stream: dict[str, Any],
    consumer: dict[str, Any] | None,
    active_idle_s: float = 60.0,
) -> ChannelStats:
    """One sample (docs/health.md, "NATS JetStream"):

    1. ``backlog`` is ``num_pending``, ``in_flight`` ``num_ack_pending``; ``delivered`` the
       highest stream sequence delivered, the consumer's position (redeliveries do not move it).
    2. ``acked`` stays unknown: the ack *floor* stops at the first message waiting for a retry
       (``nak`` with a delay) while the consumer acks everything after it, so it is not a
       count of acknowledgements; health judges progress by ``delivered`` instead.
    3. ``redelivered`` is counted as deliveries minus new messages delivered (consumer
       sequence minus stream sequence) where that holds: an unfiltered consumer delivering
       from the stream's start. Elsewhere unknown: ``num_redelivered`` is a gauge (messages
       pending that were delivered more than once), not the counter the contract asks for.
    4. ``consumers``: a push consumer is bound or not; a pull consumer has at least one client
       while a pull request waits or it delivered or had an ack within ``active_idle_s``,
       else none (a pull consumer has no subscription the server could count).
    """
    state = stream.get("state") or {}
    messages = _int_or_none(state.get("messages"))
    first_ts = _parse_ts(state.get("first_ts"))
    now = time.time()
    sample = ChannelStats(
        address=address, retained=messages, produced=_int_or_none(state.get("last_seq"))
    )
    if not address.group:
        if messages == 0:
            sample.oldest_message_age_s = 0.0
        elif messages and first_ts is not None:
            sample.oldest_message_age_s = max(0.0, now - first_ts)
        return sample
    if consumer is None:
        sample.exists = False
        sample.missing = f"stream {address.name!r} exists but has no consumer {address.group!r}"
        return sample
    config = consumer.get("config") or {}
    delivered = consumer.get("delivered") or {}
    ack_floor = consumer.get("ack_floor") or {}
    sample.backlog = _int_or_none(consumer.get("num_pending"))
    sample.in_flight = _int_or_none(consumer.get("num_ack_pending"))
    sample.delivered = _int_or_none(delivered.get("stream_seq"))
    consumer_seq = _int_or_none(delivered.get("consumer_seq"))
    if (
        consumer_seq is not None
        and sample.delivered is not None
        and config.get("deliver_policy", "all") == "all"
        and not config.get("filter_subject")
        and not config.get("filter_subjects")
        and consumer_seq >= sample.delivered
    ):
        sample.redelivered = consumer_seq - sample.delivered
    if config.get("deliver_subject"):
        # Push consumer: push_bound says whether anyone subscribes to its deliver subject.
        sample.consumers = 1 if consumer.get("push_bound") else 0
    else:
        # A waiting pull request, or a delivery or an ack lately, proves a live client.
        active = [_parse_ts(delivered.get("last_active")), _parse_ts(ack_floor.get("last_active"))]
        recent = any(t is not None and now - t < active_idle_s for t in active)
        waiting_pulls = _int_or_none(consumer.get("num_waiting")) or 0
        sample.consumers = 1 if waiting_pulls > 0 or recent else 0
    sample.active_consumers = sample.consumers
    first_seq = _int_or_none(state.get("first_seq"))
    unfiltered = not config.get("filter_subject") and not config.get("filter_subjects")
    if sample.backlog == 0:
        sample.oldest_message_age_s = 0.0
    elif (
        sample.backlog
        and unfiltered
        and first_ts is not None
        and first_seq is not None
        and sample.delivered is not None
        and sample.delivered < first_seq
    ):
        # The consumer is behind the stream's first retained message, which is therefore the
        # oldest undelivered one; anywhere else its age would need an extra read.
        sample.oldest_message_age_s = max(0.0, now - first_ts)
    return sample


_STREAM_RAW_KEYS = (
    "name",
    "subjects",
    "retention",
    "storage",
    "discard",
    "max_msgs",
    "max_bytes",
    "max_age",
    "max_msgs_per_subject",
    "max_msg_size",
    "num_replicas",
    "duplicate_window",
    "allow_direct",
)


def _topology(
    address: Address, stream: dict[str, Any] | None, consumer: dict[str, Any] | None
) -> Topology:
    if stream is None or (address.group and consumer is None):
        return Topology(address=address, exists=False, kind="jetstream")
    stream_config = stream.get("config") or {}
    raw: dict[str, Any] = {
        "stream": {k: stream_config[k] for k in _STREAM_RAW_KEYS if k in stream_config}
    }
    discard = stream_config.get("discard")
    topology = Topology(
        address=address,
        exists=True,
        kind="jetstream",
        dead_letter_target="",
        overflow={"old": "drop-head", "new": "reject-publish"}.get(discard or ""),
        raw=raw,
    )
    if consumer is not None:
        config = consumer.get("config") or {}
        raw["consumer"] = config
        topology.ack_policy = config.get("ack_policy")
        topology.delivery_limit = _int_or_none(config.get("max_deliver"))
        topology.max_ack_pending = _int_or_none(config.get("max_ack_pending"))
        ack_wait = _int_or_none(config.get("ack_wait"))  # nanoseconds
        topology.ack_timeout_s = ack_wait / 1e9 if ack_wait else None
    max_age = _int_or_none(stream_config.get("max_age"))  # nanoseconds; 0 = unlimited
    topology.retention_s = max_age / 1e9 if max_age else None
    max_msgs = _int_or_none(stream_config.get("max_msgs"))  # -1 = unlimited
    topology.retention_count = max_msgs if max_msgs and max_msgs > 0 else None
    return topology


# --- the adapter -----------------------------------------------------------------------------


class _Api:
    """JetStream API requests over one connection, counted, at most ``limit`` in flight."""

    def __init__(self, nc: NATS, timeout: float, limit: int) -> None:
        self.nc = nc
        self.timeout = timeout
        self.requests = 0
        self._slots = asyncio.Semaphore(limit)

    async def request(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One API request; the decoded response, which may carry an ``error`` object."""
        payload = json.dumps(body).encode() if body is not None else b""
        async with self._slots:
            self.requests += 1
            msg = await self.nc.request(f"{API}.{subject}", payload, timeout=self.timeout)
        try:
            response: dict[str, Any] = json.loads(msg.data)
        except ValueError as exc:
            raise BrokerError(f"nats {subject}: unparseable API response: {exc}") from None
        return response

    async def ok(self, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """Like ``request`` but raise ``APIError`` on an error response."""
        response = await self.request(subject, body)
        if "error" in response:
            raise nats.js.errors.APIError.from_error(response["error"])
        return response


@dataclasses.dataclass
class _JszView:
    """What /jsz listed: stream details by name (one per account holding the name)."""

    streams: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    complete: bool = False  # a name it does not list does not exist
    requests: int = 0


def _redacted(url: str) -> str:
    """The URL without user info (never echo credentials)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _jsz_endpoint(management_url: str) -> tuple[str, str]:
    """``http://host:8222[/jsz][?acc=A]`` → (the /jsz URL, the account or "")."""
    parts = urlsplit(management_url)
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise BrokerError(
            f"nats: bad port in monitoring URL {_redacted(management_url)!r}", permanent=True
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BrokerError(
            f"nats: the monitoring URL must be http(s)://host:port, not "
            f"{_redacted(management_url)!r}",
            permanent=True,
        )
    path = parts.path.rstrip("/")
    if not path.endswith("/jsz"):
        path += "/jsz"
    account = dict(parse_qsl(parts.query)).get("acc", "")
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")), account


def _jsz_get(client: httpx.Client, url: str, params: dict[str, str]) -> dict[str, Any]:
    """One /jsz page. Failures are classified (timeout, refused, HTTP status, not JSON, not
    /jsz) and never quote the answer: a monitoring URL pointed at another service must not
    show that service's reply to every viewer of the board."""
    shown = _redacted(url)
    try:
        response = client.get(url, params=params)
    except httpx.TimeoutException:
        raise BrokerError(f"nats GET {shown}: no answer in time (timeout)") from None
    except httpx.ConnectError:
        raise BrokerError(f"nats GET {shown}: connection refused or host unreachable") from None
    except httpx.HTTPError as exc:
        raise BrokerError(f"nats GET {shown}: request failed ({type(exc).__name__})") from None
    if response.status_code in (401, 403, 404):
        raise BrokerError(
            f"nats GET {shown}: HTTP {response.status_code} (not a NATS monitoring port?)",
            permanent=True,
        )
    if response.status_code == 400:  # NATS answers 400 to e.g. an unknown account
        raise BrokerError(
            f"nats GET {shown}: HTTP 400 (the monitoring port refused the request: an unknown "
            "?acc= account?)",
            permanent=True,
        )
    if response.status_code >= 300:
        raise BrokerError(f"nats GET {shown}: HTTP {response.status_code}")
    try:
        page = response.json()
    except ValueError:
        raise BrokerError(
            f"nats GET {shown}: the answer is not JSON (not a NATS monitoring port?)",
            permanent=True,
        ) from None
    if not isinstance(page, dict) or "server_id" not in page:
        raise BrokerError(f"nats GET {shown}: not a NATS /jsz answer", permanent=True)
    return page


def _not_found(response: dict[str, Any]) -> bool:
    return (response.get("error") or {}).get("code") == 404


class NatsJetStreamAdapter(BrokerAdapter):
    """NATS JetStream: consumer pending/ack-pending and advisory-based dead letters."""

    kind = "nats"
    max_in_flight = 64
    #: Bounds of the DLO_ADVISORIES stream (it captures advisories for the whole account).
    advisory_max_age_s = 14 * 24 * 3600
    advisory_max_msgs = 1_000_000
    #: How long an advisory fetched but not acknowledged stays invisible to a new session: the
    #: wait after an ingester crash (a batch is stored in well under a second).
    drain_ack_wait_s = 30.0
    #: Advisories outstanding (fetched, unacknowledged) at once per drain consumer. Far above one
    #: session's batches, so what a crashed ingester held never blocks the rest (the server's
    #: default of 1,000 did: nothing was delivered until the ack wait ended).
    drain_max_ack_pending = 20_000

    def _check_url(self) -> None:
        for server in self.url.split(","):
            parts = urlsplit(server.strip())
            if parts.scheme not in _VALID_SCHEMES or not parts.hostname:
                raise BrokerError(
                    "nats: bad URL (expected nats://host:port or tls://host:port)", permanent=True
                )
            try:
                parts.port  # noqa: B018 - raises ValueError on a malformed port
            except ValueError:
                raise BrokerError("nats: bad port in the URL", permanent=True) from None

    async def _connect(self) -> NATS:
        self._check_url()

        async def quiet(_exc: Exception) -> None:
            """Errors surface through the awaited calls; don't log them twice."""

        nc = NATS()
        try:
            await asyncio.wait_for(
                nc.connect(
                    servers=[s.strip() for s in self.url.split(",")],
                    connect_timeout=max(1, round(self.timeout)),
                    allow_reconnect=False,
                    # 0 would retry a refused server forever inside nats-py's initial connect;
                    # 1 with no wait means two immediate attempts, then NoServersError.
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0,
                    error_cb=quiet,
                    name="dead-letter-office",
                ),
                timeout=self.timeout,
            )
        except Exception as exc:
            await close_quietly(nc)
            raise _broker_error(exc, "connect") from None
        return nc

    async def _with_connection(self, work: Callable[[NATS], Awaitable[T]], what: str) -> T:
        nc = await self._connect()
        try:
            return await work(nc)
        except Exception as exc:
            raise _broker_error(exc, what) from None
        finally:
            await close_quietly(nc)

    def ping(self) -> None:
        async def work(nc: NATS) -> None:
            await _Api(nc, self.timeout, 1).ok("INFO")

        _run_once(self._with_connection(work, "ping"))

    # --- poll and inspect ----------------------------------------------------------------

    async def _collect(
        self, api: _Api, addresses: Sequence[Address]
    ) -> tuple[dict[str, dict[str, Any] | None], dict[Address, dict[str, Any] | None]]:
        """Stream infos by name and consumer infos by address (``None`` = does not exist)."""
        wanted = {a.name for a in addresses}
        streams: dict[str, dict[str, Any] | None] = {}

        # 1. Stream infos: the first list page tells the total; fetch the rest concurrently.
        def keep_streams(page: dict[str, Any]) -> None:
            for info in page.get("streams") or []:
                name = (info.get("config") or {}).get("name")
                if name in wanted:
                    streams[name] = info

        first = await api.ok("STREAM.LIST", {"offset": 0})
        keep_streams(first)
        total = _int_or_none(first.get("total")) or 0
        limit = _int_or_none(first.get("limit")) or LIST_PAGE
        offsets = list(range(limit, total, limit))[: max(0, self.max_pages - 1)]
        for page in await asyncio.gather(*(api.ok("STREAM.LIST", {"offset": o}) for o in offsets)):
            keep_streams(page)
        # 2. Wanted but unseen (deleted, or the list was cut at max_pages or shifted while
        #    paging): ask for each one so that exists=False is a fact, not an artefact.
        #    A name JetStream cannot have (".", "*", ">", spaces: "orders.poison") does not
        #    exist either; asking would be a request nobody answers, a timeout for the poll.
        invalid = {n for n in wanted - streams.keys() if not _STREAM_NAME.fullmatch(n)}
        streams.update(dict.fromkeys(invalid))
        unseen = sorted(wanted - streams.keys())
        for name, response in zip(
            unseen,
            await asyncio.gather(*(api.request(f"STREAM.INFO.{n}") for n in unseen)),
            strict=True,
        ):
            if _not_found(response):
                streams[name] = None
            elif "error" in response:
                raise nats.js.errors.APIError.from_error(response["error"])
            else:
                streams[name] = response

        # 3. Consumers, per stream: list pages, or single infos when fewer are wanted.
        consumers: dict[Address, dict[str, Any] | None] = {}
        by_stream: dict[str, set[str]] = {}
        for address in addresses:
            if address.group:
                if streams.get(address.name) is None:
                    consumers[address] = None
                else:
                    by_stream.setdefault(address.name, set()).add(address.group)
        found: dict[tuple[str, str], dict[str, Any]] = {}

        async def list_consumers(stream: str, names: set[str]) -> None:
            state = (streams[stream] or {}).get("state") or {}
            count = _int_or_none(state.get("consumer_count")) or 0
            pages = min(self.max_pages, -(-count // LIST_PAGE))
            if len(names) <= pages or count == 0:
                return  # single infos below are cheaper (or there is nothing to list)
            results = await asyncio.gather(
                *(
                    api.ok(f"CONSUMER.LIST.{stream}", {"offset": i * LIST_PAGE})
                    for i in range(pages)
                )
            )
            for page in results:
                for info in page.get("consumers") or []:
                    if info.get("name") in names:
                        found[(stream, info["name"])] = info

        await asyncio.gather(*(list_consumers(s, n) for s, n in by_stream.items()))
        missing = sorted(
            (s, c) for s, names in by_stream.items() for c in names if (s, c) not in found
        )
        responses = await asyncio.gather(
            *(api.request(f"CONSUMER.INFO.{s}.{c}") for s, c in missing)
        )
        for key, response in zip(missing, responses, strict=True):
            if "error" in response and not _not_found(response):
                raise nats.js.errors.APIError.from_error(response["error"])
            if not _not_found(response):
                found[key] = response
        for address in addresses:
            if address.group and address not in consumers:
                consumers[address] = found.get((address.name, address.group))
        return streams, consumers

    # --- the monitoring endpoint (/jsz) ---------------------------------------------------

    def _read_jsz(self) -> _JszView:
        """Every stream (with its consumers and configs) /jsz reports, paged by account."""
        base, account = _jsz_endpoint(self.management_url or "")
        params = {"streams": "true", "consumers": "true", "config": "true"}
        params["limit"] = str(JSZ_PAGE)
        if account:
            params["acc"] = account
        view = _JszView()
        seen: set[str] = set()
        total: int | None = None
        clustered = False
        offset = 0
        with httpx.Client(timeout=self.timeout, trust_env=False) as client:
            while view.requests < max(1, self.max_pages):
                page = _jsz_get(client, base, {**params, "offset": str(offset)})
                view.requests += 1
                if page.get("disabled"):
                    raise BrokerError(f"nats {base}: JetStream is not enabled", permanent=True)
                clustered = clustered or "meta_cluster" in page
                total = _int_or_none(page.get("accounts"))
                details = page.get("account_details") or []
                for detail in details:
                    names = {detail.get("name"), detail.get("id")} - {None}
                    if account and account not in names:
                        continue  # an unknown acc makes the server list every account
                    key = str(detail.get("id") or detail.get("name"))
                    if key in seen:
                        continue
                    seen.add(key)
                    for stream in detail.get("stream_detail") or []:
                        name = stream.get("name") or (stream.get("config") or {}).get("name")
                        if isinstance(name, str):
                            view.streams.setdefault(name, []).append(stream)
                if account or not details or total is None or offset + len(details) >= total:
                    break
                offset += len(details)
        if account and not seen:
            raise BrokerError(
                f"nats {base}: account {account!r} has no JetStream on this server",
                permanent=True,
            )
        # Single server, every account read: what is not listed does not exist.
        view.complete = not clustered and (
            bool(account) or (total is not None and len(seen) >= total)
        )
        return view

    def _jsz_collect(
        self, addresses: Sequence[Address]
    ) -> tuple[dict[Address, tuple[dict[str, Any] | None, dict[str, Any] | None]], int]:
        """(stream, consumer) infos per address, and the requests made (HTTP + API)."""
        view = self._read_jsz()
        found: dict[Address, tuple[dict[str, Any] | None, dict[str, Any] | None]] = {}
        unresolved: list[Address] = []
        for address in addresses:
            candidates = view.streams.get(address.name, [])
            if len(candidates) > 1 or (not candidates and not view.complete):
                unresolved.append(address)  # ambiguous, or perhaps on another server
                continue
            stream = candidates[0] if candidates else None
            consumer = None
            if address.group and stream is not None:
                consumer = next(
                    (
                        c
                        for c in stream.get("consumer_detail") or []
                        if c.get("name") == address.group
                    ),
                    None,
                )
                if consumer is None and not view.complete:
                    unresolved.append(address)  # a clustered consumer may live elsewhere
                    continue
            found[address] = (stream, consumer)
        requests = view.requests
        if unresolved:

            async def work(nc: NATS) -> int:
                api = _Api(nc, self.timeout, self.max_in_flight)
                streams, consumers = await self._collect(api, unresolved)
                for address in unresolved:
                    found[address] = (streams.get(address.name), consumers.get(address))
                return api.requests

            requests += _run_once(self._with_connection(work, "poll (addresses /jsz omits)"))
        return found, requests

    def _poll_jsz(self, addresses: Sequence[Address], started: float) -> PollResult:
        found, requests = self._jsz_collect(addresses)
        stats: dict[Address, ChannelStats] = {}
        for address in addresses:
            stream, consumer = found[address]
            if stream is None:
                stats[address] = ChannelStats(address=address, exists=False)
            else:
                stats[address] = _stats(address, stream, consumer, self.active_idle_s)
        return PollResult(
            stats=stats, round_trips=requests, duration_s=time.perf_counter() - started
        )

    def poll(self, addresses: Sequence[Address]) -> PollResult:
        """Through the monitoring port when one is declared; when it does not answer (port
        closed, server started without ``-m``), through the JetStream API, which tells the
        same per address at more requests, with the reason in ``errors``."""
        started = time.perf_counter()
        fallback: list[str] = []
        if self.management_url and addresses:
            try:
                return self._poll_jsz(addresses, started)
            except BrokerError as exc:
                if exc.permanent:
                    raise
                fallback.append(f"monitoring port: {exc}; polled through the JetStream API")

        async def work(nc: NATS) -> PollResult:
            api = _Api(nc, self.timeout, self.max_in_flight)
            if not addresses:
                return PollResult(stats={}, round_trips=0, duration_s=0.0)
            streams, consumers = await self._collect(api, addresses)
            stats: dict[Address, ChannelStats] = {}
            for address in addresses:
                stream = streams.get(address.name)
                if stream is None:
                    stats[address] = ChannelStats(address=address, exists=False)
                else:
                    stats[address] = _stats(
                        address, stream, consumers.get(address), self.active_idle_s
                    )
            return PollResult(
                stats=stats,
                round_trips=api.requests,
                duration_s=time.perf_counter() - started,
                errors=fallback,
            )

        return _run_once(self._with_connection(work, "poll"))

    def inspect(self, addresses: Sequence[Address]) -> dict[Address, Topology]:
        if self.management_url and addresses:
            try:
                found, _requests = self._jsz_collect(addresses)
                return {a: _topology(a, *found[a]) for a in addresses}
            except BrokerError as exc:
                if exc.permanent:
                    raise  # else: the JetStream API below tells the same

        async def work(nc: NATS) -> dict[Address, Topology]:
            if not addresses:
                return {}
            streams, consumers = await self._collect(
                _Api(nc, self.timeout, self.max_in_flight), addresses
            )
            return {a: _topology(a, streams.get(a.name), consumers.get(a)) for a in addresses}

        return _run_once(self._with_connection(work, "inspect"))

    # --- dead letters and replay ---------------------------------------------------------

    async def _ensure_advisory_stream(self, api: _Api) -> None:
        response = await api.request(f"STREAM.INFO.{ADVISORY_STREAM}")
        if not _not_found(response):
            if "error" in response:
                raise nats.js.errors.APIError.from_error(response["error"])
            return
        config = {
            "name": ADVISORY_STREAM,
            "subjects": ADVISORY_SUBJECTS,
            "retention": "limits",
            "storage": "file",
            "discard": "old",
            "max_age": int(self.advisory_max_age_s * 1_000_000_000),
            "max_msgs": self.advisory_max_msgs,
            "max_bytes": -1,
            "max_msg_size": -1,
            "max_consumers": -1,
            "num_replicas": 1,
        }
        created = await api.request(f"STREAM.CREATE.{ADVISORY_STREAM}", config)
        # A concurrent creator may have won the race: that is success too.
        if "error" in created and created["error"].get("err_code") != 10058:
            raise nats.js.errors.APIError.from_error(created["error"])

    def prepare_drain(self, address: Address) -> None:
        if address.group.startswith(COPY_GROUP):
            return  # the application's stream; the drain consumer is created on open

        async def work(nc: NATS) -> None:
            await self._ensure_advisory_stream(_Api(nc, self.timeout, 1))

        _run_once(self._with_connection(work, f"prepare_drain {address}"))

    def retries(self, address: Address, retry_address: str = "", limit: int = 50) -> RetryView:
        """What the durable's info tells (one CONSUMER.INFO): how many are delivered and not
        acknowledged, how many were redelivered. JetStream lists neither the messages nak'ed
        with a delay nor their redelivery times without consuming them."""
        if not address.group or not _STREAM_NAME.fullmatch(address.name):
            return RetryView(notes=["No durable consumer is declared: nothing is pending."])

        async def work(nc: NATS) -> dict[str, Any]:
            return await _Api(nc, self.timeout, 1).request(
                f"CONSUMER.INFO.{address.name}.{address.group}"
            )

        info = _run_once(self._with_connection(work, f"retries {address}"))
        if _not_found(info):
            return RetryView(notes=[f"Stream {address.name!r} has no consumer {address.group!r}."])
        if "error" in info:
            raise BrokerError(f"nats retries {address}: {info['error'].get('description')}")
        return RetryView(
            at_most=_int_or_none(info.get("num_ack_pending")),
            redelivered=_int_or_none(info.get("num_redelivered")),
            listable=False,
            notes=[
                "At most the consumer's ack-pending messages wait for a retry: JetStream counts "
                "a message being processed and one nak'ed with a delay alike.",
                "JetStream cannot list pending messages or their redelivery times without "
                "consuming them: the list and the next attempt times are unknown.",
            ],
        )

    def open_drain(self, address: Address) -> DrainSession:
        if address.group.startswith(COPY_GROUP):
            return NatsCopyDrainSession(self, address)
        return NatsDrainSession(self, address)

    def open_publisher(self, target: Address) -> Publisher:
        return NatsPublisher(self, target)


async def close_quietly(nc: NATS) -> None:
    """Close ``nc``, bounded; whatever happens, its socket is closed when this returns.

    ``nc.close()`` flushes what is pending first, which can block on a server that is not
    reading; when the bound cuts it short, nats-py leaves the socket open (a ResourceWarning
    later, and a file descriptor held until the garbage collector runs). Abort the socket
    then: nothing more will be written on it, and an abort does not wait for a buffer to
    drain (a no-op on a socket already closed). The loop's last turn (``close_loop``)
    closes the file descriptor."""
    try:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), timeout=CLOSE_TIMEOUT_S)
    finally:
        # nats-py's own attributes: None before connecting, or on a transport without streams.
        writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.transport.abort()


class _LoopSession:
    """A connection with its own event loop, for the life of a session."""

    def __init__(self, adapter: NatsJetStreamAdapter) -> None:
        self.adapter = adapter
        self.timeout = adapter.timeout
        self._loop = asyncio.new_event_loop()
        self._closed = False
        try:
            self.nc: NATS = self._call(adapter._connect())
        except BaseException:
            close_loop(self._loop)
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return _run_on(self._loop, coro)

    def _close_session(self, before: Callable[[], Awaitable[None]] | None = None) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            if before is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(before(), timeout=self.timeout)
            await close_quietly(self.nc)

        try:
            self._call(shutdown())
        finally:
            close_loop(self._loop)


class NatsDrainSession(_LoopSession, DrainSession):
    """Durable pull consumers on DLO_ADVISORIES filtered to one stream (and consumer).

    One consumer per advisory kind: servers before 2.10 accept only one filter subject, and
    it must be a subset of one of the stream's subjects."""

    fetch_ahead = True  # max_ack_pending is drain_max_ack_pending

    def __init__(self, adapter: NatsJetStreamAdapter, address: Address) -> None:
        self.address = address
        durable = drain_consumer_name(address, adapter.installation_id)
        legacy = drain_consumer_name(address) if adapter.installation_id else ""
        target = f"{address.name}.{address.group or '*'}"
        md, term = DRAIN_SUFFIXES
        # (durable, filter subject, the pre-installation-id durable it takes over from)
        self.consumers = [
            (durable + md, f"{MAX_DELIVERIES_PREFIX}.{target}", legacy and legacy + md),
            (durable + term, f"{TERMINATED_PREFIX}.{target}", legacy and legacy + term),
        ]
        self._outstanding: dict[int, Msg] = {}
        self._buffer: list[Msg] = []  # delivered to us, not yet handed out by fetch
        self._pulls: dict[int, asyncio.Task[list[Msg]]] = {}
        super().__init__(adapter)
        try:
            self.subs = self._call(self._bind())
        except BaseException as exc:
            self._close_session()
            raise _broker_error(exc, f"open_drain {address}") from None

    def _config(self, durable: str, subject: str, start_seq: int | None) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=durable,
            deliver_policy=DeliverPolicy.ALL
            if start_seq is None
            else DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.adapter.drain_ack_wait_s,
            max_ack_pending=self.adapter.drain_max_ack_pending,
            max_deliver=-1,  # never let our own consumer emit MAX_DELIVERIES
            filter_subject=subject,
            description=f"Dead Letter Office ingest of {self.address}",
        )

    async def _bind(self) -> list[Any]:
        """1. Ensure DLO_ADVISORIES. 2. Per advisory kind, create our durable if missing: from
        the legacy durable's ack floor when one exists (no advisory ingested twice on upgrade),
        else from the start. 3. An existing durable with other bounds is updated in place."""
        js = self.nc.jetstream(timeout=self.timeout)
        api = _Api(self.nc, self.timeout, 1)
        await self.adapter._ensure_advisory_stream(api)
        subs = []
        for durable, subject, legacy in self.consumers:
            info = await api.request(f"CONSUMER.INFO.{ADVISORY_STREAM}.{durable}")
            if _not_found(info):
                start = await self._legacy_floor(api, legacy) if legacy else None
                await js.add_consumer(ADVISORY_STREAM, self._config(durable, subject, start))
            elif "error" in info:
                raise nats.js.errors.APIError.from_error(info["error"])
            else:
                config = info.get("config") or {}
                ack_wait_ns = int(self.adapter.drain_ack_wait_s * 1_000_000_000)
                if (
                    config.get("ack_wait") != ack_wait_ns
                    or config.get("max_ack_pending") != self.adapter.drain_max_ack_pending
                ):
                    await self._update_bounds(api, durable, config)
            subs.append(await js.pull_subscribe_bind(durable, ADVISORY_STREAM))
        return subs

    async def _legacy_floor(self, api: _Api, legacy: str) -> int | None:
        info = await api.request(f"CONSUMER.INFO.{ADVISORY_STREAM}.{legacy}")
        if "error" in info:
            return None
        floor = ((info.get("ack_floor") or {}).get("stream_seq")) or 0
        return int(floor) + 1

    async def _update_bounds(self, api: _Api, durable: str, config: dict[str, Any]) -> None:
        """Bring an existing drain consumer to today's ack wait and max_ack_pending (both
        editable on a live consumer)."""
        config = {
            **config,
            "ack_wait": int(self.adapter.drain_ack_wait_s * 1_000_000_000),
            "max_ack_pending": self.adapter.drain_max_ack_pending,
        }
        await api.ok(
            f"CONSUMER.DURABLE.CREATE.{ADVISORY_STREAM}.{durable}",
            {"stream_name": ADVISORY_STREAM, "config": config},
        )

    def waiting(self) -> int | None:
        """Advisories not yet delivered plus delivered and unacknowledged, over both drain
        consumers (one CONSUMER.INFO each)."""

        async def count() -> int | None:
            api = _Api(self.nc, self.timeout, 2)
            total = 0
            for durable, _subject, _legacy in self.consumers:
                info = await api.request(f"CONSUMER.INFO.{ADVISORY_STREAM}.{durable}")
                if "error" in info:
                    return None
                total += int(info.get("num_pending") or 0) + int(info.get("num_ack_pending") or 0)
            return total

        try:
            return self._call(count())
        except Exception as exc:
            raise _broker_error(exc, f"waiting {self.address}") from None

    def fetch(self, max_batch: int, wait_s: float) -> list[DeadLetter]:
        try:
            return self._call(self._fetch(max(1, max_batch), max(wait_s, 0.2)))
        except Exception as exc:
            raise _broker_error(exc, f"fetch {self.address}") from None

    async def _pull(self, index: int, batch: int, wait_s: float) -> list[Msg]:
        try:
            msgs: list[Msg] = await self.subs[index].fetch(batch, timeout=wait_s)
        except TimeoutError:
            return []
        return msgs

    async def _fetch(self, batch: int, wait_s: float) -> list[DeadLetter]:
        if not self._buffer:
            await self._pull_some(batch, wait_s)
        msgs, self._buffer = self._buffer[:batch], self._buffer[batch:]
        api = _Api(self.nc, self.timeout, self.adapter.max_in_flight)
        letters = await asyncio.gather(*(self._letter(api, msg) for msg in msgs))
        for msg in msgs:
            self._outstanding[id(msg)] = msg
        return list(letters)

    async def _pull_some(self, batch: int, wait_s: float) -> None:
        """1. Start a pull on every consumer that has none running. 2. Wait until one returns
        messages (or all come back empty). A pull still running is not cancelled (it may hold
        messages already): the next fetch resumes it. Results wait in ``_buffer``."""
        for index in range(len(self.subs)):
            if index not in self._pulls:
                self._pulls[index] = asyncio.ensure_future(self._pull(index, batch, wait_s))
        deadline = time.monotonic() + wait_s + self.timeout
        while self._pulls and not self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.wait(
                self._pulls.values(), timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            for index, task in list(self._pulls.items()):
                if task.done():
                    del self._pulls[index]
                    self._buffer.extend(task.result())

    async def _letter(self, api: _Api, msg: Msg) -> DeadLetter:
        advisory_seq = msg.metadata.sequence.stream
        try:
            advisory = json.loads(msg.data)
            stream = str(advisory["stream"])
            stream_seq = int(advisory["stream_seq"])
        except (ValueError, KeyError, TypeError):
            return DeadLetter(
                dedupe_key=f"nats:{ADVISORY_STREAM}:{advisory_seq}",
                body=bytes(msg.data),
                headers={},
                properties={"advisory_subject": msg.subject},
                token=msg,
                broker_id=f"{ADVISORY_STREAM}:{advisory_seq}",
                reason="unparseable advisory (body is the advisory itself)",
            )
        error_class = error_message = None
        if msg.subject.startswith(MAX_DELIVERIES_PREFIX):
            reason = "max_deliveries"
        else:
            # NATS 2.10+ carries the consumer's ``term`` reason: the application's error.
            reason = "terminated"
            error_class, error_message = split_term_reason(advisory.get("reason"))
        body, headers, original_subject = b"", {}, None
        response = await api.request(f"STREAM.MSG.GET.{stream}", {"seq": stream_seq})
        if "error" in response:
            error = response["error"]
            if error.get("code") != 404:
                raise nats.js.errors.APIError.from_error(error)
            reason += "; the original message was no longer retained"
        else:
            message = response.get("message") or {}
            original_subject = message.get("subject")
            try:
                body = base64.b64decode(message.get("data") or "")
                raw_headers = base64.b64decode(message.get("hdrs") or "")
            except (binascii.Error, ValueError) as exc:
                raise BrokerError(
                    f"nats: undecodable stored message {stream}#{stream_seq}: {exc}"
                ) from None
            headers = _parse_headers(raw_headers) if raw_headers else {}
        return DeadLetter(
            dedupe_key=_death_key(stream, stream_seq, advisory, advisory_seq),
            body=body,
            headers=json_safe_headers(headers),
            properties={
                "stream": stream,
                "stream_seq": stream_seq,
                "consumer": advisory.get("consumer"),
                "subject": original_subject,
                "advisory_type": advisory.get("type"),
                "advisory_id": advisory.get("id"),
                "advisory_seq": advisory_seq,
            },
            token=msg,
            broker_id=f"{stream}:{stream_seq}",
            redelivery_count=_int_or_none(advisory.get("deliveries")),
            reason=reason,
            error_class=error_class,
            error_message=error_message,
            first_death_queue=advisory.get("consumer"),
            dead_lettered_at=_parse_ts(advisory.get("timestamp")),
        )

    def ack(self, letters: Sequence[DeadLetter]) -> None:
        _ack_confirmed(self, letters, str(self.address))

    def close(self) -> None:
        pending = [*self._outstanding.values(), *self._buffer]
        self._outstanding.clear()
        self._buffer.clear()
        pulls = list(self._pulls.values())
        self._pulls.clear()

        async def hand_back() -> None:
            # A pull cut short may lose what it held until ack_wait; nak the rest right now.
            for task in pulls:
                task.cancel()
            await asyncio.gather(*pulls, return_exceptions=True)
            # Drop our inboxes' interest first, so a pull request still open on the server
            # cannot take the redelivery of what we nak next.
            await asyncio.gather(*(sub.unsubscribe() for sub in self.subs), return_exceptions=True)
            await self.nc.flush(timeout=max(1, round(self.timeout)))
            await asyncio.gather(*(m.nak() for m in pending), return_exceptions=True)
            await self.nc.flush(timeout=max(1, round(self.timeout)))

        self._close_session(hand_back)


def split_term_reason(reason: Any) -> tuple[str | None, str | None]:
    """A ``term`` reason as (error class, error message): ``"CustomerNotFound: customer c-7
    does not exist"`` names its class; any other text is the message alone."""
    if not isinstance(reason, str) or not reason.strip():
        return None, None
    text = reason.strip()
    match = _CLASS_PREFIX.match(text)
    if match and not match.group(1).endswith(":"):
        return match.group(1), match.group(2).strip()
    return None, text


def copy_key(stream: str, stream_seq: int) -> str:
    """The identity of a copy that names its original (``Nats-Stream`` + ``Nats-Sequence``):
    one copy per stored message. Ingest looks it up to skip that message's advisory."""
    key = f"nats:{stream}:{stream_seq}:copy"
    return key if len(key) <= 200 else "nats:" + hashlib.sha256(key.encode()).hexdigest()


def copy_address(copy_stream: str, owner: Address) -> Address:
    """The drain address of ``copy_stream`` for the channel at ``owner`` (stream/consumer)."""
    return Address(copy_stream, f"{COPY_GROUP}{owner.name}/{owner.group}")


def copy_consumer_name(copy_stream: str, owner: Address, installation: str = "") -> str:
    """The durable that drains a copy stream for one channel of this installation: several
    channels may share one DLQ stream, and each must see every copy (it keeps its own)."""
    prefix = f"dlo_{installation}_copies" if installation else "dlo_copies"
    name = f"{prefix}_{owner.name}_{owner.group or 'all'}"
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name) or len(name) > 120:
        digest = hashlib.sha256(f"{installation}:{copy_stream}:{owner}".encode()).hexdigest()
        name = f"{prefix}_{digest[:32]}" if len(prefix) < 80 else "dlo_" + digest[:32]
    return name


class NatsCopyDrainSession(_LoopSession, DrainSession):
    """A stream of copies the application's consumer republished when it gave a message up
    (the channel's DLQ or poison stream): each message is one dead letter, and its headers
    carry the cause (``x-error-class``, ``reason`` …), as on RabbitMQ and Redis.

    Read through this installation's durable pull consumer on that stream, acknowledged only
    after the store committed. Never destructive: on a limits stream an ack removes nothing
    (the stream's own limits bound it). A stream that does not exist yet is an empty drain
    (the poll reports the missing address). Identity: a copy naming its original is
    ``copy_key(stream, seq)``; any other copy is ``nats:<copy stream>:<seq>:copy``."""

    fetch_ahead = True  # max_ack_pending is drain_max_ack_pending

    def __init__(self, adapter: NatsJetStreamAdapter, address: Address) -> None:
        self.stream = address.name
        owner_stream, _, owner_consumer = address.group.removeprefix(COPY_GROUP).partition("/")
        self.owner = Address(owner_stream, owner_consumer)
        self.durable = copy_consumer_name(self.stream, self.owner, adapter.installation_id)
        self._outstanding: dict[int, Msg] = {}
        super().__init__(adapter)
        try:
            self.sub = self._call(self._bind())
        except BaseException as exc:
            self._close_session()
            raise _broker_error(exc, f"open_drain {self.stream} (copies)") from None
        #: Whether the copy stream exists (else this drain is empty).
        self.available = self.sub is not None

    async def _bind(self) -> Any:
        if not _STREAM_NAME.fullmatch(self.stream):
            return None  # no stream can have this name ("orders.dlq"): nothing to drain
        api = _Api(self.nc, self.timeout, 1)
        info = await api.request(f"CONSUMER.INFO.{self.stream}.{self.durable}")
        if _not_found(info):
            stream = await api.request(f"STREAM.INFO.{self.stream}")
            if _not_found(stream):
                return None
            config = ConsumerConfig(
                durable_name=self.durable,
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=self.adapter.drain_ack_wait_s,
                max_ack_pending=self.adapter.drain_max_ack_pending,
                max_deliver=-1,
                description=f"Dead Letter Office ingest of the copies in {self.stream}",
            )
            await self.nc.jetstream(timeout=self.timeout).add_consumer(self.stream, config)
        elif "error" in info:
            raise nats.js.errors.APIError.from_error(info["error"])
        js = self.nc.jetstream(timeout=self.timeout)
        return await js.pull_subscribe_bind(self.durable, self.stream)

    def waiting(self) -> int | None:
        if self.sub is None:
            return 0

        async def count() -> int | None:
            info = await _Api(self.nc, self.timeout, 1).request(
                f"CONSUMER.INFO.{self.stream}.{self.durable}"
            )
            if "error" in info:
                return None
            return int(info.get("num_pending") or 0) + int(info.get("num_ack_pending") or 0)

        try:
            return self._call(count())
        except Exception as exc:
            raise _broker_error(exc, f"waiting {self.stream}") from None

    def fetch(self, max_batch: int, wait_s: float) -> list[DeadLetter]:
        if self.sub is None:
            return []

        async def pull() -> list[Msg]:
            try:
                msgs: list[Msg] = await self.sub.fetch(max(1, max_batch), timeout=max(wait_s, 0.2))
            except TimeoutError:
                return []
            return msgs

        try:
            msgs = self._call(pull())
        except Exception as exc:
            raise _broker_error(exc, f"fetch {self.stream} (copies)") from None
        letters = [self._letter(msg) for msg in msgs]
        # A copy naming another stream (or consumer) belongs to another channel sharing this
        # DLQ stream, which has its own durable: acknowledged on ours and passed over.
        foreign = [t for t in letters if not self._ours(t)]
        if foreign:
            self.ack(foreign)
        skipped = {id(t) for t in foreign}
        mine = [t for t in letters if id(t) not in skipped]
        for letter in mine:
            self._outstanding[id(letter.token)] = letter.token
        return mine

    def _ours(self, letter: DeadLetter) -> bool:
        stream = letter.properties.get("stream")
        consumer = letter.properties.get("consumer")
        if stream is not None and stream != self.owner.name:
            return False
        return consumer is None or not self.owner.group or consumer == self.owner.group

    def _letter(self, msg: Msg) -> DeadLetter:
        seq = msg.metadata.sequence.stream
        raw = dict(msg.headers or {})
        headers = json_safe_headers(raw)
        lowered = {str(k).lower(): v for k, v in raw.items()}
        original = lowered.get(COPY_STREAM_HEADER.lower())
        original_seq = _int_or_none(_maybe_int(lowered.get(COPY_SEQUENCE_HEADER.lower())))
        properties: dict[str, Any] = {"copy_stream": self.stream, "copy_seq": seq}
        consumer = lowered.get(COPY_CONSUMER_HEADER.lower())
        if isinstance(consumer, str) and consumer:
            properties["consumer"] = consumer
        if isinstance(original, str) and original and original_seq is not None:
            key = copy_key(original, original_seq)
            properties.update(stream=original, stream_seq=original_seq)
            subject = lowered.get(COPY_SUBJECT_HEADER.lower())
            if isinstance(subject, str) and subject:
                properties["subject"] = subject  # where a replay goes (see dlq.relay_publish)
        else:
            key = f"nats:{self.stream}:{seq}:copy"
            if len(key) > 200:
                key = "nats:" + hashlib.sha256(key.encode()).hexdigest()
        reason = lowered.get("reason") or lowered.get("x-first-death-reason")
        stamp = msg.metadata.timestamp
        return DeadLetter(
            dedupe_key=key
            if len(key) <= 200
            else "nats:" + hashlib.sha256(key.encode()).hexdigest(),
            body=bytes(msg.data),
            headers=headers,
            properties=properties,
            token=msg,
            broker_id=f"{self.stream}:{seq}",
            reason=reason if isinstance(reason, str) else None,
            first_death_queue=original if isinstance(original, str) else None,
            dead_lettered_at=stamp.timestamp() if stamp is not None else None,
        )

    def ack(self, letters: Sequence[DeadLetter]) -> None:
        _ack_confirmed(self, letters, f"{self.stream} (copies)")

    def close(self) -> None:
        pending = list(self._outstanding.values())
        self._outstanding.clear()

        async def hand_back() -> None:
            await asyncio.gather(*(m.nak() for m in pending), return_exceptions=True)
            await self.nc.flush(timeout=max(1, round(self.timeout)))

        self._close_session(hand_back)


def _maybe_int(value: Any) -> Any:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def _jetstream_down(exc: BaseException, what: str) -> BrokerError:
    """JetStream not answering on a live connection (no responders, timeout): an outage."""
    if isinstance(exc, nats.errors.NoRespondersError | nats.errors.TimeoutError | TimeoutError):
        return BrokerError(
            f"nats {what}: JetStream does not answer (not ready, or not enabled)",
            connection_lost=True,
        )
    return _broker_error(exc, what)


def _header_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=repr)


class NatsPublisher(_LoopSession, Publisher):
    """JetStream publish to ``target.name`` as the subject, waiting for each PubAck."""

    def __init__(self, adapter: NatsJetStreamAdapter, target: Address) -> None:
        self.subject = target.name
        super().__init__(adapter)
        self.js = self.nc.jetstream(timeout=self.timeout)
        # A server accepts connections before JetStream is ready (or without it): that is an
        # outage of the target, not something the messages did. Ask JetStream once, so that
        # opening (and the relay's probe, which opens) fails until it answers.
        try:
            self._call(self._jetstream_answers())
        except BaseException:
            self._close_session()
            raise

    async def _jetstream_answers(self) -> None:
        try:
            await _Api(self.nc, self.timeout, 1).request("INFO")
        except Exception as exc:
            raise _jetstream_down(exc, f"publish {self.subject}") from None

    async def _refusal_or_outage(self) -> str | None:
        """After "no responders" on a publish: the reason to refuse the message when JetStream
        answers and no stream captures the subject, else None (JetStream is not ready, or the
        capturing stream did not answer: an outage)."""
        try:
            names = await _Api(self.nc, self.timeout, 1).request(
                "STREAM.NAMES", {"subject": self.subject}
            )
        except Exception:
            return None
        if "error" in names or (_int_or_none(names.get("total")) or 0) > 0:
            return None
        return f"no responders: no stream captures subject {self.subject!r}"

    def publish(self, messages: Sequence[OutgoingMessage]) -> list[PublishOutcome]:
        async def publish_all() -> list[PublishOutcome]:
            outcomes: list[PublishOutcome] = []
            for start in range(0, len(messages), PUBLISH_WINDOW):
                window = messages[start : start + PUBLISH_WINDOW]
                outcomes.extend(await asyncio.gather(*(self._one(m) for m in window)))
            return outcomes

        return self._call(publish_all())

    def _headers(self, message: OutgoingMessage) -> dict[str, str] | str:
        """NATS headers, or the reason they cannot be sent (CR/LF would break the framing)."""
        headers = {str(k): _header_text(v) for k, v in message.headers.items()}
        for key, value in headers.items():
            if not _HEADER_NAME.match(key) or "\r" in value or "\n" in value:
                return f"header {key!r} cannot be carried by NATS (name or CR/LF in value)"
        replay_id = headers.get("x-dlq-replay-id")
        own_id = any(k.lower() == "nats-msg-id" for k in headers)
        if replay_id and not own_id:
            headers["Nats-Msg-Id"] = replay_id  # server-side dedup within duplicate_window
        # A client's own Nats-Msg-Id is kept (docs/identity.md): a consumer deduplicating on it
        # sees the message it knows; the server then drops a replay landing within the
        # stream's duplicate_window of the original publish as a duplicate (reported).
        return headers

    async def _one(self, message: OutgoingMessage) -> PublishOutcome:
        headers = self._headers(message)
        if isinstance(headers, str):
            return PublishOutcome(
                key=message.key, confirmed=False, reason=headers, permanent=True, refused=True
            )
        try:
            ack = await self.js.publish(
                self.subject, message.body, timeout=self.timeout, headers=headers or None
            )
        except nats.js.errors.NoStreamResponseError:
            refusal = await self._refusal_or_outage()
            if refusal is None:
                return PublishOutcome.lost(
                    message.key,
                    f"nats publish {self.subject}: no responders and JetStream does not "
                    "answer for the subject (not ready, or its stream is unavailable)",
                )
            return PublishOutcome(
                key=message.key, confirmed=False, reason=refusal, permanent=True, refused=True
            )
        except Exception as exc:
            error = _broker_error(exc, f"publish {self.subject}")
            return PublishOutcome(
                key=message.key,
                confirmed=False,
                reason=str(error),
                permanent=error.permanent,
                # An API error is the server's answer (e.g. a stream limit); the rest is doubt.
                refused=isinstance(exc, nats.js.errors.APIError),
                connection_lost=error.connection_lost,
            )
        if ack.duplicate and headers.get("Nats-Msg-Id") != headers.get("x-dlq-replay-id"):
            # The client's own id is still within the stream's duplicate_window (the original
            # publish, or a copy of this replay): the server dropped it. Not delivered: retry
            # after the window rather than call a dropped message replayed.
            return PublishOutcome(
                key=message.key,
                confirmed=False,
                reason="dropped as a duplicate: the stream's duplicate_window still holds "
                "this Nats-Msg-Id",
                refused=True,
            )
        return PublishOutcome(
            key=message.key,
            confirmed=True,
            reason="duplicate (already stored within the dedup window)" if ack.duplicate else "",
        )

    def close(self) -> None:
        self._close_session()


def _ack_confirmed(drain: Any, letters: Sequence[DeadLetter], what: str) -> None:
    """Ack a drain's letters with ``ack_sync`` (the server confirms, so a reopened session
    will not see them again), then forget them; a failure is one ``BrokerError``."""
    msgs = [letter.token for letter in letters]

    async def ack_all() -> None:
        await asyncio.gather(*(m.ack_sync(timeout=drain.timeout) for m in msgs))

    try:
        drain._call(ack_all())
    except Exception as exc:
        raise _broker_error(exc, f"ack {what}") from None
    for msg in msgs:
        drain._outstanding.pop(id(msg), None)
