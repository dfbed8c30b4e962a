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

On PostgreSQL, outside a caller's transaction, step 3 of one batch runs on a thread of its own
while this thread fetches and builds the rows of the next (``store_stage.StoreStage``); the acks
stay on this thread, in order, each after its batch's commit.

Fault injection (tests only): with ``DLO_TEST_CRASH_AFTER_COMMIT=1`` in the environment the
process ends with ``os._exit(137)`` right after the first commit, before its ack — exactly the
window a ``kill -9`` hits by luck only.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable, Sequence
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from audit.actions import Actor, record
from brokers.activemq import shared_dlq_address
from brokers.base import Address, BrokerError
from brokers.base import DeadLetter as Letter
from brokers.nats_jetstream import (
    NatsCopyDrainSession,
    copy_address,
    copy_key,
)
from channels_registry.models import BrokerConfigError, BrokerKind, Channel, ChannelHealth
from dlq.capture import adapters, search, trends
from dlq.capture.adapters import adapter_for  # noqa: F401 - re-exported: tests open adapters with it
from dlq.capture.fingerprint import normalize_error
from dlq.capture.ingest_build import (  # noqa: F401 - re-exported: bench/triage.py builds search text
    Built,
    Row,
    build_entry,
    search_text,
)
from dlq.capture.lineage import link_replayed_parents
from dlq.capture.store_stage import StoreFn, StoreStage
from dlq.models import DeadLetter, DeadLetterKey, FailureGroup, Source

log = logging.getLogger(__name__)

BATCH_SIZE = 500
#: How long a NATS advisory waits for the consumer's copy of its message before it is stored
#: on its own (``_awaiting_copies``): the copy is published first, but may reach the copy
#: stream's drain after the advisory reached its own.
COPY_WAIT_S = 60.0
FETCH_WAIT_S = 1.0
TOP_UP_WAIT_S = 0.05
DRAINED_WAIT_S = 0.25


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
    #: NATS advisories left for a later run while their message's copy is awaited.
    deferred: int = 0

    def add(self, other: IngestResult) -> None:
        self.stalled += other.stalled
        self.deferred += other.deferred
        self.fetched += other.fetched
        self.inserted += other.inserted
        self.duplicates += other.duplicates
        self.batches += other.batches
        self.errors.extend(other.errors)


def drain_addresses(channel: Channel) -> list[tuple[Address, str]]:
    """The dead-letter addresses to drain and the source each feeds.

    RabbitMQ and Redis: the declared DLQ and poison queue/stream; ActiveMQ too, but a shared
    ``ActiveMQ.DLQ`` is drained for this channel's origin queue only. NATS JetStream has no DLQ
    queue: the declared DLQ / poison streams hold the copies the consumer republished, and
    with ``nats_advisory_capture`` the advisories about the channel's own stream and consumer
    are dead letters too (docs/identity.md).
    """
    addresses: list[tuple[Address, str]] = []
    if channel.broker.kind == BrokerKind.NATS:
        # Copies first: the consumer publishes its copy before it gives the message up, so
        # the copy (which carries the cause) is stored before that message's advisory, which
        # store_batch then skips (see ``_covered_by_copies``).
        own = Address(channel.address, channel.address_group)
        if channel.dlq_address:
            addresses.append((copy_address(channel.dlq_address, own), Source.DLQ))
        if channel.poison_address:
            addresses.append((copy_address(channel.poison_address, own), Source.POISON))
        if channel.nats_advisory_capture:
            addresses.append((Address(channel.address, channel.address_group), Source.DLQ))
        return addresses
    if channel.broker.kind == BrokerKind.ACTIVEMQ:
        # A shared ActiveMQ.DLQ: this channel's letters alone, selected by their origin
        # (brokers/activemq.py); those of queues no channel declares stay on the broker.
        for name, source in (
            (channel.dlq_address, Source.DLQ),
            (channel.poison_address, Source.POISON),
        ):
            if name:
                addresses.append((shared_dlq_address(name, channel.address), source))
        return addresses
    if channel.dlq_address:
        addresses.append((Address(channel.dlq_address), Source.DLQ))
    if channel.poison_address:
        addresses.append((Address(channel.poison_address), Source.POISON))
    return addresses


# -- one batch: store, then (caller) ack -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuiltBatch:
    """A batch's rows built ahead of its transaction (``build_batch``), and when."""

    now: dt.datetime
    built: list[Built]


def build_batch(channel: Channel, letters: Sequence[Letter], source: str) -> BuiltBatch:
    """The rows of ``letters`` (those no stored NATS copy covers), built from ``channel`` as
    read now: for ``store_batch``, ahead of it or inside its transaction."""
    now = timezone.now()
    covered = _covered_by_copies(channel, letters)
    return BuiltBatch(
        now,
        [
            build_entry(channel, letter, source, now)
            for letter in letters
            if letter.dedupe_key not in covered
        ],
    )


