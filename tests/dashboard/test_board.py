"""The health board at / and the channel page's health sections (no broker needed)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from channels_registry.health import HealthState
from channels_registry.models import ChannelHealth, ChannelRollup, ChannelSample
from tests.conftest import client_for, make_broker, make_channel

pytestmark = pytest.mark.django_db


def _health(channel: Any, state: str, **fields: Any) -> ChannelHealth:
    from channels_registry.health import SEVERITY

    now = timezone.now()
    defaults: dict[str, Any] = {
        "state": state,
        "severity": SEVERITY[state],
        "updated_at": now,
        "last_sample_at": now,
        "backlog": 10,
        "evidence": [f"evidence for {state}"],
    }
    defaults.update(fields)
    return ChannelHealth.objects.create(channel=channel, **defaults)


def test_board_requires_login(client: Any) -> None:
    response = client.get("/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_board_refuses_user_without_viewer_role(outsider: Any) -> None:
    assert client_for(outsider).get("/").status_code == 403


def test_empty_board_says_how_to_declare_a_channel(viewer: Any) -> None:
    response = client_for(viewer).get("/")
    assert response.status_code == 200
    assert b"No channels declared yet" in response.content
    assert b"registry import channels.yaml" in response.content


def test_board_before_the_first_poll_says_how_to_poll(viewer: Any) -> None:
    make_channel()
    content = client_for(viewer).get("/").content.decode()
    assert "Waiting for the first poll." in content
    assert "python manage.py poll --once" in content
    assert 'class="state state-unknown">Unknown<' in content


def test_rows_are_worst_first_with_values(viewer: Any) -> None:
    broker = make_broker()
    ok = make_channel(broker, slug="a-ok", name="A ok", address="a")
    stopped = make_channel(broker, slug="b-stopped", name="B stopped", address="b")
    lagging = make_channel(broker, slug="c-lagging", name="C lagging", address="c")
    _health(ok, HealthState.OK, backlog=12345, in_flight=7, consumers=3, active_consumers=2)
    _health(stopped, HealthState.STOPPED, consumers=0, active_consumers=0)
    _health(lagging, HealthState.LAGGING, eta_s=None, drain_rate=-2.0, backlog=500)
    content = client_for(viewer).get("/").content.decode()
    order = [content.index(f'id="ch-{c.pk}"') for c in (stopped, lagging, ok)]
    assert order == sorted(order)
    assert '<td class="n" data-label="Backlog">12,345</td>' in content
    assert '<td class="n" data-label="Consumers">2 / 3</td>' in content
    assert "not draining" in content
    assert "evidence for stopped" in content


def test_unknown_values_are_shown_as_unknown_not_zero(viewer: Any) -> None:
    channel = make_channel()
    _health(channel, HealthState.OK, backlog=None, dlq_depth=None)
    content = client_for(viewer).get("/").content.decode()
    row = content[content.index(f'id="ch-{channel.pk}"') :]
    assert '<td class="n" data-label="Backlog">—</td>' in row
    assert '<td class="n" data-label="DLQ">—</td>' in row
    assert ">0</td>" not in row[: row.index("</tr>")]


def test_old_health_is_shown_stale_never_ok(viewer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLO_BROKER_RABBITMQ_URL", "amqp://127.0.0.1:5672/%2F")  # pollable
    channel = make_channel()
    old = timezone.now() - dt.timedelta(minutes=20)
    _health(channel, HealthState.OK, updated_at=old, last_sample_at=old)
    content = client_for(viewer).get("/").content.decode()
    assert 'class="state state-stale">Stale<' in content
    row = content[content.index(f'id="ch-{channel.pk}"') :]
    assert "is the scheduler running?" in row, row[:1500]
    assert 'class="state state-ok"' not in content
    # Without its URL variable, the broker's own problem is named instead.
    monkeypatch.delenv("DLO_BROKER_RABBITMQ_URL")
    content = client_for(viewer).get("/").content.decode()
    assert "Environment variable DLO_BROKER_RABBITMQ_URL is not set" in content
    assert "is the scheduler running?" not in content


def test_channel_of_a_disabled_broker_says_so_instead_of_blaming_the_scheduler(
    viewer: Any,
) -> None:
    broker = make_broker(enabled=False)
    never = make_channel(broker, slug="never", name="Never", address="never")
    old = timezone.now() - dt.timedelta(minutes=20)
    _health(make_channel(broker), HealthState.OK, updated_at=old, last_sample_at=old)
    content = client_for(viewer).get("/").content.decode()
    assert content.count(f"Broker {broker.name} is disabled: its channels are not polled.") == 2
    assert "is the scheduler running?" not in content
    assert "waiting for the first poll" not in content[content.index(f'id="ch-{never.pk}"') :]
    assert 'class="state state-ok"' not in content


def test_htmx_request_gets_the_board_partial_only(viewer: Any) -> None:
    _health(make_channel(), HealthState.OK)
    client = client_for(viewer)
    full = client.get("/")
    partial = client.get("/", headers={"HX-Request": "true"})
    assert b"<html" in full.content and b'id="board"' in full.content
    assert b"<html" not in partial.content
    assert partial.content.lstrip().startswith(b'<div id="board"')


def test_filters_by_team_broker_and_state_in_the_url(viewer: Any) -> None:
    rabbit = make_broker()
    redis = make_broker(name="cache", kind="redis", url_env="DLO_BROKER_REDIS_URL")
    pay = make_channel(rabbit, slug="pay", name="Pay", address="pay", owner_team="payments")
    search = make_channel(
        redis, slug="search", name="Search", address="s", address_group="g", owner_team="search"
    )
    _health(pay, HealthState.LAGGING)
    _health(search, HealthState.OK, dlq_flags=["dlq-nonempty"])
    client = client_for(viewer)

    def ids(query: str) -> set[int]:
        content = client.get("/" + query, headers={"HX-Request": "true"}).content.decode()
        return {c.pk for c in (pay, search) if f'id="ch-{c.pk}"' in content}

    assert ids("") == {pay.pk, search.pk}
    assert ids("?team=search") == {search.pk}
    assert ids("?broker=main-rabbit") == {pay.pk}
    assert ids("?state=lagging") == {pay.pk}
    assert ids("?state=dlq-nonempty") == {search.pk}
    content = client.get("/?team=search").content.decode()
    assert 'ws-connect="/ws/board/?patch=2&amp;team=search"' in content
    assert '<option value="search" selected>' in content
    assert "No channel matches these filters" in client.get("/?state=stalled").content.decode()


def test_team_filter_lists_each_named_team_once_in_order(viewer: Any) -> None:
    """The skip scan (PostgreSQL) and DISTINCT (SQLite) give the same list: every team once,
    sorted, no blank, hostile names escaped in the options."""
    broker = make_broker()
    teams = ["search", "", "payments", "search", "Ops team", "<b>x</b>", "payments", ""]
    for n, team in enumerate(teams):
        make_channel(broker, slug=f"c{n}", name=f"C{n}", address=f"q{n}", owner_team=team)
    from channels_registry.models import Channel

    distinct = Channel.objects.exclude(owner_team="").order_by("owner_team")
    expected = list(distinct.values_list("owner_team", flat=True).distinct())
    assert Channel.owner_teams() == expected
    assert sorted(Channel.owner_teams()) == sorted({"search", "payments", "Ops team", "<b>x</b>"})
    content = client_for(viewer).get("/").content.decode()
    options = content.split('aria-label="Team">', 1)[1].split("</select>", 1)[0]
    assert options.count("<option") == 5  # "All teams" + four
    assert '<option value="&lt;b&gt;x&lt;/b&gt;">&lt;b&gt;x&lt;/b&gt;</option>' in options


def test_board_query_count_does_not_grow_with_channels(viewer: Any) -> None:
    broker = make_broker()
    client = client_for(viewer)

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/").status_code == 200
        return len(ctx)

    for i in range(3):
        _health(make_channel(broker, slug=f"c{i}", address=f"q{i}"), HealthState.OK)
    few = queries()
    for i in range(3, 40):
        _health(make_channel(broker, slug=f"c{i}", address=f"q{i}"), HealthState.OK)
    assert queries() == few


def test_channel_page_shows_state_evidence_charts_and_observed(viewer: Any) -> None:
    channel = make_channel()
    now = timezone.now()
    _health(
        channel,
        HealthState.LAGGING,
        evidence=["backlog grew 4,210 → 9,877 over 10 min while acks stalled"],
        observed={"exists": True, "kind": "classic"},
        observed_at=now,
        observed_findings=[
            {
                "code": "observed.no-dead-letter-exchange",
                "severity": "error",
                "principle": "P5",
                "message": "Queue orders has no dead-letter exchange",
                "fix": "Set x-dead-letter-exchange.",
            }
        ],
    )
    for i in range(5):
        ChannelSample.objects.create(
            channel=channel, taken_at=now - dt.timedelta(minutes=i), backlog=100 * i
        )
        ChannelRollup.objects.create(
            channel=channel,
            minute=(now - dt.timedelta(hours=i)).replace(second=0, microsecond=0),
            backlog=10 * i,
        )
    client = client_for(viewer)
    content = client.get(channel.get_absolute_url()).content.decode()
    assert 'class="state state-lagging">Lagging<' in content
    assert "backlog grew 4,210 → 9,877 over 10 min while acks stalled" in content
    assert "Queue orders has no dead-letter exchange" in content
    assert content.count('<figure class="chart">') == 4  # backlog, dead letters, inflow, consumers
    assert "max 400; Backlog last 0" in content  # backlog over the last hour, from raw samples
    day = client.get(channel.get_absolute_url() + "?range=24h").content.decode()
    assert "max 40; Backlog last 0" in day  # from the minute rollups
    assert day.count('<figure class="chart">') == 3  # no inflow rate without raw counters
    assert 'aria-current="page" class="current">24h<' in day
    assert client.get(channel.get_absolute_url() + "?range=7d").status_code == 200


def test_big_board_renders_the_worst_rows_first_and_counts_every_state(
    viewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard.board import page as board

    monkeypatch.setattr(board, "FIRST_ROWS", 3)
    monkeypatch.setattr(board, "MORE_ROWS", 2)
    broker = make_broker()
    ok = [make_channel(broker, slug=f"ok{i}", name=f"Ok {i}", address=f"q{i}") for i in range(5)]
    for c in ok:
        _health(c, HealthState.OK)
    bad = [make_channel(broker, slug=f"bad{i}", name=f"Bad {i}", address=f"b{i}") for i in range(4)]
    for c in bad:
        _health(c, HealthState.STALLED)
    client = client_for(viewer)

    def ids(content: str) -> list[int]:
        """The channel rows in document order."""
        found = [(content.find(f'id="ch-{c.pk}"'), c.pk) for c in ok + bad]
        return [pk for at, pk in sorted(found) if at >= 0]

    first = client.get("/").content.decode()
    assert ids(first) == [c.pk for c in bad[:3]]  # worst first, cut at FIRST_ROWS
    # The unhealthy channel below the cut is counted, with a link to the filtered board.
    assert 'href="?state=stalled">Stalled 4</a>' in first
    assert 'href="?state=ok">OK 5</a>' in first
    assert "6 more channels" in first and 'href="/?all=1"' in first
    assert "9 channels, worst first." in first
    more = client.get("/?from=3", headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in more and ids(more) == [bad[3].pk, ok[0].pk]
    assert 'hx-get="/?from=5"' in more and "4 more channels" in more
    last = client.get("/?from=7", headers={"HX-Request": "true"}).content.decode()
    assert ids(last) == [ok[3].pk, ok[4].pk] and 'id="board-more"' not in last
    everything = client.get("/?all=1").content.decode()
    assert len(ids(everything)) == 9 and 'id="board-more"' not in everything
    filtered = client.get("/?state=stalled").content.decode()
    assert (
        ids(filtered) == [c.pk for c in bad[:3]]
        and 'hx-get="/?state=stalled&amp;from=3"' in filtered
    )


def test_board_sorts_and_slices_in_the_database(
    viewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the rows on screen are loaded (LIMIT in SQL), and the order is the stored severity
    raised to STALE for a row nobody polled recently — worked out in the query, not Python."""
    from dashboard.board import page as board

    monkeypatch.setattr(board, "FIRST_ROWS", 2)
    broker = make_broker()
    old = timezone.now() - dt.timedelta(minutes=20)
    lagging = _health(make_channel(broker, slug="lag", name="B lag", address="l"), "lagging")
    # Stored as OK (severity 10), but not polled for 20 minutes: shown and ranked as stale (75).
    stale = _health(
        make_channel(broker, slug="old", name="Z old", address="o"),
        HealthState.OK,
        updated_at=old,
        last_sample_at=old,
    )
    for i in range(5):
        _health(make_channel(broker, slug=f"ok{i}", name=f"A ok {i}", address=f"q{i}"), "ok")
    with CaptureQueriesContext(connection) as ctx:
        content = client_for(viewer).get("/").content.decode()
    rows = [pk for pk in (stale.pk, lagging.pk) if f'id="ch-{pk}"' in content]
    assert rows == [stale.pk, lagging.pk]
    assert content.index(f'id="ch-{stale.pk}"') < content.index(f'id="ch-{lagging.pk}"')
    assert 'href="?state=stale">Stale 1</a>' in content and 'href="?state=ok">OK 5</a>' in content
    assert "5 more channels" in content
    # Health details (the evidence) are loaded only for the rows on screen, by id.
    loads = [q["sql"] for q in ctx.captured_queries if '"evidence"' in q["sql"]]
    assert len(loads) == 1 and '"id" IN (' in loads[0], loads
    assert loads[0].count(",") < 200  # two ids, not every channel's
    stalefilter = client_for(viewer).get("/?state=stale").content.decode()
    assert f'id="ch-{stale.pk}"' in stalefilter and f'id="ch-{lagging.pk}"' not in stalefilter


