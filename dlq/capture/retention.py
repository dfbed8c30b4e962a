"""Retention: which entries the policy purges, and the purge itself.

An entry's payload is purged when it is resolved (replayed or discarded), not yet purged, and
older (by ``ingested_at``, the time this store started keeping it) than its channel's declared
``retention_s``. Unresolved entries are never purged: a dead letter nobody has looked at is
not thrown away by a clock. Channels without a declared retention keep everything.

The purge is deliberately *not* one ``@transaction.atomic`` around the whole run: it works in
bounded batches, one transaction and one audit event per batch, so a crash loses at most one
uncommitted batch, which the next run purges.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.db import transaction
from django.db.models import QuerySet

from audit.actions import Actor, record
from channels_registry.models import Channel
from dlq.capture import partitions, search
from dlq.models import RESOLVED, DeadLetter

PURGE_BATCH = 1000


def expired(channel: Channel, now: dt.datetime) -> QuerySet[DeadLetter]:
    if not channel.retention_s:
        return DeadLetter.objects.none()
    cutoff = now - dt.timedelta(seconds=channel.retention_s)
    return DeadLetter.objects.filter(
        channel=channel, state__status__in=RESOLVED, purged_at__isnull=True, ingested_at__lt=cutoff
    )


def channels_with_retention() -> QuerySet[Channel]:
    return Channel.objects.filter(retention_s__isnull=False, retention_s__gt=0)


@dataclasses.dataclass
class PurgeResult:
    purged: int = 0
    batches: int = 0
    partitions_dropped: int = 0
    entries_dropped: int = 0


def do_purge_expired(now: dt.datetime, *, max_batches: int = 100) -> PurgeResult:
    """Apply retention. First whole partitions (PostgreSQL): a closed partition whose every
    entry is past its channel's policy is dropped with its dependants, one audit event each
    (``dlq.capture.partitions``). Then, row by row, purge the payloads retention says are expired,
    leaving tombstones (id, hash, size, metadata, ``purged_at``). Bounded batches, each one
    transaction with its audit event."""
    result = PurgeResult()
    dropped = partitions.drop_expired_partitions(now)
    result.partitions_dropped = len(dropped)
    result.entries_dropped = sum(d["rows"] for d in dropped)
    for channel in channels_with_retention():
        while result.batches < max_batches:
            with transaction.atomic():
                ids = list(
                    expired(channel, now)
                    .select_for_update(skip_locked=True)
                    .order_by("id")
                    .values_list("id", flat=True)[:PURGE_BATCH]
                )
                if not ids:
                    break
                count = DeadLetter.objects.filter(pk__in=ids, purged_at__isnull=True).update(
                    body=None, search_text="", purged_at=now
                )
                search.forget(ids)
                record(
                    "dlq.purge",
                    actor=Actor.system(),
                    target_type="channels_registry.channel",
                    target_id=channel.pk,
                    target_repr=f"{channel.slug}: {count} payloads past retention",
                    channel_slug=channel.slug,
                    after={
                        "purged": count,
                        "first_id": ids[0],
                        "last_id": ids[-1],
                        "retention_s": channel.retention_s,
                    },
                )
            result.purged += count
            result.batches += 1
    return result
