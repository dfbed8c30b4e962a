"""The groups page's stored trend (``dlq.capture.trends``): the hourly counts per failure group
always equal a direct count of the dead-letter table, and the page shows them."""

from __future__ import annotations

import datetime as dt
import importlib
import re
from collections import Counter
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.utils import timezone

from dlq.capture.retention import do_purge_expired
from dlq.capture.trends import hour_of, windows
from dlq.models import DeadLetter, GroupHour, Status
from dlq.tasks import purge_expired_task
from tests.conftest import client_for, make_channel
from tests.dlq.conftest import letter, store, update_entries

pytestmark = pytest.mark.django_db


def _failing(error: str, hours_back: int, now: dt.datetime) -> Any:
    """A letter dead-lettered 10 minutes into the hour ``hours_back`` hours before ``now``'s
    (so which window it falls in does not depend on the minute the test runs)."""
    at = hour_of(now) + dt.timedelta(minutes=10) - dt.timedelta(hours=hours_back)
    return letter(
        headers={"x-exception-class": error, "x-exception-message": f"{error} {hours_back} h"},
        dead_lettered_at=at.timestamp(),
    )


def _direct(now: dt.datetime) -> Counter[tuple[int, dt.datetime]]:
    """Entries per (group, hour) counted from the dead-letter table, both windows."""
    since = windows(now)[1]
    counted: Counter[tuple[int, dt.datetime]] = Counter()
    for group_id, at in DeadLetter.objects.filter(
        group__isnull=False, dead_lettered_at__gte=since
    ).values_list("group_id", "dead_lettered_at"):
        counted[(group_id, hour_of(at))] += 1
    return counted


def _stored() -> Counter[tuple[int, dt.datetime]]:
    return Counter(
        {(g, h): n for g, h, n in GroupHour.objects.values_list("group_id", "hour", "count")}
    )


def _store_mixed(channel: Any, now: dt.datetime) -> list[DeadLetter]:
    """Two groups, entries spread over both windows, one older than both, one in the future
    (a broker clock ahead of ours), several batches and duplicates of stored entries.
    NotFound: 5 in the last 24 h, 2 in the 24 h before; Timeout: 4 and 1."""
    first = [_failing("NotFound", h, now) for h in (0, 0, 1, 5, 23, 24, 47, 80)]
    second = [_failing("Timeout", h, now) for h in (0, 2, 2, 25, -1)]
    stored = store(channel, *first[:5], *second)
    stored += store(channel, *first[5:])
    store(channel, first[0], second[1])  # redelivered duplicates: not inserted, not counted
    return stored


def test_stored_hours_match_a_direct_count_after_ingest() -> None:
    now = timezone.now()
    entries = _store_mixed(make_channel(), now)
    assert len(entries) == 13 and len({e.group_id for e in entries}) == 2
    direct = _direct(now)
    assert sum(direct.values()) == 12  # the entry 80 h ago is outside both windows
    assert _stored() == direct


def test_stored_hours_do_not_change_with_status_or_purge() -> None:
    """The trend counts entries dead-lettered per hour: a discard, a replay or retention's
    purge changes none of them, and a direct count agrees before and after."""
    now = timezone.now()
    channel = make_channel(retention_s=60)
    entries = _store_mixed(channel, now)
    before = _stored()
    ids = [e.pk for e in entries]
    update_entries(DeadLetter.objects.filter(pk__in=ids[:4]), status=Status.DISCARDED)
    update_entries(DeadLetter.objects.filter(pk__in=ids[4:7]), status=Status.REPLAYED)
    DeadLetter.objects.update(ingested_at=now - dt.timedelta(hours=1))
    assert do_purge_expired(timezone.now()).purged == 7
    assert DeadLetter.objects.filter(purged_at__isnull=False).count() == 7
    assert _stored() == before == _direct(now)


def test_discarding_through_the_page_keeps_the_trend(oncall: User) -> None:
    now = timezone.now()
    entries = _store_mixed(make_channel(), now)
    response = client_for(oncall).post(
        "/dead-letters/discard/",
        {"id": str(entries[0].pk), "action_reason": "known bad", "request_key": "t1"},
    )
    assert response.status_code == 302
    assert DeadLetter.objects.get(pk=entries[0].pk).status == Status.DISCARDED
    assert _stored() == _direct(now)