def store_batch(
    channel: Channel,
    letters: Sequence[Letter],
    source: str,
    address: Address,
    stored_ids: list[int] | None = None,
    batch: BuiltBatch | None = None,
) -> tuple[int, int]:
    """Insert one batch in one transaction; return (inserted, duplicates) and add the new
    rows' ids to ``stored_ids``. Raises on any database failure, in which case the caller
    must not ack. The rows are ``batch`` when built ahead (``build_batch``), else built here,
    inside the transaction, from the locked channel row."""
    with transaction.atomic():
        # One ingester per channel at a time: the counts below rely on it.
        locked = Channel.objects.select_for_update().select_related("broker").get(pk=channel.pk)
        if batch is None:
            batch = build_batch(locked, letters, source)
        now, built = batch.now, batch.built
        unique: dict[str, Built] = {}
        for b in built:
            unique.setdefault(b.entry.dedupe_key, b)
        groups = _groups_for(locked, {b.fingerprint for b in unique.values()}, now)
        for b in unique.values():
            b.entry.group_id = groups[b.fingerprint].pk
        # Rows read like entries for these two (the attributes they use are columns).
        link_replayed_parents(cast(Iterable[DeadLetter], (b.entry for b in unique.values())))
        stored = _insert_new(list(unique.values()), now)
        new = {key: (unique[key].entry, unique[key].fingerprint) for key in stored}
        _count_into_groups(groups, new, stored)
        trends.count_new(cast(Iterable[DeadLetter], (entry for entry, _ in new.values())), now)
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


def _copy_keys(channel: Channel, letters: Sequence[Letter]) -> dict[str, Letter]:
    """The copy key (``copy_key``) of each NATS advisory letter, on a channel that declares
    DLQ / poison copy streams; empty elsewhere."""
    if channel.broker.kind != BrokerKind.NATS or not (
        channel.dlq_address or channel.poison_address
    ):
        return {}
    keys: dict[str, Letter] = {}
    for letter in letters:
        stream, seq = letter.properties.get("stream"), letter.properties.get("stream_seq")
        advisory = letter.properties.get("advisory_id")
        if advisory and isinstance(stream, str) and isinstance(seq, int):
            keys[copy_key(stream, seq)] = letter
    return keys


def _stored_keys(keys: list[str]) -> set[str]:
    if not keys:
        return set()
    table = DeadLetterKey if connection.vendor == "postgresql" else DeadLetter
    return set(table.objects.filter(dedupe_key__in=keys).values_list("dedupe_key", flat=True))


def _covered_by_copies(channel: Channel, letters: Sequence[Letter]) -> set[str]:
    """NATS advisories whose message the consumer copied into a declared DLQ / poison stream
    and whose copy is stored already (it names its original, ``copy_key``): the same death,
    with its cause. Their dedupe keys, to be acknowledged without a second entry."""
    keys = _copy_keys(channel, letters)
    return {keys[key].dedupe_key for key in _stored_keys(list(keys))}


def _awaiting_copies(channel: Channel, letters: Sequence[Letter]) -> set[str]:
    """NATS advisories younger than ``COPY_WAIT_S`` whose copy is not stored yet: the consumer
    publishes its copy before it gives the message up, but the copy's drain may not have
    reached it. Their dedupe keys, left for the next run; older ones are stored alone (the
    consumer made no copy, or one that names nothing)."""
    keys = _copy_keys(channel, letters)
    if not keys:
        return set()
    stored = _stored_keys(list(keys))
    horizon = timezone.now().timestamp() - COPY_WAIT_S
    return {
        letter.dedupe_key
        for key, letter in keys.items()
        if key not in stored and (letter.dead_lettered_at or 0.0) > horizon
    }


def _insert_new(built: list[Built], now: dt.datetime) -> dict[str, int]:
    """INSERT … ON CONFLICT (dedupe_key) DO NOTHING; return {dedupe_key: id} of the rows this
    call inserted (not the ones already stored)."""
    if connection.vendor != "postgresql":  # SQLite: the ORM's INSERT … ON CONFLICT DO NOTHING
        entries = [b.entry.model() for b in built]
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
        # One round trip: the staging table, the key trigger's setting (see below) and, where
        # the server has it, lz4 for the values TOAST compresses (search text, body, headers;
        # several times cheaper to compress than the default pglz, read back either way).
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS dlq_ingest_stage ON COMMIT DELETE ROWS AS "
            f"SELECT {columns} FROM {table} WITH NO DATA; "
            "SELECT set_config('dlo.dedupe_keys_written', 'on', true)"
            + (", set_config('default_toast_compression', 'lz4', true)" if _has_lz4() else "")
        )
        raw = cursor.cursor  # psycopg's own cursor, for COPY
        # Values go to COPY as they are (psycopg adapts them); JSON fields as the text
        # build_entry already encoded, which the server parses into jsonb (a
        # JSON field missing from ``Built.json_text`` fails loudly: COPY cannot adapt a dict).
        attnames = [f.attname for f in fields]
        with raw.copy(f"COPY dlq_ingest_stage ({columns}) FROM STDIN") as copy:
            for b in built:
                values = b.entry.values | b.json_text
                copy.write_row([values[a] for a in attnames])
        # The table is partitioned (dlq.partitions): deduplication is the key table's primary
        # key. Keys first, then only the entries whose key this statement inserted; the
        # setting (above) tells the per-row key trigger that the keys are written already.
        cursor.execute(
            f"WITH fresh AS (INSERT INTO {DeadLetterKey._meta.db_table} (dedupe_key) "
            "SELECT dedupe_key FROM dlq_ingest_stage ON CONFLICT DO NOTHING "
            f"RETURNING dedupe_key) INSERT INTO {table} ({columns}) SELECT {columns} "
            "FROM dlq_ingest_stage JOIN fresh USING (dedupe_key) RETURNING dedupe_key, id"
        )
        inserted = dict(cursor.fetchall())
        # Emptied by the commit too (ON COMMIT DELETE ROWS); DELETE, not TRUNCATE, for a
        # caller's enclosing transaction: no new file and catalog rows per batch.
        cursor.execute(
            "DELETE FROM dlq_ingest_stage; "
            "SELECT set_config('dlo.dedupe_keys_written', 'off', true)"
        )
    return inserted