def test_stored_severity_is_recomputed_from_state_and_flags() -> None:
    health = _health(make_channel(), HealthState.OK, severity=0)
    health.dlq_flags = ["dlq-inflow"]
    assert health.refresh_severity() == 55
    health.state = HealthState.POISONED
    assert health.refresh_severity() == 90


@pytest.mark.parametrize("scan", [2000, 1])
def test_stale_rows_rank_and_count_the_same_however_many_are_stale(
    viewer: Any, monkeypatch: pytest.MonkeyPatch, scan: int
) -> None:
    """A few stale rows are read one by one; a stopped scheduler (more than STALE_SCAN) makes
    the database rank them. Either way the order, the counts and the filters agree."""
    from dashboard.board import page as board

    monkeypatch.setattr(board, "STALE_SCAN", scan)
    monkeypatch.setattr(board, "FIRST_ROWS", 1)  # the counts show when rows are cut
    broker = make_broker()
    old = timezone.now() - dt.timedelta(minutes=20)
    stale_ok = _health(
        make_channel(broker, slug="s1", name="S1", address="s1"),
        HealthState.OK,
        updated_at=old,
        dlq_flags=["dlq-nonempty"],
    )
    stale_poisoned = _health(
        make_channel(broker, slug="s2", name="S2", address="s2"),
        HealthState.POISONED,
        updated_at=old,
    )
    lagging = _health(make_channel(broker, slug="l", name="L", address="l"), "lagging")
    fresh_flagged = _health(
        make_channel(broker, slug="f", name="F", address="f"),
        HealthState.OK,
        dlq_flags=["dlq-nonempty"],
    )
    never = make_channel(broker, slug="n", name="N", address="n")
    client = client_for(viewer)

    def order(query: str) -> list[int]:
        content = client.get("/?all=1" + query).content.decode()
        pks = [stale_ok.pk, stale_poisoned.pk, lagging.pk, fresh_flagged.pk, never.pk]
        found = sorted((content.find(f'id="ch-{pk}"'), pk) for pk in pks)
        return [pk for at, pk in found if at >= 0]

    # Poisoned stays 90; the stale OK row is raised to STALE (75), above lagging (60).
    assert order("") == [stale_poisoned.pk, stale_ok.pk, lagging.pk, never.pk, fresh_flagged.pk]
    content = client.get("/").content.decode()
    for link in ('state=stale">Stale 2<', 'state=lagging">Lagging 1<', 'state=ok">OK 1<'):
        assert link in content, link
    assert 'state=unknown">Unknown 1<' in content
    assert 'state=dlq-nonempty">DLQ non-empty 2<' in content
    assert order("&state=dlq-nonempty") == [stale_ok.pk, fresh_flagged.pk]
    assert order("&state=stale") == [stale_poisoned.pk, stale_ok.pk]
    assert order("&state=ok") == [fresh_flagged.pk]
    assert order("&state=poisoned") == []
    flagged = client.get("/?state=dlq-nonempty").content.decode()
    assert "1 more channel" in flagged
    assert 'state=stale">Stale 1<' in flagged and 'state=ok">OK 1<' in flagged


def test_board_shows_stored_dead_letters_beside_the_brokers_depth(viewer: Any) -> None:
    channel = make_channel()
    _health(
        channel, HealthState.IDLE, dlq_depth=0, poison_depth=0, dlq_unresolved=4,
        poison_unresolved=1, dlq_flags=["dlq-nonempty"],
    )  # fmt: skip
    html = client_for(viewer).get("/").content.decode()
    row = html[html.index(f'id="ch-{channel.pk}"') :]
    row = row[: row.index("</tr>")]
    assert '<td class="n" data-label="DLQ">0<div class="stored">+4 stored</div></td>' in row
    assert '<td class="n" data-label="Poison">0<div class="stored">+1 stored</div></td>' in row
    assert "DLQ non-empty" in row
    assert 'id="board-announce"' in html and 'aria-live="polite"' in html
