"""The partitioned dead-letter table (PostgreSQL) and retention by whole partitions."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit.models import AuditEvent
from dlq.capture import partitions
from dlq.capture.retention import do_purge_expired
from dlq.models import (
    DeadLetter,
    DeadLetterKey,
    EntryState,
    FailureGroup,
    ReplayItem,
    ReplayPlan,
    SearchText,
    Status,
)
from tests.conftest import make_channel
from tests.dlq.conftest import letter, store, update_entries

pytestmark = pytest.mark.django_db

SIZE = 5
OLD = dt.timedelta(days=2)


def test_partitioned_on_postgresql_plain_on_sqlite() -> None:
    assert partitions.is_partitioned() == (connection.vendor == "postgresql")
    if connection.vendor != "postgresql":
        # Nothing to manage: the helpers are no-ops, retention is row by row only.
        assert partitions.ensure_partitions() == []
        assert partitions.drop_expired_partitions(timezone.now()) == []
        channel = make_channel(retention_s=60)
        first = store(channel, letter())[0]
        with pytest.raises(IntegrityError), transaction.atomic():
            DeadLetter.objects.create(
                **{f: getattr(first, f) for f in _copied_fields()}, dedupe_key=first.dedupe_key
            )


@pytest.fixture
def small(settings: Any) -> Iterator[None]:
    """Partitions of ``SIZE`` ids starting just above the sequence (inside the test's
    transaction: the DDL rolls back with it)."""
    if connection.vendor != "postgresql":
        pytest.skip("the dead-letter table is partitioned on PostgreSQL only")
    assert not DeadLetter.objects.exists()
    settings.DLO_DLQ_PARTITION_SIZE = SIZE
    with connection.cursor() as cursor:
        for part in partitions.partitions():
            cursor.execute(f"ALTER TABLE dlq_deadletter DETACH PARTITION {part.name}")
            cursor.execute(f"DROP TABLE {part.name}")
        lower = (partitions.sequence_high() // SIZE + 1) * SIZE
        cursor.execute(f"SELECT setval('{partitions.SEQUENCE}', {lower - 1})")
        cursor.execute(partitions.create_sql(f"dlq_deadletter_{lower}", lower, lower + SIZE))
    yield


def _copied_fields() -> list[str]:
    return ["channel_id", "body_sha256", "size", "dead_lettered_at"]


def _names() -> list[str]:
    return [p.name for p in partitions.partitions()]


def _fill(channel: Any, n: int, **overrides: Any) -> list[DeadLetter]:
    return store(channel, *[letter(b'{"n": %d}' % i, **overrides) for i in range(n)])


def test_ensure_creates_partitions_ahead_of_the_ids(small: None) -> None:
    first = partitions.partitions()
    created = partitions.ensure_partitions()
    # Partitions for the next AHEAD × SIZE ids exist.
    assert created[-1].upper > partitions.sequence_high() + partitions.AHEAD * SIZE
    assert [p.lower for p in created] == [first[-1].upper + SIZE * i for i in range(len(created))]
    assert partitions.ensure_partitions() == []  # idempotent
    channel = make_channel()
    rows = _fill(channel, SIZE * 2)  # fills the first two partitions
    new = partitions.ensure_partitions()
    assert new and new[0].lower == created[-1].upper
    per_partition = {}
    with connection.cursor() as cursor:
        for part in partitions.partitions():
            cursor.execute(f"SELECT count(*) FROM {part.name}")
            per_partition[part.name] = cursor.fetchone()[0]
    assert sum(per_partition.values()) == len(rows) == SIZE * 2
    assert list(per_partition.values())[:2] == [SIZE, SIZE]


def test_an_insert_past_every_partition_lands_in_default_and_ensure_skips_it(small: None) -> None:
    channel = make_channel()
    high = partitions.partitions()[-1].upper
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT setval('{partitions.SEQUENCE}', {high + 3})")
    stray = _fill(channel, 1)[0]  # no partition holds this id: the DEFAULT one does
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {partitions.DEFAULT}")
        assert cursor.fetchall() == [(stray.pk,)]
    created = partitions.ensure_partitions()
    assert created[0].lower == stray.pk + 1  # never overlapping a row the default caught
    assert _fill(channel, 1)[0].pk == stray.pk + 1  # and the next id has its partition


def test_dedupe_holds_across_partitions(small: None) -> None:
    partitions.ensure_partitions()
    channel = make_channel()
    hostile = letter(b"\x00\xff'); DROP TABLE dlq_deadletter; --", dedupe_key="k'\"\\; --\u202e")
    first = store(channel, hostile)[0]
    _fill(channel, SIZE * 2)  # later ids live in later partitions
    again = store(channel, hostile)
    assert [e.pk for e in again] == [first.pk]  # the stored copy; nothing new
    assert DeadLetter.objects.filter(dedupe_key=hostile.dedupe_key).count() == 1
    assert DeadLetterKey.objects.filter(dedupe_key=hostile.dedupe_key).exists()
    # Any other writer is held to the same key (the trigger), with the usual error.
    with pytest.raises(IntegrityError), transaction.atomic():
        DeadLetter.objects.create(
            **{f: getattr(first, f) for f in _copied_fields()}, dedupe_key=first.dedupe_key
        )
    # Keys follow deletes: an entry gone for good can be stored again.
    DeadLetter.objects.filter(pk=first.pk).delete()
    assert not DeadLetterKey.objects.filter(dedupe_key=hostile.dedupe_key).exists()
    assert len(store(channel, hostile)) == 1


def _expire(rows: list[DeadLetter], status: str = Status.DISCARDED) -> None:
    update_entries(
        DeadLetter.objects.filter(pk__in=[e.pk for e in rows]),
        status=status,
        ingested_at=timezone.now() - OLD,
    )


def test_retention_drops_a_partition_whose_every_entry_is_past_policy(small: None) -> None:
    partitions.ensure_partitions()
    channel = make_channel(retention_s=3600)
    old = _fill(channel, SIZE)  # exactly the first partition
    newer = _fill(channel, 2)
    _expire(old[:3], Status.DISCARDED)
    _expire(old[3:], Status.REPLAYED)
    doomed = partitions.partitions()[0]
    # Dependants: a child in a later partition, a group sample, a replay item, search text.
    DeadLetter.objects.filter(pk=newer[0].pk).update(parent_id=old[0].pk)
    FailureGroup.objects.filter(pk=old[0].group_id).update(sample_id=old[1].pk)
    plan = ReplayPlan.objects.create(channel=channel, status="done", reason="r", total=1)
    ReplayItem.objects.create(plan=plan, entry_id=old[2].pk, position=0)
    assert SearchText.objects.filter(entry_id__in=[e.pk for e in old]).count() == SIZE

    result = do_purge_expired(timezone.now())

    assert (result.partitions_dropped, result.entries_dropped) == (1, SIZE)
    assert doomed.name not in _names()
    assert not DeadLetter.objects.filter(pk__in=[e.pk for e in old]).exists()
    assert not SearchText.objects.filter(entry_id__in=[e.pk for e in old]).exists()
    assert not EntryState.objects.filter(entry_id__in=[e.pk for e in old]).exists()
    assert EntryState.objects.filter(entry_id__in=[e.pk for e in newer]).count() == 2
    assert not DeadLetterKey.objects.filter(dedupe_key__in=[e.dedupe_key for e in old]).exists()
    assert not ReplayItem.objects.filter(plan=plan).exists()
    assert DeadLetter.objects.get(pk=newer[0].pk).parent_id is None
    assert FailureGroup.objects.get(pk=old[0].group_id).sample_id is None
    assert DeadLetter.objects.filter(pk__in=[e.pk for e in newer]).count() == 2
    event = AuditEvent.objects.get(action="dlq.partition_drop")
    assert event.reason and event.target_repr.startswith(doomed.name)
    assert event.after["rows"] == SIZE and event.after["ids"] == [doomed.lower, doomed.upper]
    assert event.after["channel_ids"] == [channel.pk]
    assert partitions.detached() == []  # emptied, then dropped after the commit
    assert do_purge_expired(timezone.now()).partitions_dropped == 0  # idempotent


def test_an_emptied_partition_left_by_an_earlier_run_is_dropped_by_the_next(small: None) -> None:
    """The drop empties the detached table in its transaction and drops it after the commit;
    when that DROP cannot get its locks, the empty table waits for the next run. A detached
    table that still holds rows is never dropped."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE dlq_deadletter_900000 (LIKE dlq_deadletter)")
        cursor.execute("CREATE TABLE dlq_deadletter_800000 AS SELECT 1 AS id")
    assert partitions.detached() == ["dlq_deadletter_800000", "dlq_deadletter_900000"]

    partitions.drop_expired_partitions(timezone.now())

    assert partitions.detached() == ["dlq_deadletter_800000"]