def test_prune_drops_only_hours_before_both_windows() -> None:
    now = timezone.now()
    _store_mixed(make_channel(), now)
    later = now + dt.timedelta(hours=20)
    kept = {key: n for key, n in _stored().items() if key[1] >= windows(later)[1]}
    assert len(kept) < len(_stored())  # some hours fall out 20 h later
    from dlq.capture import trends

    trends.prune(later)
    assert _stored() == Counter(kept) == _direct(later)
    purge_expired_task()  # the hourly task prunes too (now: nothing more to drop)
    assert _stored() == Counter(kept)


def test_the_migration_fills_the_hours_from_stored_entries() -> None:
    now = timezone.now()
    _store_mixed(make_channel(), now)
    expected = _stored()
    GroupHour.objects.all().delete()
    migration = importlib.import_module("dlq.migrations.0011_group_trend_hours")
    migration.fill_hours(apps, None)
    assert _stored() == expected == _direct(now)


def test_groups_page_shows_the_stored_trend_of_each_group(
    viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = timezone.now()
    _store_mixed(make_channel(), now)
    # The page's windows are the ones the entries were placed in, even across an hour.
    monkeypatch.setattr(timezone, "now", lambda: now)
    recent, previous = windows(now)
    html = client_for(viewer).get("/dead-letters/").content.decode()
    shown = []
    for group_id in DeadLetter.objects.order_by().values_list("group_id", flat=True).distinct():
        entries = DeadLetter.objects.filter(group_id=group_id)
        n_recent = entries.filter(dead_lettered_at__gte=recent).count()
        n_previous = entries.filter(
            dead_lettered_at__gte=previous, dead_lettered_at__lt=recent
        ).count()
        arrow, words = (
            ("▲", "up from")
            if n_recent > n_previous
            else (("▼", "down from") if n_recent < n_previous else ("=", "same as"))
        )
        assert (
            f'{n_recent} <span aria-hidden="true">{arrow}</span></span>'
            f' <span class="sub">{words} {n_previous} the day before</span>'
        ) in html
        shown.append((n_recent, n_previous))
    assert sorted(shown) == [(4, 1), (5, 2)]


def test_channel_filters_list_every_channel_and_mark_the_chosen_one(viewer: User) -> None:
    make_channel()
    make_channel(slug="billing", address="billing", dlq_address="billing.dlq")
    client = client_for(viewer)
    for url, chosen in (
        ("/dead-letters/?channel=billing", "billing"),
        ("/dead-letters/list/?channel=billing", "billing"),
        ("/dead-letters/", ""),
    ):
        html = client.get(url).content.decode()
        select = html[html.index('<select name="channel"') : html.index("</select>")]
        options = re.findall(r'<option value="([^"]*)"( selected)?>', select)
        assert sorted(v for v, _ in options) == ["", "billing", "orders"]
        assert [v for v, s in options if s] == ([chosen] if chosen else [])
    # The htmx partial of either page leaves the form (and its select) alone.
    partial = client.get("/dead-letters/list/", headers={"HX-Request": "true"}).content.decode()
    assert '<select name="channel"' not in partial


def test_past_the_select_limit_the_channel_filter_is_a_search_field(
    viewer: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many channels: no select of all of them (the page would grow with the table), a field
    holding the chosen slug, escaped; it still filters."""
    import dashboard.html

    make_channel()
    make_channel(slug="billing", address="billing", dlq_address="billing.dlq")
    make_channel(slug="search", address="search", dlq_address="search.dlq")
    monkeypatch.setattr(dashboard.html, "CHANNEL_SELECT_MAX", 2)
    client = client_for(viewer)
    for url in ("/dead-letters/", "/dead-letters/list/"):
        html = client.get(url + "?channel=billing").content.decode()
        assert '<select name="channel"' not in html
        assert '<input type="search" name="channel" value="billing"' in html
        assert "over 2 channels" in html
        hostile = client.get(url, {"channel": '"><script>alert(1)</script>'}).content.decode()
        assert "<script>alert(1)" not in hostile
        assert 'value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in hostile
        assert "No channel has the slug “&quot;&gt;&lt;script&gt;" in hostile
        assert "No channel has the slug" not in html  # billing exists (it has no entries)
    monkeypatch.setattr(dashboard.html, "CHANNEL_SELECT_MAX", 3)
    assert '<select name="channel"' in client.get("/dead-letters/").content.decode()


def test_group_rows_link_each_channel_as_reverse_does() -> None:
    from django.urls import reverse

    from dashboard.html import escape
    from dlq.triage.groups_html import _Urls

    urls = _Urls()
    for slug in ("orders", "billing-eu_2", "slug", "a", "X-1"):
        assert urls.channel(slug) == escape(reverse("channel_detail", args=[slug]))
    assert urls.channel('"><x') == "/channels/%22%3E%3Cx/"
