"""An entry's status lives in its narrow state row (issue 24, migration 0015): the database makes
the row with every insert, whoever inserts, keeps the columns it copies in step, and the row
goes with its entry. No freeze, replay or discard rewrites the dead-letter row."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from dlq.models import (
    DeadLetter,
    EntryState,
    FailureGroup,
    ItemStatus,
    ReplayItem,
    Source,
    Status,
    count_unresolved,
    set_status,
)
from dlq.plans import relay
from dlq.plans.actions import do_cancel_plan
from tests.conftest import client_for, make_channel, migrate_to
from tests.dlq import replay_helpers
from tests.dlq.conftest import letter, store
from tests.dlq.replay_helpers import RecordingAdapter, plan_for

pytestmark = pytest.mark.django_db
publisher = replay_helpers.publisher  # the fixture

COPIED = ("channel_id", "source", "group_id", "ingested_at", "dead_lettered_at")


def _copied(entry: DeadLetter) -> tuple[Any, ...]:
    return tuple(getattr(entry, c) for c in COPIED)


def _state(pk: int) -> EntryState:
    return EntryState.objects.get(pk=pk)


def test_every_insert_makes_the_state_row_whoever_inserts() -> None:
    channel = make_channel()
    [ingested] = store(channel, letter(), source=Source.POISON)  # ingest's COPY on PostgreSQL
    by_orm = DeadLetter.objects.create(
        channel=channel, dedupe_key="orm:1", body=b"{}", body_sha256="0" * 64, size=2,
        dead_lettered_at=timezone.now() - dt.timedelta(hours=1),
    )  # fmt: skip
    for entry in (ingested, by_orm):
        entry.refresh_from_db()
        state = _state(entry.pk)
        assert state.status == Status.NEW
        assert tuple(getattr(state, c) for c in COPIED) == _copied(entry)
        assert entry.status == Status.NEW  # the model reads it through the row
    assert _state(ingested.pk).source == Source.POISON and ingested.group_id is not None


def test_the_copied_columns_follow_the_entry_and_the_row_goes_with_it() -> None:
    channel = make_channel()
    first, second = store(channel, letter(b'{"n": 1}'), letter(b'{"n": 2}'))
    old = timezone.now() - dt.timedelta(days=3)
    DeadLetter.objects.filter(pk=first.pk).update(ingested_at=old, source=Source.POISON)
    DeadLetter.objects.filter(pk=first.pk).update(purged_at=timezone.now(), body=None)
    first.refresh_from_db()
    assert tuple(getattr(_state(first.pk), c) for c in COPIED) == _copied(first)
    # A deleted group: the entries' and the states' links are cleared alike.
    FailureGroup.objects.filter(pk=second.group_id).delete()
    assert _state(second.pk).group_id is None
    assert DeadLetter.objects.get(pk=second.pk).group_id is None
    DeadLetter.objects.filter(pk=first.pk).delete()
    assert not EntryState.objects.filter(pk=first.pk).exists()
    assert EntryState.objects.filter(pk=second.pk).exists()


def test_status_reads_filters_and_open_counts_use_the_state_rows(oncall: User) -> None:
    channel = make_channel()
    entries = store(channel, *[letter(b'{"n": %d}' % i) for i in range(4)])
    set_status([entries[0].pk], Status.DISCARDED)
    set_status([entries[1].pk], Status.FAILED)
    assert set_status([entries[2].pk], Status.NEW, only=~_replaying()) == 1
    assert set_status([entries[3].pk], Status.REPLAYED, only=_replaying()) == 0

    client = client_for(oncall)
    html = client.get("/dead-letters/list/?status=failed").content.decode()
    assert f"/dead-letters/{entries[1].pk}/" in html
    assert f"/dead-letters/{entries[0].pk}/" not in html
    # A keyset page under a status filter (the state rows' side is bounded too).
    deep = client.get(f"/dead-letters/list/?status=new&after={entries[3].pk}").content.decode()
    assert f"/dead-letters/{entries[2].pk}/" in deep
    assert f"/dead-letters/{entries[3].pk}/" not in deep
    assert f"/dead-letters/{entries[1].pk}/" not in deep  # failed
    api_deep = client.get(f"/api/dead-letters/?status=new&after={entries[3].pk}").json()
    assert [e["id"] for e in api_deep["results"]] == [entries[2].pk]
    discarded = client.get("/api/dead-letters/?status=discarded").json()["results"]
    assert [(e["id"], e["status"]) for e in discarded] == [(entries[0].pk, "discarded")]
    listed = client.get("/api/dead-letters/?status=new").json()["results"]
    assert {e["id"] for e in listed} == {entries[2].pk, entries[3].pk}
    # The admin's status column and filter read the state rows too.
    root = User.objects.create_superuser("root-state", password="x")
    admin = client_for(root)
    listing = admin.get("/admin/dlq/deadletter/?state__status__exact=failed").content.decode()
    assert f"/admin/dlq/deadletter/{entries[1].pk}/change/" in listing
    assert f"/admin/dlq/deadletter/{entries[0].pk}/change/" not in listing
    assert "Replay failed" in listing
    unresolved = count_unresolved([channel.pk], timezone.now())[channel.pk]
    assert unresolved.dlq == 3  # the discarded one is resolved; failed is still open


def _replaying() -> Any:
    from django.db.models import Q

    return Q(status=Status.REPLAYING)


def _row_versions(ids: list[int]) -> dict[int, tuple[str, str, str]]:
    """Each dead-letter row's physical version: where it lies, the transaction that wrote it,
    and any that locked or deleted it since."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, ctid::text, xmin::text, xmax::text FROM dlq_deadletter WHERE id = ANY(%s)",
            [ids],
        )
        return {row[0]: tuple(row[1:]) for row in cursor.fetchall()}


@pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="row versions (xmin, ctid) are PostgreSQL's"
)
@pytest.mark.django_db(transaction=True)
def test_no_freeze_replay_cancel_or_discard_writes_or_locks_the_dead_letter_row(
    oncall: User, publisher: RecordingAdapter
) -> None:
    """With real commits: a deferred check (the items' foreign key to the entries was one,
    until migration 0018) runs at the commit, which a test transaction never reaches."""
    channel = make_channel()
    entries = store(channel, *[letter(b'{"n": %d}' % i) for i in range(6)])
    ids = [e.pk for e in entries]
    before = _row_versions(ids)
    samples = set(FailureGroup.objects.values_list("sample_id", flat=True))
    # Only a group's sample is locked (its foreign key's check, once per group).
    assert {pk for pk, (_c, _x, xmax) in before.items() if xmax != "0"} <= samples

    replayed = plan_for(entries[:2], oncall)  # freeze: items and REPLAYING
    relay.run_plan(replayed.pk)  # claim, publish, REPLAYED
    cancelled = plan_for(entries[2:4], oncall)
    do_cancel_plan(cancelled.pk, actor=_actor(oncall), reason="changed my mind")
    discarded = plan_for(entries[4:], oncall, kind="discard")
    relay.run_plan(discarded.pk)

    assert [_state(pk).status for pk in ids] == [
        Status.REPLAYED, Status.REPLAYED, Status.NEW, Status.NEW,
        Status.DISCARDED, Status.DISCARDED,
    ]  # fmt: skip
    assert ReplayItem.objects.filter(plan=replayed, status=ItemStatus.CONFIRMED).count() == 2
    assert _row_versions(ids) == before


def _actor(user: User) -> Any:
    from audit.actions import Actor

    return Actor.for_user(user)


MIGRATION = "0015_entry_state"
BEFORE = [("dlq", "0014_replay_outcome_records")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_migration_moves_every_status_and_back(back_to_latest: None) -> None:
    """Forwards copies every entry's status into its state row (and the insert trigger covers
    what comes after); backwards puts the column back, filled from the state rows."""
    channel = make_channel()
    entries = store(channel, *[letter(b'{"n": %d}' % i) for i in range(5)])
    statuses = [Status.NEW, Status.REPLAYING, Status.REPLAYED, Status.FAILED, Status.DISCARDED]
    for entry, status in zip(entries, statuses, strict=True):
        set_status([entry.pk], status)

    old = migrate_to(BEFORE).loader.project_state(BEFORE).apps.get_model("dlq", "DeadLetter")
    assert dict(old.objects.values_list("pk", "status")) == {
        e.pk: s for e, s in zip(entries, statuses, strict=True)
    }
    old.objects.filter(pk=entries[0].pk).update(status=Status.FAILED)  # written by old code

    migrate_to([("dlq", MIGRATION)])

    assert dict(EntryState.objects.values_list("pk", "status")) == {
        entries[0].pk: Status.FAILED,
        **{e.pk: s for e, s in zip(entries[1:], statuses[1:], strict=True)},
    }
    for entry in entries:
        entry.refresh_from_db()
        assert tuple(getattr(_state(entry.pk), c) for c in COPIED) == _copied(entry)
    [later] = store(channel, letter(b'{"n": "later"}'))
    assert _state(later.pk).status == Status.NEW


def _item_constraints() -> dict[str, bool]:
    """The replay items' foreign keys to the dead letters: name → validated (the parent
    constraint and, for a partitioned table, one inherited copy per partition)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, convalidated, conparentid = 0 FROM pg_constraint "
            "WHERE conrelid = 'dlq_replayitem'::regclass "
            "AND confrelid = 'dlq_deadletter'::regclass AND contype = 'f'"
        )
        return {name: valid for name, valid, parent in cursor.fetchall() if parent}


@pytest.mark.slow
@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="the constraint is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_migration_0018_drops_the_items_key_to_the_entries_and_back(
    oncall: User, back_to_latest: None
) -> None:
    """Forwards drops only the parent constraint (PostgreSQL refuses to drop a partition's
    inherited copy, which Django's own ``AlterField`` tries); backwards adds it again and
    validates it against the items that exist. A plan's items survive both ways."""
    channel = make_channel()
    entries = store(channel, *[letter(b'{"n": %d}' % i) for i in range(3)])
    plan = plan_for(entries, oncall)
    assert _item_constraints() == {}

    migrate_to([("dlq", "0017_item_plan_index")])
    assert list(_item_constraints().values()) == [True]
    assert ReplayItem.objects.filter(plan=plan).count() == 3

    migrate_to([("dlq", "0018_item_entry_constraint")])
    assert _item_constraints() == {}
    assert sorted(ReplayItem.objects.filter(plan=plan).values_list("entry_id", flat=True)) == [
        e.pk for e in entries
    ]
