"""Moving dead letters from a broker into the database: nothing lost, nothing duplicated.

Per channel and dead-letter address (``ingest_channel``):

1. ``prepare_drain`` (idempotent), then open a manual-ack drain session.
2. Fetch a bounded batch (``BATCH_SIZE``); an empty batch means drained.
3. In ONE transaction: lock the channel row (one ingester per channel at a time), insert the
   batch with ``bulk_create(ignore_conflicts=True)`` — on PostgreSQL, whose dead-letter table
   is partitioned, ``INSERT … ON CONFLICT DO NOTHING`` into the key table
   ``dlq_deadletter_key`` and only the rows whose key was new — keyed on the adapter's
   ``dedupe_key``, add the new rows to their failure groups, and write one ``dlq.ingest``
   audit event for the batch.
4. Only after the commit returned, ``ack`` the batch on the broker. Any exception from step 3
   (including a commit whose outcome is unknown) propagates *without* an ack: the broker keeps
   the messages and the next run re-reads them; the unique ``dedupe_key`` makes that a no-op.
   A crash after the commit and before the ack is the same case.
5. Stop after ``max_batches`` so one run is bounded.

Fault injection (tests only): with ``DLO_TEST_CRASH_AFTER_COMMIT=1`` in the environment the
process ends with ``os._exit(137)`` right after the first commit, before its ack — exactly the
window a ``kill -9`` hits by luck only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from audit.actions import Actor, record
from brokers import get_adapter, redis_streams
from brokers.base import Address, BrokerAdapter
from brokers.base import DeadLetter as Letter
from brokers.nats_jetstream import NatsJetStreamAdapter
from channels_registry import schemas
from channels_registry.models import (
    BrokerKind,
    Channel,
    ChannelHealth,
    DlqStrategy,
    IdempotencySource,
    installation_id,
)
from dlq import message, redaction, render, search, trends
from dlq.fingerprint import fingerprint, normalize_error
from dlq.models import DeadLetter, DeadLetterKey, FailureGroup, Source
from dlq.relay import link_replayed_parents

log = logging.getLogger(__name__)

BATCH_SIZE = 500
FETCH_WAIT_S = 1.0
TOP_UP_WAIT_S = 0.05
DRAINED_WAIT_S = 0.25
SEARCH_TEXT_LIMIT = 4000
# Where producers and consumers commonly put the error of a failed message (Spring AMQP,
# MassTransit, our Redis convention, plain names). The first present header wins.
ERROR_CLASS_HEADERS = (
    "x-exception-class",
    "x-exception-type",
    "x-error-class",
    "error_class",
    "error-class",
    "exception_class",
    "MT-Fault-ExceptionType",
)
ERROR_MESSAGE_HEADERS = (
    "x-exception-message",
    "x-error-message",
    "x-error",
    "error_message",
    "error",
    "exception",
    "MT-Fault-Message",
)
SCHEMA_VERSION_HEADERS = ("schema-version", "schema_version", "x-schema-version")
JSON_CONTENT_TYPES = ("json", "")  # an empty content type is assumed to be JSON


@dataclasses.dataclass
class IngestResult:
    channel: str
    fetched: int = 0
    inserted: int = 0
    duplicates: int = 0
    batches: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    #: Dead letters the broker said were waiting on a drain that fetched none (see
    #: ``DrainSession.waiting``): held by a crashed ingester, or a stuck drain.
    stalled: int = 0

    def add(self, other: IngestResult) -> None:
        self.stalled += other.stalled
        self.fetched += other.fetched
        self.inserted += other.inserted
        self.duplicates += other.duplicates
        self.batches += other.batches
        self.errors.extend(other.errors)


def adapter_for(channel: Channel) -> BrokerAdapter:
    broker = channel.broker
    adapter = get_adapter(broker.kind, broker.connection_url(), **broker.adapter_options())
    adapter.installation_id = installation_id()
    if isinstance(adapter, NatsJetStreamAdapter):
        adapter.drain_ack_wait_s = float(settings.DLO_NATS_DRAIN_ACK_WAIT_S)
        adapter.drain_max_ack_pending = int(settings.DLO_NATS_DRAIN_MAX_ACK_PENDING)
    return adapter


def drain_addresses(channel: Channel) -> list[tuple[Address, str]]:
    """The dead-letter addresses to drain and the source each feeds.

    RabbitMQ and Redis: the declared DLQ and poison queue/stream. NATS JetStream has no DLQ
    queue: with ``nats_advisory_capture`` its dead letters are the advisories about the
    channel's own stream and consumer (docs/identity.md).
    """
    addresses: list[tuple[Address, str]] = []
    if channel.broker.kind == BrokerKind.NATS:
        if channel.nats_advisory_capture:
            addresses.append((Address(channel.address, channel.address_group), Source.DLQ))
        return addresses
    if channel.dlq_address:
        addresses.append((Address(channel.dlq_address), Source.DLQ))
    if channel.poison_address:
        addresses.append((Address(channel.poison_address), Source.POISON))
    return addresses


# -- turning one broker letter into a row --------------------------------------------------


def _no_nul(value: Any, depth: int = 0) -> Any:
    """PostgreSQL text and jsonb refuse NUL characters. Strings holding one become
    ``{"$bytes": hex}`` (the adapters' own convention for non-text bytes), so nothing is lost."""
    if depth > 40:
        return value
    if isinstance(value, str):
        return {"$bytes": value.encode("utf-8").hex()} if "\x00" in value else value
    if isinstance(value, dict):
        return {k.replace("\x00", "\ufffd"): _no_nul(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nul(v, depth + 1) for v in value]
    return value


def _json_no_nul(value: Any) -> tuple[Any, str]:
    """``value`` made NUL-free (see ``_no_nul``) and its JSON text, which COPY sends as is.
    Encoding once is what COPY needs anyway, and JSON escapes every NUL as ``\\u0000``, so the
    copying walk of ``_no_nul`` only runs for the rare value that holds one."""
    text = json.dumps(value)
    if "\\u0000" in text:  # also matches an escaped backslash before "u0000": harmless
        value = _no_nul(value)
        text = json.dumps(value)
    return value, text


def _text(value: Any, limit: int) -> str:
    if value is None:
        return ""
    if isinstance(value, dict) and "$bytes" in value:
        try:
            value = bytes.fromhex(str(value["$bytes"])).decode("utf-8", "replace")
        except ValueError:
            value = ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text.replace("\x00", "\ufffd")[:limit]


def _lower(headers: dict[str, Any]) -> dict[str, Any]:
    """Header lookups are case-insensitive: key the headers in lower case once per message."""
    return {k.lower(): v for k, v in headers.items()}


def _first_header(lowered: dict[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def _aware(epoch: float | None) -> dt.datetime | None:
    if epoch is None:
        return None
    try:
        return dt.datetime.fromtimestamp(epoch, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None


def read_idempotency_key(
    channel: Channel, headers: dict[str, Any], properties: dict[str, Any], document: Any
) -> str:
    """The key from the channel's declared location; "" when absent."""
    source, where = channel.idempotency_source, channel.idempotency_key
    value: Any = None
    if source == IdempotencySource.HEADER and where:
        value = _first_header(_lower(headers), [where])
    elif source == IdempotencySource.PROPERTY:
        value = properties.get("message_id")
    elif source == IdempotencySource.JSON_PATH and render.is_parsed(document):
        steps = redaction.parse_path(where)
        value = document
        for step in steps or [None]:
            if isinstance(step, str) and isinstance(value, dict):
                value = value.get(step)
            elif isinstance(step, int) and isinstance(value, list) and step < len(value):
                value = value[step]
            else:
                value = None
                break
    if value is None or isinstance(value, dict | list):
        return ""
    return _text(value, 255)


def search_text(body_view: bytes | None, headers: dict[str, Any]) -> str:
    """Lower-cased text searched by the list filter: the (redacted) body head, then headers."""
    parts = []
    if body_view:
        parts.append(body_view[:SEARCH_TEXT_LIMIT].decode("utf-8", "replace"))
    for key, value in list(headers.items())[:200]:
        parts.append(f"{key}: {_text(value, 300)}")
    return "\n".join(parts).replace("\x00", " ").lower()[: SEARCH_TEXT_LIMIT * 2]


class Built(NamedTuple):
    entry: DeadLetter  # the unsaved row
    fingerprint: str  # of its failure, for the group
    json_text: dict[str, str]  # attname -> JSON text of the row's JSON fields, for COPY


def as_written(channel: Channel, letter: Letter) -> Letter:
    """The letter read with the channel's declared Redis entry layout (see
    ``brokers.redis_streams.apply_layout``); other brokers' letters are unchanged."""
    if channel.broker.kind != BrokerKind.REDIS:
        return letter
    layout = redis_streams.EntryLayout(
        kind=channel.entry_layout,
        body_field=channel.entry_body_field or redis_streams.BODY_FIELD,
        metadata_fields=tuple(channel.entry_metadata_fields or ())
        or redis_streams.DEFAULT_METADATA_FIELDS,
    )
    return redis_streams.apply_layout(letter, layout)


def _delivery_limit(channel: Channel) -> int | None:
    """The main queue's delivery limit as last observed (quorum ``delivery-limit``), else the
    declared retry budget. Cached on the instance: one query per batch."""
    if "_delivery_limit" not in channel.__dict__:
        observed = (
            ChannelHealth.objects.filter(channel=channel).values_list("observed", flat=True).first()
        )
        limit = observed.get("delivery_limit") if isinstance(observed, dict) else None
        channel.__dict__["_delivery_limit"] = (
            limit if isinstance(limit, int) and limit > 0 else channel.retry_max_attempts
        )
    value = channel.__dict__["_delivery_limit"]
    return value if isinstance(value, int) else None


def build_entry(channel: Channel, letter: Letter, source: str, now: dt.datetime) -> Built:
    """The unsaved row for ``letter``, its failure fingerprint and its JSON as text."""
    letter = as_written(channel, letter)
    headers, headers_json = _json_no_nul(letter.headers)
    properties, properties_json = _json_no_nul(letter.properties)
    death_history, death_history_json = _json_no_nul(list(letter.death_history))
    content_type = _text(properties.get("content_type") or headers.get("content-type"), 200)
    document = render.parse_json(letter.body)
    is_parseable = _is_parseable(content_type, document)
    source = _routed_source(channel, source, is_parseable)
    visible_headers = redaction.redact_headers(headers, channel)
    t = _triage(channel, letter, headers, visible_headers, properties, document, source)
    body_view = _body_view(channel, letter, document)
    entry = DeadLetter(
        channel=channel,
        source=t.source,
        dedupe_key=letter.dedupe_key[:200],
        body=letter.body,
        body_sha256=hashlib.sha256(letter.body).hexdigest(),
        size=len(letter.body),
        content_type=content_type,
        headers=headers,
        properties=properties,
        reason=t.reason,
        error_class=t.error_class,
        error_message=t.error_message,
        redelivery_count=message.delivery_count(
            letter.redelivery_count, headers, t.job, delivery_limit=_delivery_limit(channel)
        ),
        first_death_queue=_text(letter.first_death_queue, 255),
        first_death_exchange=_text(letter.first_death_exchange, 255),
        first_death_at=_aware(letter.first_death_at),
        dead_lettered_at=_aware(letter.dead_lettered_at) or now,
        ingested_at=now,
        idempotency_key=t.idempotency_key,
        missing_idempotency_key=not t.idempotency_key,
        schema_version=t.schema_version,
        is_parseable=is_parseable,
        schema_error=t.schema_error,
        message_type=t.message_type,
        job=t.job,
        death_history=death_history,
        search_text=search_text(body_view, visible_headers),
    )
    json_text = {
        "headers": headers_json,
        "properties": properties_json,
        "death_history": death_history_json,
    }
    json_text["schema_error"] = t.schema_error_json
    json_text["job"] = t.job_json
    print_ = fingerprint(channel.pk, t.reason, t.error_class, t.error_message, t.message_type)
    return Built(entry, print_, json_text)


def _is_parseable(content_type: str, document: Any) -> bool | None:
    """Whether a JSON (or untyped) body parses; None for any other content type."""
    if any(t and t in content_type.lower() for t in JSON_CONTENT_TYPES) or not content_type:
        return render.is_parsed(document)
    return None


def _routed_source(channel: Channel, source: str, is_parseable: bool | None) -> str:
    """Poison vs DLQ. Where a letter was found decides first (the poison address is poison).
    A letter found in the DLQ of a channel that declares the poison-queue strategy but whose
    body does not parse was misrouted: the contract says unparseable messages are poison
    (never retried), so it is classified as poison. Without that strategy there is no poison
    contract; the entry stays DLQ and carries the is_parseable=False flag."""
    if (
        source == Source.DLQ
        and is_parseable is False
        and DlqStrategy.POISON_QUEUE in (channel.dlq_strategies or [])
    ):
        return Source.POISON
    return source


class _Triage(NamedTuple):
    source: str
    reason: str
    error_class: str
    error_message: str
    job: Any  # the recognised job, NUL-free
    job_json: str
    message_type: str
    idempotency_key: str
    schema_version: str
    schema_error: Any
    schema_error_json: str


def _triage(
    channel: Channel,
    letter: Letter,
    headers: dict[str, Any],
    visible_headers: dict[str, Any],
    properties: dict[str, Any],
    document: Any,
    source: str,
) -> _Triage:
    """What failed and why (from the headers, a known job client, the registered schema),
    the message type and the idempotency key."""
    lowered = _lower(headers)
    visible_lowered = lowered if visible_headers is headers else _lower(visible_headers)
    reason = _text(letter.reason or _first_header(lowered, ["reason", "x-first-death-reason"]), 100)
    error_class = _text(_first_header(visible_lowered, ERROR_CLASS_HEADERS), 300)
    error_message = _text(_first_header(visible_lowered, ERROR_MESSAGE_HEADERS), 10_000)
    # Job-aware triage: the type and what a known job client (Celery, Sidekiq) says.
    job = message.recognise_job(headers, document)
    mtype = message.message_type(channel, headers, document, job)
    error_class = error_class or _text(job.get("error_class"), 300)
    error_message = error_message or _text(job.get("error_message"), 10_000)
    # A field-map Redis entry keeps its fields as the message: a header-declared key is there.
    key_headers = headers
    if isinstance(properties.get(redis_streams.ORIGINAL_FIELDS), list):
        key_headers = {**dict(properties[redis_streams.ORIGINAL_FIELDS]), **headers}
    idem = read_idempotency_key(channel, key_headers, properties, document)
    schema = _first_header(lowered, SCHEMA_VERSION_HEADERS)
    if schema is None and isinstance(document, dict):
        schema = document.get("schema_version", document.get("schemaVersion"))
    # P1: a body failing the channel's registered schema is poison, the validation error its
    # reason (the entry's own schema version selects the schema when it is registered).
    invalid = schemas.failure(
        channel,
        document,
        _text(schema, 50) if schema is not None else "",
        parsed=render.is_parsed(document),
    )
    if invalid is not None:
        source = Source.POISON
        reason = _text(f"schema-invalid: {invalid.message}", 100)
        error_class = "SchemaValidationError"
        error_message = f"{invalid.path}: {invalid.message}"
    schema_error, schema_error_json = _json_no_nul(invalid.as_dict() if invalid else {})
    job, job_json = _json_no_nul(job)
    schema_version = _text(schema, 50) if schema is not None else ""
    return _Triage(
        source, reason, error_class, error_message, job, job_json, mtype, idem,
        schema_version, schema_error, schema_error_json,
    )  # fmt: skip


def _body_view(channel: Channel, letter: Letter, document: Any) -> bytes | None:
    """The body the search text may read: redacted when the channel has JSON redaction
    rules, None when they cannot be applied (so it stays out of the search text)."""
    if isinstance(document, dict | list) and channel.redact_json_paths:
        return render.redacted_body_bytes(letter.body, channel)
    if channel.redact_json_paths:
        return None  # rules cannot be applied: keep the body out of the search text
    return letter.body


# -- one batch: store, then (caller) ack -------------------------------------------------


def store_batch(
    channel: Channel,
    letters: Sequence[Letter],
    source: str,
    address: Address,
    stored_ids: list[int] | None = None,
) -> tuple[int, int]:
    """Insert one batch in one transaction; return (inserted, duplicates) and add the new
    rows' ids to ``stored_ids``. Raises on any database failure, in which case the caller
    must not ack."""
    with transaction.atomic():
        # One ingester per channel at a time: the counts below rely on it.
        locked = Channel.objects.select_for_update().select_related("broker").get(pk=channel.pk)
        now = timezone.now()
        built = [build_entry(locked, letter, source, now) for letter in letters]
        unique: dict[str, Built] = {}
        for b in built:
            unique.setdefault(b.entry.dedupe_key, b)
        groups = _groups_for(locked, {b.fingerprint for b in unique.values()}, now)
        for b in unique.values():
            b.entry.group_id = groups[b.fingerprint].pk
        link_replayed_parents(b.entry for b in unique.values())
        stored = _insert_new(list(unique.values()), now)
        new = {key: (unique[key].entry, unique[key].fingerprint) for key in stored}
        _count_into_groups(groups, new, stored)
        trends.count_new((entry for entry, _ in new.values()), now)
        inserted, duplicates = len(new), len(letters) - len(new)
        record(
            "dlq.ingest",
            actor=Actor.system(),
            target_type="channels_registry.channel",
            target_id=locked.pk,
            target_repr=f"{locked.slug} {source} {address}",
            channel_slug=locked.slug,
            after={
                "address": str(address),
                "source": source,
                "fetched": len(letters),
                "inserted": inserted,
                "duplicates": duplicates,
                "first_id": min(stored.values(), default=None),
                "last_id": max(stored.values(), default=None),
            },
        )
    if stored_ids is not None:
        stored_ids.extend(stored.values())
    return inserted, duplicates


def _insert_new(built: list[Built], now: dt.datetime) -> dict[str, int]:
    """INSERT … ON CONFLICT (dedupe_key) DO NOTHING; return {dedupe_key: id} of the rows this
    call inserted (not the ones already stored)."""
    entries = [b.entry for b in built]
    if connection.vendor != "postgresql":  # SQLite: the ORM's INSERT … ON CONFLICT DO NOTHING
        DeadLetter.objects.bulk_create(entries, batch_size=BATCH_SIZE, ignore_conflicts=True)
        # Rows inserted by this batch carry its exact timestamp; earlier copies (a crash before
        # the ack) carry an older one. The caller's channel lock rules out a concurrent batch.
        keys = [e.dedupe_key for e in entries]
        return dict(
            DeadLetter.objects.filter(dedupe_key__in=keys, ingested_at=now).values_list(
                "dedupe_key", "id"
            )
        )
    # PostgreSQL: the same statement, fed by COPY into a per-connection staging table, because
    # compiling a 500-row INSERT through the ORM costs more than the database's own work
    # (bench/ingest.py), and RETURNING hands back exactly the inserted rows.
    fields = [f for f in DeadLetter._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column or f.attname) for f in fields)
    table = DeadLetter._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS dlq_ingest_stage ON COMMIT DELETE ROWS AS "
            f"SELECT {columns} FROM {table} WITH NO DATA"
        )
        raw = cursor.cursor  # psycopg's own cursor, for COPY
        # Values go to COPY as they are (psycopg adapts them); JSON fields as the text
        # build_entry already encoded, which the server parses into jsonb (a
        # JSON field missing from ``Built.json_text`` fails loudly: COPY cannot adapt a dict).
        attnames = [f.attname for f in fields]
        with raw.copy(f"COPY dlq_ingest_stage ({columns}) FROM STDIN") as copy:
            for b in built:
                values = {**b.entry.__dict__, **b.json_text}
                copy.write_row([values[a] for a in attnames])
        # The table is partitioned (dlq.partitions): deduplication is the key table's primary
        # key. Keys first, then only the entries whose key this statement inserted; the
        # setting tells the per-row key trigger that the keys are written already.
        cursor.execute("SELECT set_config('dlo.dedupe_keys_written', 'on', true)")
        cursor.execute(
            f"WITH fresh AS (INSERT INTO {DeadLetterKey._meta.db_table} (dedupe_key) "
            "SELECT dedupe_key FROM dlq_ingest_stage ON CONFLICT DO NOTHING "
            f"RETURNING dedupe_key) INSERT INTO {table} ({columns}) SELECT {columns} "
            "FROM dlq_ingest_stage JOIN fresh USING (dedupe_key) RETURNING dedupe_key, id"
        )
        inserted = dict(cursor.fetchall())
        cursor.execute(
            "TRUNCATE dlq_ingest_stage; SELECT set_config('dlo.dedupe_keys_written', 'off', true)"
        )
    return inserted


def _groups_for(
    channel: Channel, fingerprints: set[str], now: dt.datetime
) -> dict[str, FailureGroup]:
    """The channel's failure group per fingerprint, creating missing ones (count 0)."""
    groups = {
        g.fingerprint: g
        for g in FailureGroup.objects.filter(channel=channel, fingerprint__in=fingerprints)
    }
    for fp in fingerprints - set(groups):
        groups[fp] = FailureGroup.objects.create(
            channel=channel, fingerprint=fp, count=0, first_seen=now, last_seen=now
        )
    return groups


def _count_into_groups(
    groups: dict[str, FailureGroup],
    new: dict[str, tuple[DeadLetter, str]],
    ids: dict[str, int],
) -> None:
    """Add the newly inserted entries to their groups' counts and times."""
    by_fp: dict[str, list[DeadLetter]] = {}
    for entry, fp in new.values():
        by_fp.setdefault(fp, []).append(entry)
    for fp, entries in by_fp.items():
        group, first = groups[fp], entries[0]
        seen = [e.dead_lettered_at for e in entries]
        changes: dict[str, Any] = {
            "count": F("count") + len(entries),
            "open_count": F("open_count") + len(entries),
            "last_seen": Greatest(F("last_seen"), max(seen)),
        }
        if group.sample_id is None:
            # A new group: describe it by its first entry.
            changes.update(
                sample_id=ids[first.dedupe_key],
                reason=first.reason,
                error_class=first.error_class,
                message_type=first.message_type,
                normalized_error=normalize_error(first.error_message),
                first_seen=min(seen),
                last_seen=max(seen),
            )
        else:
            changes["first_seen"] = Least(F("first_seen"), min(seen))
        FailureGroup.objects.filter(pk=group.pk).update(**changes)


def _crash_after_commit_requested() -> bool:
    return os.environ.get("DLO_TEST_CRASH_AFTER_COMMIT") == "1"


def ingest_channel(
    channel: Channel, *, max_batches: int = 200, batch_size: int = BATCH_SIZE
) -> IngestResult:
    """Drain the channel's dead-letter addresses (bounded); see the module docstring."""
    result = IngestResult(channel.slug)
    adapter = adapter_for(channel)
    for address, source in drain_addresses(channel):
        adapter.prepare_drain(address)
        with adapter.drain(address) as session, search.BackgroundIndexer() as indexer:
            wait_s = FETCH_WAIT_S
            fetched_before = result.fetched
            while result.batches < max_batches:
                letters = session.fetch(batch_size, wait_s)
                if not letters:
                    if result.fetched == fetched_before:
                        # Nothing at all: does the broker say something is waiting?
                        result.stalled += session.waiting() or 0
                    break
                # Top the batch up with what is already arriving: fuller batches mean fewer
                # transactions (adapters return what they have without waiting for more).
                while len(letters) < batch_size:
                    more = session.fetch(batch_size - len(letters), TOP_UP_WAIT_S)
                    if not more:
                        # Probably drained: the next fetch need not wait as long to say so.
                        wait_s = DRAINED_WAIT_S
                        break
                    letters.extend(more)
                ids: list[int] = []
                inserted, duplicates = store_batch(channel, letters, source, address, ids)
                if _crash_after_commit_requested():
                    os._exit(137)
                session.ack(letters)
                # Off the commit-then-ack path: the text index follows the ack, on the
                # indexer's own thread and connection (caught up by index_missing below).
                indexer.submit(ids)
                result.batches += 1
                result.fetched += len(letters)
                result.inserted += inserted
                result.duplicates += duplicates
    search.index_missing()
    return result
