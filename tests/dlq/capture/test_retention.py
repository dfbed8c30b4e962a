from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from dlq.capture.retention import do_purge_expired
from dlq.models import DeadLetter, Status
from dlq.tasks import purge_expired_task
from tests.conftest import make_channel
from tests.dlq.conftest import letter, store, update_entries

pytestmark = pytest.mark.django_db


def test_purge_leaves_tombstones_of_old_resolved_entries_only() -> None:
    channel = make_channel(retention_s=3600)
    entries = store(channel, *[letter(b'{"n": %d}' % i) for i in range(4)])
    old = timezone.now() - dt.timedelta(hours=2)
    DeadLetter.objects.filter(pk__in=[e.pk for e in entries]).update(ingested_at=old)
    update_entries(DeadLetter.objects.filter(pk=entries[0].pk), status=Status.DISCARDED)
    update_entries(DeadLetter.objects.filter(pk=entries[1].pk), status=Status.REPLAYED)
    # entries[2] stays NEW (unresolved: never purged); entries[3] is resolved but recent.
    update_entries(
        DeadLetter.objects.filter(pk=entries[3].pk),
        status=Status.DISCARDED,
        ingested_at=timezone.now(),
    )
    result = do_purge_expired(timezone.now())
    assert result.purged == 2
    purged = DeadLetter.objects.filter(purged_at__isnull=False).order_by("id")
    assert [e.pk for e in purged] == [entries[0].pk, entries[1].pk]
    for tomb in purged:
        assert tomb.body is None and tomb.search_text == ""
        assert tomb.body_sha256 and tomb.size > 0 and tomb.dedupe_key  # the tombstone
    kept = DeadLetter.objects.filter(purged_at__isnull=True)
    assert all(e.body is not None for e in kept) and kept.count() == 2
    event = AuditEvent.objects.get(action="dlq.purge")
    assert event.after["purged"] == 2 and event.channel_slug == channel.slug
    assert do_purge_expired(timezone.now()).purged == 0  # idempotent


def test_purge_runs_in_bounded_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    from dlq.capture import retention

    monkeypatch.setattr(retention, "PURGE_BATCH", 3)
    channel = make_channel(retention_s=60)
    store(channel, *[letter(b'{"n": %d}' % i) for i in range(7)])
    update_entries(
        DeadLetter.objects.all(),
        status=Status.DISCARDED,
        ingested_at=timezone.now() - dt.timedelta(hours=1),
    )
    assert do_purge_expired(timezone.now(), max_batches=2).purged == 6
    assert AuditEvent.objects.filter(action="dlq.purge").count() == 2
    assert purge_expired_task() == 1


def test_channels_without_retention_keep_everything() -> None:
    channel = make_channel(retention_s=None)
    store(channel, letter())
    update_entries(
        DeadLetter.objects.all(),
        status=Status.DISCARDED,
        ingested_at=timezone.now() - dt.timedelta(days=3650),
    )
    assert do_purge_expired(timezone.now()).purged == 0
