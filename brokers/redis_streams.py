"""Redis Streams adapter (kind ``"redis"``).

``Address.name`` is the stream key and ``Address.group`` the consumer group (``""`` samples the
stream alone). Every call opens one short-lived client with ``socket_timeout`` and
``socket_connect_timeout`` set to ``self.timeout`` and no client-side retries, so each network
call is bounded and a refused connection fails at once.

Polling is one pipeline (one round trip) of ``TIME`` + ``XINFO STREAM`` + ``XINFO GROUPS`` +
``XINFO CONSUMERS`` for every address, plus at most one targeted pipeline (``XPENDING … - +
100`` for groups with pending entries: their idle times and delivery counts; ``XRANGE
(last-delivered-id + COUNT 1`` where the oldest undelivered entry is not the stream's first).
Ages use the server clock (``TIME``), so a skewed dashboard host does not distort them. Note
that ``XINFO STREAM`` returns the first and last entries in full; very large entries make the
poll reply larger, not longer in round trips.

Dead-letter convention (what ``open_drain``/``open_publisher`` read and write). A dead-letter
queue is itself a stream with one entry per dead letter:

- field ``body``: the original message bytes, untouched;
- every other field is a header, by convention ``error``, ``error_class``, ``reason``,
  ``delivery_count``, ``source_stream``, ``source_id`` and ``dead_lettered_at``.

The dashboard drains a DLQ stream through its own consumer group ``dlo-ingest`` (created by
``prepare_drain`` from id ``0`` with ``MKSTREAM``). Each ingest process is its own consumer in
that group (``dlo-<host>-<pid>``), so two workers on one channel split the entries between
them instead of both reading everything. A session reads, in this order: 1. its own pending
entries (read before, never acknowledged: a failed ack), 2. entries another consumer read and
left idle for ``drain_claim_idle_s`` (a worker that died), taken over with ``XAUTOCLAIM``,
3. new entries (``>``). Consumers of the group that hold nothing and have been idle for
``drain_forget_idle_s`` are deleted, so dead workers do not pile up. ``ack`` is ``XACK`` only:
the entry stays in the stream, whose own ``MAXLEN``/``MINID`` trimming bounds it (the
application owns that retention; the dashboard never deletes from a stream).

Identity (docs/identity.md): one death is one DLQ stream entry. Each dead-lettering is an
``XADD`` with a fresh id, so a replayed message that fails again is a new entry; a redelivery
from the dashboard's group re-reads the same id (``dedupe_key = "redis:<stream>:<group>:<id>"``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.exceptions as rexc
from redis.backoff import NoBackoff
from redis.retry import Retry

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
    RetryingMessage,
    RetryView,
    Topology,
    json_safe_headers,
)

DRAIN_GROUP = "dlo-ingest"
DRAIN_CONSUMER_PREFIX = "dlo-"
MAX_CLAIM_PAGES = 1000  # XAUTOCLAIM pages scanned per fetch (each bounded by the batch size)
BODY_FIELD = "body"
#: How many of a group's oldest pending entries one poll reads (idle time, delivery counts).
PENDING_SCAN = 100


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _id_tuple(entry_id: Any) -> tuple[int, int] | None:
    """``b"1700000000000-3"`` → ``(1700000000000, 3)``; ``None`` when not an entry id."""
    if entry_id is None:
        return None
    ms, _, seq = _text(entry_id).partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return None


def _id_ms(entry_id: Any) -> int | None:
    parsed = _id_tuple(entry_id)
    return parsed[0] if parsed else None


def _age_s(entry_id: Any, now_ms: int) -> float | None:
    ms = _id_ms(entry_id)
    return None if ms is None else max(0, now_ms - ms) / 1000.0


def _int_or_none(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(_text(value))
    except ValueError:
        return None


def _broker_error(exc: BaseException, what: str) -> BrokerError:
    """Map a redis-py (or URL) failure to ``BrokerError`` with the right ``permanent`` flag."""
    if isinstance(exc, BrokerError):
        return exc
    permanent_types = (
        ValueError,  # malformed URL
        rexc.AuthenticationError,
        rexc.AuthenticationWrongNumberOfArgsError,
        rexc.AuthorizationError,
        rexc.NoPermissionError,
        rexc.ResponseError,  # WRONGTYPE, NOGROUP, unknown command: the same call fails again
    )
    permanent = isinstance(exc, permanent_types) and not isinstance(exc, rexc.BusyLoadingError)
    # Unreachable, broken or still loading its data after a restart: reopen and try again.
    lost = isinstance(
        exc, rexc.ConnectionError | rexc.TimeoutError | rexc.BusyLoadingError | OSError
    )
    return BrokerError(
        f"redis {what}: {type(exc).__name__}: {exc}", permanent=permanent, connection_lost=lost
    )


def _stats_from_info(
    address: Address,
    stream: dict[str, Any],
    groups: Any,
    consumers: Any,
    now_ms: int,
    active_idle_ms: int,
) -> tuple[ChannelStats, bool]:
    """Build the sample from pipeline 1; also say whether the oldest-undelivered entry needs an
    ``XRANGE`` (it is not the stream's first entry and is not known to be absent)."""
    stats = ChannelStats(
        address=address,
        retained=_int_or_none(stream.get("length")),
        produced=_int_or_none(stream.get("entries-added")),
    )
    if not address.group:
        length = stats.retained
        first = stream.get("first-entry")
        if length == 0:
            stats.oldest_message_age_s = 0.0
        elif first:
            stats.oldest_message_age_s = _age_s(first[0], now_ms)
        return stats, False
    group = None
    if isinstance(groups, list):
        group = next((g for g in groups if _text(g.get("name")) == address.group), None)
    if group is None:
        stats.exists = False
        stats.missing = (
            f"stream {address.name!r} exists but has no consumer group {address.group!r}"
        )
        return stats, False
    lag = _int_or_none(group.get("lag"))  # nil after XDEL/XTRIM inside the group's range
    pending = _int_or_none(group.get("pending"))
    entries_read = _int_or_none(group.get("entries-read"))
    stats.backlog = lag
    stats.in_flight = pending
    stats.consumers = _int_or_none(group.get("consumers"))
    stats.delivered = entries_read
    if entries_read is not None and pending is not None:
        stats.acked = entries_read - pending
    if isinstance(consumers, list):
        stats.active_consumers = sum(
            1 for c in consumers if (_int_or_none(c.get("idle")) or 0) < active_idle_ms
        )
    last_delivered = _id_tuple(group.get("last-delivered-id"))
    first_entry = stream.get("first-entry")
    first_entry_id = first_entry[0] if first_entry else None
    first_id = _id_tuple(first_entry_id)
    last_generated = _id_tuple(stream.get("last-generated-id"))
    if lag == 0 or stats.retained == 0 or (last_delivered and last_delivered == last_generated):
        # Nothing is waiting: lag says so, the stream is empty, or nothing was added after
        # last-delivered-id (a nil lag is then a verified 0, not a guess).
        stats.oldest_message_age_s = 0.0
        stats.backlog = 0
        return stats, False
    if first_id is not None and last_delivered is not None and first_id > last_delivered:
        stats.oldest_message_age_s = _age_s(first_entry_id, now_ms)
        return stats, False
    return stats, last_delivered is not None


def _trimmed_horizon_s(summary: dict[str, Any], now_ms: int) -> float | None:
    """Redis keeps no MAXLEN policy, but trimming is visible: once entries were deleted
    (``max-deleted-entry-id`` past 0-0), the oldest entry left shows how far back the stream
    really reaches. None when nothing was ever trimmed (the retention is then unknown)."""
    deleted = _id_tuple(summary.get("max-deleted-entry-id"))
    first = summary.get("first-entry-id")
    if not deleted or deleted == (0, 0) or first is None:
        return None
    return _age_s(first, now_ms)


class RedisStreamsAdapter(BrokerAdapter):
    """Redis Streams: consumer-group lag, pending and DLQ streams (see the module docstring)."""

    kind = "redis"
    #: A consumer idle for less than this counts as active (XINFO CONSUMERS ``idle``).
    active_idle_s: float = 60.0
    #: An entry another drain consumer read and left unacknowledged this long is taken over
    #: (its worker died): the redelivery wait after a crash.
    drain_claim_idle_s: float = 60.0
    #: Drain consumers holding nothing and idle this long are deleted from the group.
    drain_forget_idle_s: float = 24 * 3600.0

    def _client(self, *, block_s: float = 0.0) -> redis.Redis:
        try:
            return redis.Redis.from_url(
                self.url,
                socket_timeout=self.timeout + block_s,
                socket_connect_timeout=self.timeout,
                decode_responses=False,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
            )
        except (ValueError, TypeError) as exc:
            # redis-py's messages may quote parts of the URL: name the problem's type only.
            raise BrokerError(
                f"redis: bad URL ({type(exc).__name__}; expected redis://[:password@]host:port/db)",
                permanent=True,
            ) from None

    def ping(self) -> None:
        client = self._client()
        try:
            client.ping()
        except (rexc.RedisError, OSError) as exc:
            raise _broker_error(exc, "ping") from None
        finally:
            client.close()

    def _read_info(
        self, client: redis.Redis, addresses: Sequence[Address]
    ) -> tuple[int, dict[str, Any], dict[str, Any], dict[Address, Any]]:
        """Pipeline 1: TIME + XINFO STREAM/GROUPS per stream + XINFO CONSUMERS per group."""
        streams = sorted({a.name for a in addresses})
        grouped = sorted({a.name for a in addresses if a.group})
        groups = sorted({a for a in addresses if a.group})
        pipe = client.pipeline(transaction=False)
        pipe.time()
        for name in streams:
            pipe.xinfo_stream(name)
        for name in grouped:
            pipe.xinfo_groups(name)
        for address in groups:
            pipe.xinfo_consumers(address.name, address.group)
        results = pipe.execute(raise_on_error=False)
        if isinstance(results[0], Exception):
            raise results[0]
        seconds, micros = results[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        offset = 1
        stream_info = dict(zip(streams, results[offset : offset + len(streams)], strict=True))
        offset += len(streams)
        group_info = dict(zip(grouped, results[offset : offset + len(grouped)], strict=True))
        offset += len(grouped)
        consumer_info = dict(zip(groups, results[offset:], strict=True))
        return now_ms, stream_info, group_info, consumer_info

    def poll(self, addresses: Sequence[Address]) -> PollResult:
        started = time.perf_counter()
        stats: dict[Address, ChannelStats] = {}
        errors: list[str] = []
        if not addresses:
            return PollResult(stats={}, round_trips=0, duration_s=0.0)
        client = self._client()
        round_trips = 0
        try:
            now_ms, stream_info, group_info, consumer_info = self._read_info(client, addresses)
            round_trips += 1
            need_range: list[Address] = []
            for address in dict.fromkeys(addresses):
                info = stream_info[address.name]
                if isinstance(info, rexc.ResponseError) and "no such key" in str(info).lower():
                    stats[address] = ChannelStats(address=address, exists=False)
                    continue
                if isinstance(info, Exception) or not isinstance(info, dict):
                    errors.append(f"{address}: XINFO STREAM: {info}")
                    stats[address] = ChannelStats(address=address)
                    continue
                groups = group_info.get(address.name)
                if isinstance(groups, Exception):
                    errors.append(f"{address}: XINFO GROUPS: {groups}")
                    stats[address] = ChannelStats(address=address)
                    continue
                consumers = consumer_info.get(address)
                sample, wants_range = _stats_from_info(
                    address,
                    info,
                    groups,
                    None if isinstance(consumers, Exception) else consumers,
                    now_ms,
                    int(self.active_idle_s * 1000),
                )
                stats[address] = sample
                if wants_range:
                    need_range.append(address)
            round_trips += self._poll_targeted(
                client, stream_info, group_info, stats, need_range, now_ms, errors
            )
        except (rexc.RedisError, OSError) as exc:
            raise _broker_error(exc, "poll") from None
        finally:
            client.close()
        return PollResult(
            stats=stats,
            round_trips=round_trips,
            duration_s=time.perf_counter() - started,
            errors=errors,
        )

    def _poll_targeted(
        self,
        client: redis.Redis,
        stream_info: dict[str, Any],
        group_info: dict[str, Any],
        stats: dict[Address, ChannelStats],
        need_range: list[Address],
        now_ms: int,
        errors: list[str],
    ) -> int:
        """Pipeline 2 (only if needed): idle time of the oldest pending entry per group with
        pending entries, and the id of the oldest undelivered entry where pipeline 1 could not
        tell it. Returns the round trips spent (0 or 1)."""
        pending = [a for a, s in stats.items() if a.group and s.exists and (s.in_flight or 0) > 0]
        if not pending and not need_range:
            return 0
        pipe = client.pipeline(transaction=False)
        for address in pending:
            pipe.xpending_range(address.name, address.group, min="-", max="+", count=PENDING_SCAN)
        last_delivered: dict[Address, str] = {}
        for address in need_range:
            group = next(
                g for g in group_info[address.name] if _text(g.get("name")) == address.group
            )
            last_delivered[address] = _text(group.get("last-delivered-id"))
            pipe.xrange(address.name, min="(" + last_delivered[address], max="+", count=1)
        results = pipe.execute(raise_on_error=False)
        for address, result in zip(pending, results[: len(pending)], strict=True):
            if isinstance(result, Exception):
                errors.append(f"{address}: XPENDING: {result}")
            elif result:
                # The oldest pending entries: their longest idle time, and the most deliveries
                # any of them has had (past the retry budget, nothing is claiming it away).
                stats[address].oldest_unacked_age_s = (
                    max(int(r["time_since_delivered"]) for r in result) / 1000.0
                )
                stats[address].max_deliveries = max(int(r["times_delivered"]) for r in result)
        for address, result in zip(need_range, results[len(pending) :], strict=True):
            if isinstance(result, Exception):
                errors.append(f"{address}: XRANGE: {result}")
            elif result:
                stats[address].oldest_message_age_s = _age_s(result[0][0], now_ms)
            else:
                # No entry after last-delivered-id: nothing is waiting (even if lag was nil).
                stats[address].oldest_message_age_s = 0.0
                stats[address].backlog = 0
        return 1

    def inspect(self, addresses: Sequence[Address]) -> dict[Address, Topology]:
        if not addresses:
            return {}
        client = self._client()
        try:
            now_ms, stream_info, group_info, _consumers = self._read_info(client, addresses)
        except (rexc.RedisError, OSError) as exc:
            raise _broker_error(exc, "inspect") from None
        finally:
            client.close()
        topologies: dict[Address, Topology] = {}
        for address in addresses:
            info = stream_info[address.name]
            if not isinstance(info, dict):
                if isinstance(info, rexc.ResponseError) and "no such key" in str(info).lower():
                    topologies[address] = Topology(
                        address=address, exists=False, kind="redis-stream"
                    )
                    continue
                raise _broker_error(info, f"inspect {address}")
            summary = {
                k: _text(v) if isinstance(v, bytes) else v
                for k, v in info.items()
                if k not in ("first-entry", "last-entry")
            }
            for key in ("first-entry", "last-entry"):
                if info.get(key):
                    summary[f"{key}-id"] = _text(info[key][0])
            groups = group_info.get(address.name)
            group_rows = [
                {k: _text(v) if isinstance(v, bytes) else v for k, v in g.items()}
                for g in (groups if isinstance(groups, list) else [])
            ]
            exists = not address.group or any(g["name"] == address.group for g in group_rows)
            topologies[address] = Topology(
                address=address,
                exists=exists,
                kind="redis-stream",
                retention_s=_trimmed_horizon_s(summary, now_ms),
                raw={"stream": summary, "groups": group_rows},
            )
        return topologies

    def retries(self, address: Address, retry_address: str = "", limit: int = 50) -> RetryView:
        """The group's pending entries (one pipeline: TIME, XINFO GROUPS, XPENDING of the
        oldest ``limit``): each waits until a consumer claims it again."""
        if not address.group:
            return RetryView(notes=["No consumer group is declared: nothing is pending."])
        client = self._client()
        try:
            pipe = client.pipeline(transaction=False)
            pipe.time()
            pipe.xinfo_groups(address.name)
            pipe.xpending_range(address.name, address.group, min="-", max="+", count=limit)
            clock, groups, pending = pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            raise _broker_error(exc, f"retries {address}") from None
        finally:
            client.close()
        for result in (clock, groups, pending):
            if isinstance(result, rexc.ResponseError) and (
                "no such key" in str(result).lower() or "NOGROUP" in str(result)
            ):
                return RetryView(
                    notes=[f"Stream {address.name!r} or its group {address.group!r} is missing."]
                )
            if isinstance(result, Exception):
                raise _broker_error(result, f"retries {address}")
        now_ms = int(clock[0]) * 1000 + int(clock[1]) // 1000
        group = next((g for g in groups if _text(g.get("name")) == address.group), None)
        count = _int_or_none(group.get("pending")) if group else None
        messages = [
            RetryingMessage(
                broker_id=_text(row["message_id"]),
                attempts=int(row["times_delivered"]),
                last_delivered_at=(now_ms - int(row["time_since_delivered"])) / 1000.0,
                holder=_text(row["consumer"]),
            )
            for row in pending[:limit]
        ]
        notes = [
            "Pending entries: delivered and not acknowledged, in processing or left for a "
            "retry. Redis keeps no retry time: an entry is tried again when a consumer claims "
            "it (XCLAIM/XAUTOCLAIM) once it has been idle longer than the ack timeout."
        ]
        if count is not None and count > len(messages):
            notes.append(f"The oldest {len(messages)} of {count} are listed.")
        return RetryView(count=count, listable=True, messages=messages, notes=notes)

    def prepare_drain(self, address: Address) -> None:
        client = self._client()
        try:
            client.xgroup_create(address.name, DRAIN_GROUP, id="0", mkstream=True)
        except rexc.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise _broker_error(exc, f"prepare_drain {address}") from None
        except (rexc.RedisError, OSError) as exc:
            raise _broker_error(exc, f"prepare_drain {address}") from None
        finally:
            client.close()

    def open_drain(self, address: Address) -> DrainSession:
        return RedisDrainSession(self, address.name)

    def open_publisher(self, target: Address) -> Publisher:
        client = self._client()
        try:
            client.ping()  # redis-py connects lazily: say "unreachable" here, as the contract asks
        except (rexc.RedisError, OSError) as exc:
            client.close()
            raise _broker_error(exc, "open publisher") from None
        return RedisPublisher(client, target.name)


def drain_consumer_name() -> str:
    """This process's consumer name in the drain group: stable for the life of the process."""
    return f"{DRAIN_CONSUMER_PREFIX}{socket.gethostname()[:60]}-{os.getpid()}"


class RedisDrainSession(DrainSession):
    """Reads the DLQ stream through group ``dlo-ingest`` as this process's own consumer: its
    pending entries, then idle ones claimed from dead consumers, then new ones (module
    docstring). Every step reads at most ``max_batch`` entries."""

    fetch_ahead = True  # a group's pending list has no bound

    def __init__(
        self, adapter: RedisStreamsAdapter, stream: str, consumer: str | None = None
    ) -> None:
        self.adapter = adapter
        self.stream = stream
        self.consumer = consumer or drain_consumer_name()
        self.timeout = adapter.timeout
        # BLOCK is sliced to at most ``timeout``, so the socket needs that much on top.
        self.client = adapter._client(block_s=adapter.timeout)
        self._cursor = "0"
        self._pending_done = False
        self._claim_cursor = "0-0"
        self._claim_done = False

    def _call(self, what: str, command: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except rexc.ResponseError as exc:
            if "NOGROUP" in str(exc):
                raise BrokerError(
                    f"redis drain {self.stream}: group {DRAIN_GROUP!r} missing; "
                    "call prepare_drain first",
                    permanent=True,
                ) from None
            raise _broker_error(exc, f"{what} {self.stream}") from None
        except (rexc.RedisError, OSError) as exc:
            raise _broker_error(exc, f"{what} {self.stream}") from None

    def _read(self, entry_id: str, count: int, block_ms: int | None) -> list[Any]:
        response = self._call(
            "drain",
            self.client.xreadgroup,
            DRAIN_GROUP,
            self.consumer,
            {self.stream: entry_id},
            count=count,
            block=block_ms,
        )
        if not response:
            return []
        entries: list[Any] = response[0][1] if isinstance(response, list) else []
        return entries

    def _claim(self, count: int) -> list[DeadLetter]:
        """Step 2: take over entries other consumers left idle past ``drain_claim_idle_s``;
        one bounded ``XAUTOCLAIM`` page per call. Entries deleted from the stream meanwhile
        come back as ids only (Redis 7) and are reported as lost bodies."""
        reply = self._call(
            "claim",
            self.client.xautoclaim,
            self.stream,
            DRAIN_GROUP,
            self.consumer,
            int(self.adapter.drain_claim_idle_s * 1000),
            start_id=self._claim_cursor,
            count=count,
        )
        cursor, entries = _text(reply[0]), reply[1]
        deleted = reply[2] if len(reply) > 2 else []
        self._claim_cursor = cursor
        if cursor == "0-0":
            self._claim_done = True
        letters = [self._letter(entry_id, fields) for entry_id, fields in entries]
        letters += [self._letter(entry_id, None) for entry_id in deleted]
        return letters

    def _forget_dead_consumers(self) -> None:
        """Delete our group's consumers that hold nothing and have been idle for long (dead
        workers): best effort, bounded by the group's consumer count."""
        try:
            consumers = self.client.xinfo_consumers(self.stream, DRAIN_GROUP)
            forget_ms = self.adapter.drain_forget_idle_s * 1000
            for info in consumers[:1000]:
                name = _text(info.get("name"))
                if (
                    name != self.consumer
                    and name.startswith(DRAIN_CONSUMER_PREFIX)
                    and not info.get("pending")
                    and (info.get("idle") or 0) >= forget_ms
                ):
                    self.client.xgroup_delconsumer(self.stream, DRAIN_GROUP, name)
        except (rexc.RedisError, OSError):
            return

    def fetch(self, max_batch: int, wait_s: float) -> list[DeadLetter]:
        count = max(1, max_batch)
        # 1. Re-read our own pending entries (read before, never acknowledged).
        if not self._pending_done:
            entries = self._read(self._cursor, count, None)
            if entries:
                self._cursor = _text(entries[-1][0])
                return [self._letter(entry_id, fields) for entry_id, fields in entries]
            self._pending_done = True
        # 2. Entries a dead consumer read and never acknowledged (bounded pages of the PEL).
        for _ in range(MAX_CLAIM_PAGES):
            if self._claim_done:
                break
            claimed = self._claim(count)
            if claimed:
                return claimed
        # 3. New entries, blocking in slices no longer than the timeout (bounded loop).
        deadline = time.monotonic() + max(0.0, wait_s)
        max_slices = int(wait_s // self.timeout) + 2 if self.timeout > 0 else 1
        for _ in range(max_slices):
            remaining = deadline - time.monotonic()
            block_ms = int(min(remaining, self.timeout) * 1000)
            entries = self._read(">", count, block_ms if block_ms > 0 else None)
            if entries or block_ms <= 0:
                return [self._letter(entry_id, fields) for entry_id, fields in entries]
        return []

    def _letter(self, entry_id: bytes, fields: dict[bytes, bytes] | None) -> DeadLetter:
        entry = _text(entry_id)
        ms = _id_ms(entry)
        properties: dict[str, Any] = {
            "stream": self.stream,
            "group": DRAIN_GROUP,
            "entry_id": entry,
        }
        if not fields:
            # In our pending list but deleted/trimmed from the stream before it was ingested.
            return DeadLetter(
                dedupe_key=f"redis:{self.stream}:{DRAIN_GROUP}:{entry}",
                body=b"",
                headers={},
                properties=properties,
                token=entry,
                broker_id=entry,
                reason="entry was deleted from the stream before ingest; body lost",
                dead_lettered_at=None if ms is None else ms / 1000.0,
            )
        raw_headers = {_text(k): v for k, v in fields.items() if k != BODY_FIELD.encode()}
        headers = json_safe_headers(raw_headers)
        # Every field in stream order, so a channel's declared layout can be applied at ingest
        # (``apply_layout``): the dashboard decides there what the message is.
        properties[ENTRY_FIELDS] = [
            [_text(k), v]
            for k, v in json_safe_headers({_text(k): v for k, v in fields.items()}).items()
        ]
        reason = headers.get("reason") or headers.get("error")
        source_stream = headers.get("source_stream")
        return DeadLetter(
            dedupe_key=f"redis:{self.stream}:{DRAIN_GROUP}:{entry}",
            body=bytes(fields.get(BODY_FIELD.encode(), b"")),
            headers=headers,
            properties=properties,
            token=entry,
            broker_id=entry,
            redelivery_count=_int_or_none(headers.get("delivery_count")),
            reason=reason if isinstance(reason, str) else None,
            first_death_queue=source_stream if isinstance(source_stream, str) else None,
            dead_lettered_at=None if ms is None else ms / 1000.0,
        )

    def ack(self, letters: Sequence[DeadLetter]) -> None:
        ids = [str(letter.token) for letter in letters]
        if not ids:
            return
        try:
            self.client.xack(self.stream, DRAIN_GROUP, *ids)
        except (rexc.RedisError, OSError) as exc:
            raise _broker_error(exc, f"ack {self.stream}") from None

    def close(self) -> None:
        self._forget_dead_consumers()
        self.client.close()


# --- entry layouts: what a dead-letter entry's fields mean, both ways -------------------------
#
# The one place that knows how a channel's Redis entries hold the message: ingest calls
# ``apply_layout`` on each drained letter, and the publisher calls ``replay_fields`` to write a
# replay back. Two layouts:
#
# - ``body-field``: one field (``body`` by default) holds the message bytes; every other field
#   is a header (the dashboard's own convention, and clients that wrap a payload).
# - ``field-map``: the whole field map is the message, as a plain redis-py client writes it
#   (``XADD orders * order_id 42 amount 9.5``); a reaper that dead-letters it adds named
#   error/metadata fields (``reason``, ``x-error-*`` …). The message is shown as a JSON object of
#   the original fields, and a replay writes exactly those fields back (plus the dashboard's own
#   ``x-dlq-*`` replay id, which identifies a second death), never the error fields.

ENTRY_FIELDS = "fields"  # DeadLetter.properties of a drained letter: all fields, in order
ORIGINAL_FIELDS = "redis_fields"  # stored for field-map entries: the original fields, in order
BODY_FIELD_PROPERTY = "redis_body_field"  # stored when the body field is not ``body``
DEFAULT_METADATA_FIELDS = (
    "reason",
    "error",
    "error_class",
    "delivery_count",
    "source_stream",
    "source_id",
    "dead_lettered_at",
    "x-error-*",
    "x-dlq-*",
    # What reapers add about the entry they moved (its id and count there): metadata, never
    # replayed into the message (docs/identity.md).
    "x-original-id",
    "x-delivery-count",
)
_REASON_FIELDS = ("reason", "x-error-reason", "error", "x-error", "x-error-message")
_COUNT_FIELDS = ("delivery_count", "x-error-delivery-count", "x-delivery-count", "times_delivered")


@dataclasses.dataclass(frozen=True)
class EntryLayout:
    kind: str = "body-field"  # or "field-map"
    body_field: str = BODY_FIELD
    metadata_fields: tuple[str, ...] = DEFAULT_METADATA_FIELDS

    def is_metadata(self, name: str) -> bool:
        lowered = name.lower()
        for pattern in self.metadata_fields:
            pattern = pattern.lower()
            if pattern.endswith("*") and lowered.startswith(pattern[:-1]):
                return True
            if lowered == pattern:
                return True
        return False


def _stored(value: Any) -> bytes | str | int | float:
    """A stored JSON-safe field value back to what Redis had (``{"$bytes": hex}`` → bytes)."""
    if isinstance(value, dict) and set(value) == {"$bytes"} and isinstance(value["$bytes"], str):
        try:
            return bytes.fromhex(value["$bytes"])
        except ValueError:
            pass
    return _field_value(value)


def apply_layout(letter: DeadLetter, layout: EntryLayout) -> DeadLetter:
    """``letter`` (from a drain) as the channel's layout reads it: body, headers, reason and
    delivery count. Letters without their field list (not from this adapter) are returned
    unchanged."""
    pairs = letter.properties.get(ENTRY_FIELDS)
    if not isinstance(pairs, list):
        return letter
    properties = {k: v for k, v in letter.properties.items() if k != ENTRY_FIELDS}
    named = [(str(p[0]), p[1]) for p in pairs if isinstance(p, list) and len(p) == 2]
    if layout.kind == "field-map":
        original = [[n, v] for n, v in named if not layout.is_metadata(n)]
        headers = {n: v for n, v in named if layout.is_metadata(n)}
        body = json.dumps(dict(original), ensure_ascii=False).encode()
        properties[ORIGINAL_FIELDS] = original
        properties.setdefault("content_type", "application/json")
    else:
        field = layout.body_field or BODY_FIELD
        raw = next((v for n, v in named if n == field), None)
        if isinstance(raw, str):
            body = raw.encode()
        elif isinstance(raw, dict) and isinstance(raw.get("$bytes"), str):
            body = bytes.fromhex(raw["$bytes"])
        else:
            body = b""
        headers = {n: v for n, v in named if n != field}
        if field != BODY_FIELD:
            properties[BODY_FIELD_PROPERTY] = field
    lowered = {k.lower(): v for k, v in headers.items()}
    reason = next((lowered[f] for f in _REASON_FIELDS if isinstance(lowered.get(f), str)), None)
    count = next(
        (c for f in _COUNT_FIELDS if (c := _int_or_none(lowered.get(f))) is not None), None
    )
    return dataclasses.replace(
        letter,
        body=body,
        headers=headers,
        properties=properties,
        reason=reason or letter.reason,
        redelivery_count=count if count is not None else letter.redelivery_count,
    )


def replay_fields(message: OutgoingMessage) -> dict[Any, Any]:
    """The fields a replay writes: for a field-map entry exactly its original fields (plus the
    dashboard's ``x-dlq-*`` headers); otherwise the body under its field and the headers.
    Raises ``ValueError`` when a header would overwrite the body field."""
    original = message.properties.get(ORIGINAL_FIELDS)
    if isinstance(original, list):
        fields = {str(p[0]): _stored(p[1]) for p in original if isinstance(p, list) and len(p) == 2}
        for name, value in message.headers.items():
            if name.lower().startswith("x-dlq-"):
                fields[name] = _field_value(value)
        return fields
    body_field = str(message.properties.get(BODY_FIELD_PROPERTY) or BODY_FIELD)
    if body_field in message.headers:
        raise ValueError(f"header {body_field!r} collides with the body field")
    fields = {body_field: message.body}
    fields.update({k: _field_value(v) for k, v in message.headers.items()})
    return fields


def _field_value(value: Any) -> bytes | str | int | float:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, bytes | str | int | float):
        return value
    return json.dumps(value, default=repr)


class RedisPublisher(Publisher):
    """XADD to one stream: field ``body`` plus one field per header; a batch is one pipeline."""

    def __init__(self, client: redis.Redis, stream: str) -> None:
        self.client = client
        self.stream = stream

    def publish(self, messages: Sequence[OutgoingMessage]) -> list[PublishOutcome]:
        outcomes: list[PublishOutcome | None] = [None] * len(messages)
        sent: list[int] = []
        pipe = self.client.pipeline(transaction=False)
        for index, message in enumerate(messages):
            try:
                fields = replay_fields(message)
            except ValueError as exc:
                outcomes[index] = PublishOutcome(
                    key=message.key, confirmed=False, reason=str(exc), permanent=True
                )
                continue
            pipe.xadd(self.stream, fields)
            sent.append(index)
        if sent:
            try:
                results: list[Any] = pipe.execute(raise_on_error=False)
            except (rexc.RedisError, OSError) as exc:
                # Outcome unknown for the whole batch: not confirmed, the replay may retry.
                results = [_broker_error(exc, f"publish {self.stream}")] * len(sent)
            for index, result in zip(sent, results, strict=True):
                key = messages[index].key
                if isinstance(result, Exception):
                    error = _broker_error(result, f"publish {self.stream}")
                    outcomes[index] = PublishOutcome(
                        key=key,
                        confirmed=False,
                        reason=str(error),
                        permanent=error.permanent,
                        refused=not error.connection_lost,  # the server answered with an error
                        connection_lost=error.connection_lost,
                    )
                else:
                    outcomes[index] = PublishOutcome(key=key, confirmed=bool(result))
        return [o for o in outcomes if o is not None]

    def close(self) -> None:
        self.client.close()
