"""The text filter searches a narrow side table (SearchText) filled after the ingest commit."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from brokers.base import Address
from dlq.capture import ingest, search
from dlq.capture.retention import do_purge_expired
from dlq.models import DeadLetter, SearchText, Status
from dlq.triage import filters, views
from dlq.triage.filters import EntryFilter
from tests.conftest import client_for, make_channel
from tests.dlq.conftest import FakeAdapter, letter, store, update_entries

pytestmark = pytest.mark.django_db


def _found(q: str) -> set[int]:
    f = EntryFilter.from_params({"q": q})
    return set(f.apply(DeadLetter.objects.all()).values_list("id", flat=True))


def test_search_finds_any_substring_of_body_and_headers_through_the_side_table(
    viewer: User,
) -> None:
    channel = make_channel()
    [entry] = store(
        channel,
        letter(b'{"customer": "Zanzibar-Quokka"}', headers={"x-tenant": "Tenant-Wombat-7"}),
    )
    [other] = store(channel, letter(b'{"customer": "someone else"}'))
    assert SearchText.objects.filter(entry=entry).exists()
    for q in ("zanzibar", "ar-quok", "QUOKKA", "wombat-7", "x-tenant: tenant", "tomer"):
        assert entry.pk in _found(q), q
    assert _found("wombat") == {entry.pk} and other.pk in _found("someone")
    page = client_for(viewer).get("/dead-letters/list/?q=quokka").content.decode()
    assert f'href="/dead-letters/{entry.pk}/"' in page
    assert f'href="/dead-letters/{other.pk}/"' not in page


def test_a_crash_between_commit_and_indexing_is_caught_up() -> None:
    channel = make_channel()
    ids: list[int] = []
    ingest.store_batch(
        channel, [letter(b'{"note": "caught-up-later"}')], "dlq", Address("dlq"), ids
    )
    # Committed and acknowledged, but the process died before index_entries ran.
    assert _found("caught-up") == set()
    assert search.index_missing() == 1
    assert _found("caught-up") == set(ids)
    assert search.index_missing() == 0  # idempotent


def test_purged_entries_leave_the_search_index() -> None:
    channel = make_channel(retention_s=3600)
    [entry] = store(channel, letter(b'{"secret": "purge-me-please"}'))
    update_entries(
        DeadLetter.objects.filter(pk=entry.pk),
        status=Status.DISCARDED,
        ingested_at=timezone.now() - dt.timedelta(hours=2),
    )
    assert _found("purge-me") == {entry.pk}
    assert do_purge_expired(timezone.now()).purged == 1
    assert _found("purge-me") == set() and not SearchText.objects.filter(entry=entry).exists()


def test_the_trigram_index_lives_on_the_side_table_not_the_dead_letters() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the trigram GIN index exists on PostgreSQL only")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes "
            "WHERE tablename IN ('dlq_deadletter', 'dlq_searchtext')"
        )
        indexes = cursor.fetchall()
    gin = [(t, n) for t, n, d in indexes if "gin_trgm_ops" in d]
    assert gin == [("dlq_searchtext", "dlq_search_trgm")]
    entry_defs = [d for t, _, d in indexes if t == "dlq_deadletter"]
    # The composite (channel, id) and (group, id) indexes cover these; no prefix search of keys.
    assert not any(d.endswith("(channel_id)") or d.endswith("(group_id)") for d in entry_defs)
    assert not any("varchar_pattern_ops" in d for d in entry_defs)
    # The text filter's plan uses the side table's index.
    f = EntryFilter.from_params({"q": "quokka"})
    sql, params = f.apply(DeadLetter.objects.all()).query.sql_with_params()
    assert "dlq_searchtext" in sql


@pytest.mark.django_db(transaction=True)
def test_ingest_indexes_on_its_own_thread_after_the_ack(fake_adapter: FakeAdapter) -> None:
    """The indexer's connection sees the committed batches (a real commit here) and indexes
    them while the loop goes on; everything ingested is searchable when the run returns."""
    channel = make_channel()
    fake_adapter.queues["orders.dlq"] = [letter(b'{"order": "needle-%d"}' % i) for i in range(1100)]
    result = ingest.ingest_channel(channel)
    assert result.inserted == 1100 and len(fake_adapter.acked) == 1100
    assert SearchText.objects.count() == 1100
    assert len(_found("needle-1")) == 211  # needle-1, -10…-19, -100…-199, -1000…-1099


def test_a_text_search_counts_to_its_own_lower_cap(
    viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filters, "SEARCH_COUNT_CAP", 3)
    monkeypatch.setattr(filters, "COUNT_CAP", 6)
    monkeypatch.setattr(views, "PAGE_SIZE", 1)
    channel = make_channel()
    store(channel, *[letter(b'{"note": "capybara %d"}' % i) for i in range(5)])
    store(channel, *[letter(b'{"note": "other"}') for _ in range(2)])
    client = client_for(viewer)
    found = client.get("/dead-letters/list/?q=capybara").content.decode()
    assert "more than 3 matching entries" in found
    # Below its cap a search is counted exactly, and a filter without text counts to 6.
    assert "2 matching entries" in client.get("/dead-letters/list/?q=other").content.decode()
    listed = client.get(f"/dead-letters/list/?channel={channel.slug}").content.decode()
    assert "more than 6 matching entries" in listed
