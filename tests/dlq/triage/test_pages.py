from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditEvent
from dlq.models import DeadLetter, Status
from tests.conftest import client_for, make_channel
from tests.dlq.conftest import letter, store, update_entries

pytestmark = pytest.mark.django_db


def test_pages_need_the_viewer_role(outsider: User) -> None:
    channel = make_channel()
    [entry] = store(channel, letter())
    client = client_for(outsider)
    for url in ["/dead-letters/", "/dead-letters/list/", f"/dead-letters/{entry.pk}/"]:
        assert client.get(url).status_code == 403
    assert client.get(f"/dead-letters/{entry.pk}/raw/").status_code == 403


def test_pages_need_a_login() -> None:
    from django.test import Client

    response = Client().get("/dead-letters/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_groups_page_shows_counts_trend_and_links_to_a_filtered_list(viewer: User) -> None:
    channel = make_channel()
    now = timezone.now().timestamp()
    store(
        channel,
        *[
            letter(
                headers={"x-exception-class": "NotFound", "x-exception-message": f"order {i}"},
                dead_lettered_at=now - 3600,
            )
            for i in range(3)
        ],
        letter(
            headers={"x-exception-class": "NotFound", "x-exception-message": "order 9"},
            dead_lettered_at=now - 30 * 3600,
        ),
    )
    group = DeadLetter.objects.first().group  # type: ignore[union-attr]
    response = client_for(viewer).get("/dead-letters/")
    html = response.content.decode()
    assert response.status_code == 200
    assert "NotFound" in html and f"?group={group.pk}" in html
    # last 24 h vs the 24 h before, in words
    assert '3 <span aria-hidden="true">▲</span></span> <span class="sub">up from 1 the day' in html
    listing = client_for(viewer).get(f"/dead-letters/list/?group={group.pk}").content.decode()
    assert listing.count('href="/dead-letters/') >= 4


def test_list_filters_live_in_the_url(viewer: User) -> None:
    channel = make_channel()
    other = make_channel(slug="billing", address="billing", dlq_address="billing.dlq")
    store(channel, letter(b'{"customer": "Alice"}', headers={"Idempotency-Key": "k-a"}))
    store(other, letter(b'{"customer": "Bob"}', reason="expired"))
    client = client_for(viewer)

    def ids(query: str) -> set[int]:
        response = client.get("/dead-letters/list/?" + query, headers={"HX-Request": "true"})
        assert response.status_code == 200
        return {
            e.pk
            for e in DeadLetter.objects.all()
            if f'href="/dead-letters/{e.pk}/"' in response.content.decode()
        }

    alice = DeadLetter.objects.get(channel=channel).pk
    bob = DeadLetter.objects.get(channel=other).pk
    assert ids("") == {alice, bob}
    assert ids("channel=billing") == {bob}
    assert ids("reason=expired") == {bob}
    assert ids("q=ALICE") == {alice}
    assert ids("key=k-a") == {alice}
    assert ids("status=new&source=dlq") == {alice, bob}
    assert ids("status=replayed") == set()
    assert ids("since=2000-01-01&until=2000-01-02") == set()


def test_list_uses_keyset_pages_without_offset(viewer: User) -> None:
    channel = make_channel()
    store(channel, *[letter(b'{"n": %d}' % i) for i in range(120)])
    client = client_for(viewer)
    newest = DeadLetter.objects.order_by("-id")
    first = client.get("/dead-letters/list/").content.decode()
    assert f'href="/dead-letters/{newest[0].pk}/"' in first
    assert "120 matching entries" in first
    cursor = newest[49].pk
    assert f"after={cursor}" in first
    with CaptureQueriesContext(connection) as queries:
        second = client.get(f"/dead-letters/list/?after={cursor}").content.decode()
    sql = " ".join(q["sql"].upper() for q in queries.captured_queries)
    assert "OFFSET" not in sql and "COUNT(" not in sql
    assert f'href="/dead-letters/{newest[50].pk}/"' in second
    assert f'href="/dead-letters/{newest[49].pk}/"' not in second


def test_detail_shows_json_headers_timeline_and_audit_history(viewer: User) -> None:
    channel = make_channel()
    [entry] = store(
        channel,
        letter(
            b'{"order": {"id": 7}}',
            headers={"x-custom": "hello"},
            death_history=[
                {"queue": "orders", "reason": "rejected", "count": 2, "time": 1_700_000_000}
            ],
        ),
    )
    html = client_for(viewer).get(f"/dead-letters/{entry.pk}/").content.decode()
    assert "&quot;order&quot;: {" in html  # pretty-printed JSON, escaped
    assert "x-custom" in html and "hello" in html
    assert "rejected" in html and "2023-11-14" in html
    assert "No actions on this entry yet" in html


def test_large_body_is_truncated_with_a_download(viewer: User) -> None:
    channel = make_channel(redact_json_paths=[], redact_headers=[])
    body = b"x" * (200 * 1024)
    [entry] = store(channel, letter(body, properties={"content_type": "text/html"}))
    client = client_for(viewer)
    html = client.get(f"/dead-letters/{entry.pk}/").content.decode()
    assert "Truncated for display" in html and f"/dead-letters/{entry.pk}/raw/" in html
    response = client.get(f"/dead-letters/{entry.pk}/raw/")
    assert response.status_code == 200 and response.content == body
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"].startswith("attachment;")
    assert response["X-Content-Type-Options"] == "nosniff"


def test_redacted_for_viewers_and_revealed_with_an_audited_reason(
    viewer: User, compliance: User
) -> None:
    channel = make_channel(redact_json_paths=["$.card.number"], redact_headers=["Authorization"])
    [entry] = store(
        channel,
        letter(
            b'{"card": {"number": "4111111111111111"}, "amount": 5}',
            headers={"Authorization": "Bearer sekrit"},
        ),
    )
    url = f"/dead-letters/{entry.pk}/"
    for user in (viewer, compliance):
        html = client_for(user).get(url).content.decode()
        assert "4111111111111111" not in html and "sekrit" not in html
        assert "•••• redacted" in html and "amount" in html
    # The viewer may neither reveal nor download; the compliance reviewer must give a reason.
    assert client_for(viewer).post(url + "reveal/", {"reason": "x"}).status_code == 403
    assert client_for(viewer).get(url + "raw/").status_code == 403
    client = client_for(compliance)
    assert client.post(url + "reveal/", {"reason": ""}).status_code == 400
    response = client.post(url + "reveal/", {"reason": "INC-42 customer dispute"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "4111111111111111" in html and "sekrit" in html
    event = AuditEvent.objects.get(action="dlq.reveal", outcome="success")
    assert event.target_type == "dlq.deadletter" and event.target_id == str(entry.pk)
    assert event.reason == "INC-42 customer dispute" and event.actor_username == "cora"
    # The reveal shows up in the entry's audit history, and later views are masked again.
    html = client.get(url).content.decode()
    assert "dlq.reveal" in html and "4111111111111111" not in html
    download = client.get(url + "raw/")
    assert download.status_code == 200
    assert AuditEvent.objects.filter(action="dlq.download", outcome="success").count() == 1


def test_refused_reveal_and_download_are_audited_as_denied(viewer: User) -> None:
    channel = make_channel(redact_json_paths=["$.card.number"])
    [entry] = store(channel, letter(b'{"card": {"number": "4111111111111111"}}'))
    client = client_for(viewer)
    response = client.post(f"/dead-letters/{entry.pk}/reveal/", {"reason": "curious"})
    assert response.status_code == 403
    assert "compliance role" in response.content.decode()
    assert client.get(f"/dead-letters/{entry.pk}/raw/").status_code == 403
    denied = AuditEvent.objects.filter(outcome="denied").order_by("seq")
    assert [(e.action, e.actor_username, e.target_repr) for e in denied] == [
        ("dlq.reveal", "vera", f"dead letter #{entry.pk}"),
        ("dlq.download", "vera", f"dead letter #{entry.pk}"),
    ]
    revealed = AuditEvent.objects.filter(
        action__in=["dlq.reveal", "dlq.download"], outcome="success"
    )
    assert not revealed.exists()


def test_non_json_body_is_hidden_when_body_rules_cannot_apply(viewer: User) -> None:
    channel = make_channel(redact_json_paths=["$.card"])
    [entry] = store(channel, letter(b"card=4111111111111111"))
    html = client_for(viewer).get(f"/dead-letters/{entry.pk}/").content.decode()
    assert "4111111111111111" not in html and "is hidden" in html


def test_pages_warn_about_entries_close_to_eviction(viewer: User) -> None:
    channel = make_channel(retention_s=1000)
    [entry] = store(channel, letter())
    update_entries(
        DeadLetter.objects.filter(pk=entry.pk),
        status=Status.DISCARDED,
        ingested_at=timezone.now() - dt.timedelta(seconds=950),
    )
    client = client_for(viewer)
    assert "evicts soon" in client.get("/dead-letters/list/").content.decode()
    detail = client.get(f"/dead-letters/{entry.pk}/").content.decode()
    assert "within 10% of its retention" in detail


def test_nav_and_channel_page_link_to_dead_letters(viewer: User) -> None:
    channel = make_channel()
    html = client_for(viewer).get(f"/channels/{channel.slug}/").content.decode()
    assert 'href="/dead-letters/"' in html
    assert "/dead-letters/list/?channel=orders" in html


def test_filter_by_an_unknown_channel_is_empty_not_everything(viewer: User) -> None:
    from dlq.triage.filters import EntryFilter

    channel = make_channel()
    store(channel, letter())
    entries = EntryFilter.from_params({"channel": "no-such-channel"}).apply(
        DeadLetter.objects.all()
    )
    assert list(entries) == []
    assert (
        EntryFilter.from_params({"channel": channel.slug}).apply(DeadLetter.objects.all()).count()
        == 1
    )


def test_list_page_never_loads_bodies(viewer: User) -> None:
    channel = make_channel()
    store(channel, letter(b"x" * 100_000), letter(b"y" * 100_000))
    with CaptureQueriesContext(connection) as queries:
        response = client_for(viewer).get("/dead-letters/list/")
    assert response.status_code == 200
    entry_queries = [q["sql"] for q in queries.captured_queries if "dlq_deadletter" in q["sql"]]
    assert entry_queries
    assert not any('"dlq_deadletter"."body"' in sql for sql in entry_queries)
    assert not any('"dlq_deadletter"."search_text"' in sql for sql in entry_queries)


def test_list_ignores_a_cursor_of_non_ascii_digits(viewer: User) -> None:
    channel = make_channel()
    [entry] = store(channel, letter())
    response = client_for(viewer).get("/dead-letters/list/?after=²")
    assert response.status_code == 200
    assert f'href="/dead-letters/{entry.pk}/"' in response.content.decode()


def test_direction_overrides_in_broker_text_are_shown_not_obeyed(viewer: User) -> None:
    from dlq.text.render import visible

    channel = make_channel()
    rtl = "fail\u202egnp.exe"
    (entry,) = store(
        channel,
        letter(
            reason=rtl,
            headers={"x-error-class": rtl, "x-error-message": rtl, "Idempotency-Key": rtl},
        ),
    )
    client = client_for(viewer)
    for url in ("/dead-letters/list/", f"/dead-letters/{entry.pk}/"):
        page = client.get(url).content.decode()
        assert "\u202e" not in page, url
        assert visible(rtl) in page, url


def test_groups_show_open_of_total_and_sort_by_open(viewer: User, oncall: User) -> None:
    channel = make_channel()

    def failing(cls: str, n: int) -> list[DeadLetter]:
        return store(channel, *[letter(headers={"x-exception-class": cls}) for _ in range(n)])

    mostly_done = failing("Timeout", 5)
    failing("NotFound", 2)
    # Discard four of the five Timeout entries: 1 open of 5, so NotFound (2 of 2) leads.
    ids = ",".join(str(e.pk) for e in mostly_done[:4])
    client_for(oncall).post(
        "/dead-letters/discard/", {"id": ids, "action_reason": "fixed", "request_key": "g1"}
    )
    timeout = mostly_done[0].group
    assert timeout is not None
    timeout.refresh_from_db()
    assert (timeout.open_count, timeout.count) == (1, 5)
    html = client_for(viewer).get("/dead-letters/").content.decode()
    assert 'aria-label="1 open of 5"' in html and 'aria-label="2 open of 2"' in html
    assert html.index("NotFound") < html.index("Timeout")


def test_entry_page_puts_replay_and_discard_at_the_top(oncall: User) -> None:
    [entry] = store(make_channel(), letter())
    html = client_for(oncall).get(f"/dead-letters/{entry.pk}/").content.decode()
    replay = html.index(f'href="/dead-letters/replay/?id={entry.pk}"')
    assert replay < html.index("<h2>Failure</h2>")
    assert html.index(f'href="/dead-letters/discard/?id={entry.pk}"') < html.index("<h2>Body")


def test_entry_list_offers_select_all_and_a_visible_button_per_shortcut(oncall: User) -> None:
    store(make_channel(), letter(), letter())
    html = client_for(oncall).get("/dead-letters/list/").content.decode()
    assert 'id="select-all"' in html and 'src="/static/dlo/triage.js"' in html
    for key in ("j", "k", "x", "/", "r", "d"):
        assert f'aria-keyshortcuts="{key}"' in html, key
    assert 'id="shortcut-help"' in html