@pytest.mark.parametrize("keeper", ["unresolved", "young", "no retention", "open"])
def test_a_partition_with_one_kept_entry_stays_and_falls_back_to_rows(
    small: None, keeper: str
) -> None:
    partitions.ensure_partitions()
    channel = make_channel(retention_s=3600)
    kept_elsewhere = make_channel(
        slug="ledger", name="Ledger", address="ledger", dlq_address="ledger.dlq", retention_s=None
    )
    old = _fill(channel, SIZE if keeper != "open" else SIZE - 1)
    _expire(old)
    if keeper == "unresolved":
        update_entries(DeadLetter.objects.filter(pk=old[-1].pk), status=Status.NEW)
    elif keeper == "young":
        DeadLetter.objects.filter(pk=old[-1].pk).update(ingested_at=timezone.now())
    elif keeper == "no retention":
        DeadLetter.objects.filter(pk=old[-1].pk).update(channel=kept_elsewhere)
    before = _names()

    result = do_purge_expired(timezone.now())

    assert result.partitions_dropped == 0 and _names() == before
    assert not AuditEvent.objects.filter(action="dlq.partition_drop").exists()
    assert DeadLetter.objects.filter(pk__in=[e.pk for e in old]).count() == len(old)
    # The row-by-row purge still tombstones what the policy lets go.
    expected = len(old) - (0 if keeper == "open" else 1)
    assert result.purged == expected
    assert DeadLetter.objects.filter(purged_at__isnull=False).count() == expected


