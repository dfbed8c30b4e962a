"""State changes of dead-letter entries: ingest, retention purge, reveal.

Ingest and purge deliberately are *not* one ``@transaction.atomic`` around the whole run: each
works in bounded batches, one transaction and one audit event per batch, so a long drain never
holds a transaction open and a crash loses at most one uncommitted batch (which the broker,
or the next purge run, still has).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from django.db import transaction

from audit.actions import Actor, record
from brokers.base import BrokerError
from channels_registry.models import BrokerConfigError, Channel
from dlq import retention
from dlq.ingest import IngestResult, ingest_channel
from dlq.models import DeadLetter

log = logging.getLogger(__name__)


def do_ingest_channel(channel_id: int, max_batches: int = 200) -> IngestResult:
    """Drain one channel's dead letters into the store (see ``dlq.ingest``). Broker problems
    are reported in the result; database errors propagate (nothing was acked)."""
    channel = Channel.objects.select_related("broker").get(pk=channel_id)
    try:
        return ingest_channel(channel, max_batches=max_batches)
    except (BrokerError, BrokerConfigError) as exc:
        log.warning("ingest %s: %s", channel.slug, exc)
        return IngestResult(channel.slug, errors=[str(exc)])


def channels_to_ingest() -> list[int]:
    from django.db.models import Q

    return list(
        Channel.objects.filter(enabled=True, broker__enabled=True)
        .filter(~Q(dlq_address="") | ~Q(poison_address=""))
        .order_by("pk")
        .values_list("pk", flat=True)
    )


@dataclasses.dataclass
class PurgeResult:
    purged: int = 0
    batches: int = 0


def do_purge_expired(now: dt.datetime, *, max_batches: int = 100) -> PurgeResult:
    """Purge the payloads retention says are expired, leaving tombstones (id, hash, size,
    metadata, ``purged_at``). Bounded batches, each one transaction with its audit event."""
    result = PurgeResult()
    for channel in retention.channels_with_retention():
        while result.batches < max_batches:
            with transaction.atomic():
                ids = list(
                    retention.expired(channel, now)
                    .select_for_update(skip_locked=True)
                    .order_by("id")
                    .values_list("id", flat=True)[: retention.PURGE_BATCH]
                )
                if not ids:
                    break
                count = DeadLetter.objects.filter(pk__in=ids, purged_at__isnull=True).update(
                    body=None, search_text="", purged_at=now
                )
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


@transaction.atomic
def do_reveal_entry(entry: DeadLetter, actor: Actor, reason: str) -> None:
    """Record that ``actor`` was shown the redacted fields of ``entry`` (the caller checked
    the permission and shows them only after this committed)."""
    record(
        "dlq.reveal",
        actor=actor,
        target=entry,
        target_type="dlq.deadletter",
        channel_slug=entry.channel.slug,
        reason=reason,
        after={
            "headers": list(entry.channel.redact_headers or []),
            "json_paths": list(entry.channel.redact_json_paths or []),
        },
    )