_LZ4: dict[str, bool] = {}


def _has_lz4() -> bool:
    """Whether the server can compress TOAST values with lz4 (asked once per process)."""
    if "lz4" not in _LZ4:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT 'lz4' = ANY(enumvals) FROM pg_settings "
                "WHERE name = 'default_toast_compression'"
            )
            row = cursor.fetchone()
        _LZ4["lz4"] = bool(row and row[0])
    return _LZ4["lz4"]


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
    new: dict[str, tuple[Row, str]],
    ids: dict[str, int],
) -> None:
    """Add the newly inserted entries to their groups' counts and times."""
    by_fp: dict[str, list[Row]] = {}
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


def ingest_channel(
    channel: Channel, *, max_batches: int = 200, batch_size: int = BATCH_SIZE
) -> IngestResult:
    """Drain the channel's dead-letter addresses (bounded); see the module docstring."""
    result = IngestResult(channel.slug)
    adapter = adapters.adapter_for(channel)
    copies = False  # a NATS copy stream exists and was drained first: advisories may wait
    for address, source in drain_addresses(channel):
        adapter.prepare_drain(address)
        with (
            adapter.drain(address) as session,
            search.BackgroundIndexer() as indexer,
            StoreStage(session, indexer, result) as stage,
        ):
            if isinstance(session, NatsCopyDrainSession) and session.available:
                copies = True
            wait_s = FETCH_WAIT_S
            taken = 0  # letters fetched from this address (stored, deferred or in the stage)
            while result.batches < max_batches:
                letters = session.fetch(batch_size, wait_s)
                if not letters:
                    if not taken:
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
                taken += len(letters)
                # Left unacknowledged: handed back when the session closes, looked at again by
                # the next run, once their copies have been drained.
                waiting = _awaiting_copies(channel, letters) if copies else set()
                letters = [t for t in letters if t.dedupe_key not in waiting]
                result.deferred += len(waiting)
                result.batches += 1
                if not letters:
                    continue
                stage.submit(letters, _store_fn(channel, letters, source, address, stage.threaded))
    search.index_missing()
    return result


def _store_fn(
    channel: Channel, letters: Sequence[Letter], source: str, address: Address, ahead: bool
) -> StoreFn:
    """The store of one batch for ``StoreStage.submit``. ``ahead``: the stage stores on its own
    thread, so the rows are built here, now, while the batch before is being stored, from the
    channel row as it stands (its redaction and idempotency settings apply from the next
    batch on, as they do in the serial loop)."""
    batch: BuiltBatch | None = None
    if ahead:
        current = Channel.objects.select_related("broker").get(pk=channel.pk)
        batch = build_batch(current, letters, source)
    return lambda ids: store_batch(channel, letters, source, address, ids, batch)


def do_ingest_channel(channel_id: int, max_batches: int = 200) -> IngestResult:
    """Drain one channel's dead letters into the store (``ingest_channel``). Broker problems
    are reported in the result; database errors propagate (nothing was acked)."""
    channel = Channel.objects.select_related("broker").get(pk=channel_id)
    try:
        result = ingest_channel(channel, max_batches=max_batches)
    except (BrokerError, BrokerConfigError) as exc:
        log.warning("ingest %s: %s", channel.slug, exc)
        return IngestResult(channel.slug, errors=[str(exc)])
    # Health evidence (and /metrics): the broker says N wait, and this run fetched none.
    ChannelHealth.objects.filter(channel_id=channel.pk).update(
        ingest_stalled=result.stalled or None, ingest_checked_at=timezone.now()
    )
    if result.stalled:
        log.warning(
            "ingest %s: fetched nothing while the broker says %d dead letters are waiting",
            channel.slug,
            result.stalled,
        )
    return result


def channels_to_ingest() -> list[int]:
    """Enabled channels on enabled brokers with something to drain: a DLQ, a poison queue or
    NATS advisories."""
    return list(
        Channel.objects.filter(enabled=True, broker__enabled=True)
        .filter(~Q(dlq_address="") | ~Q(poison_address="") | Q(nats_advisory_capture=True))
        .order_by("pk")
        .values_list("pk", flat=True)
    )