def test_tombstoned_partitions_go_too(small: None) -> None:
    """Row-by-row purge first (tombstones), a later run drops the partition of tombstones."""
    partitions.ensure_partitions()
    channel = make_channel(retention_s=3600)
    old = _fill(channel, SIZE - 1)  # the partition is still open: rows only
    _expire(old)
    assert do_purge_expired(timezone.now()).purged == SIZE - 1
    with connection.cursor() as cursor:  # the ids move on past it: closed
        cursor.execute(f"SELECT setval('{partitions.SEQUENCE}', {old[0].pk + SIZE})")
    result = do_purge_expired(timezone.now())
    assert (result.partitions_dropped, result.entries_dropped, result.purged) == (1, SIZE - 1, 0)
    event = AuditEvent.objects.get(action="dlq.partition_drop")
    assert event.after["already_tombstoned"] == SIZE - 1


def test_the_unfiltered_total_is_the_partitions_estimate(small: None) -> None:
    """Autovacuum analyzes partitions, never the partitioned parent: the list's free total
    adds up the partitions' estimates instead of reading the parent's (never set)."""
    from dlq.triage.filters import _ESTIMATE_SQL, EntryFilter, approximate_total

    partitions.ensure_partitions()
    _fill(make_channel(), SIZE * 2 + 1)  # two partitions and one row in the default
    with connection.cursor() as cursor:
        for name in [*_names(), partitions.DEFAULT]:
            cursor.execute(f"ANALYZE {name}")
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = 'dlq_deadletter'::regclass")
        assert cursor.fetchone()[0] < 0  # the parent itself knows nothing
        cursor.execute(_ESTIMATE_SQL, ["dlq_deadletter"])
        assert cursor.fetchone()[0] == SIZE * 2 + 1
    # Below the cap the page counts instead (exact, and cheap).
    total = approximate_total(DeadLetter.objects.all(), EntryFilter())
    assert (total.value, total.exact) == (SIZE * 2 + 1, True)
