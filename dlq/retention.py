"""Which entries the retention policy purges.

An entry's payload is purged when it is resolved (replayed or discarded), not yet purged, and
older (by ``ingested_at``, the time this store started keeping it) than its channel's declared
``retention_s``. Unresolved entries are never purged: a dead letter nobody has looked at is
not thrown away by a clock. Channels without a declared retention keep everything.
"""

from __future__ import annotations

import datetime as dt

from django.db.models import QuerySet

from channels_registry.models import Channel
from dlq.models import RESOLVED, DeadLetter

PURGE_BATCH = 1000


def expired(channel: Channel, now: dt.datetime) -> QuerySet[DeadLetter]:
    if not channel.retention_s:
        return DeadLetter.objects.none()
    cutoff = now - dt.timedelta(seconds=channel.retention_s)
    return DeadLetter.objects.filter(
        channel=channel, status__in=RESOLVED, purged_at__isnull=True, ingested_at__lt=cutoff
    )


def channels_with_retention() -> QuerySet[Channel]:
    return Channel.objects.filter(retention_s__isnull=False, retention_s__gt=0)
