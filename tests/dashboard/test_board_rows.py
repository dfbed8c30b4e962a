"""The board's rows as HTML (``dashboard.board.rows``): escaped like the template engine
escapes, and the very row the page shows is the row the websocket pushes."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from channels_registry.health import SEVERITY, HealthState
from channels_registry.models import ChannelHealth
from dashboard.board import live
from tests.conftest import client_for, make_broker, make_channel

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert('x')</script>&\"\u202e\x07"


def _row(html: str, pk: int) -> str:
    start = html.index(f'<tr id="ch-{pk}"')
    return html[start : html.index("</tr>", start) + len("</tr>")]


def _hostile_channel() -> Any:
    broker = make_broker(name="b<i>&'")
    channel = make_channel(broker, name=f"Pay {HOSTILE}", owner_team=f"team {HOSTILE}")
    now = timezone.now()
    ChannelHealth.objects.create(
        channel=channel,
        state=HealthState.STALLED,
        severity=SEVERITY[HealthState.STALLED],
        updated_at=now,
        last_sample_at=now - dt.timedelta(seconds=42),
        evidence=[f"consumer said {HOSTILE}"],
        dlq_flags=["dlq-nonempty"],
        backlog=1234567,
        consumers=0,
        active_consumers=0,
        lag_s=150.0,
        dlq_depth=3,
        dlq_unresolved=2,
    )
    return channel


def test_broker_and_registry_text_is_escaped_in_board_rows(viewer: Any) -> None:
    channel = _hostile_channel()
    row = _row(client_for(viewer).get("/").content.decode(), channel.pk)
    assert "<script>" not in row and "<i>" not in row
    assert "Pay &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;" in row
    assert "b&lt;i&gt;&amp;&#x27; · team &lt;script&gt;" in row
    # Evidence from the broker: escaped, and control/direction characters shown as markers.
    evidence = re.search(r'<div class="evidence sub">(.*?)</div>', row)
    assert evidence and "consumer said &lt;script&gt;" in evidence.group(1)
    assert "\u202e" not in evidence.group(1) and "\x07" not in evidence.group(1)
    assert '<td class="n" data-label="Backlog">1,234,567</td>' in row
    assert '<td class="n" data-label="Consumers">0 / 0</td>' in row
    assert '<td class="n" data-label="Oldest / lag">~2 min</td>' in row
    assert '<div class="stored">+2 stored</div>' in row
    assert '<span class="state state-dlq-nonempty">DLQ non-empty</span>' in row
    # The sample's clock time (its age is the page's to show): true however old the page is.
    sampled = timezone.localtime(timezone.now() - dt.timedelta(seconds=42))
    assert f'data-broker="{channel.broker.pk}">{sampled:%b} {sampled.day}, ' in row


def test_the_pushed_row_is_the_row_the_page_shows(
    viewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = _hostile_channel()
    sent: list[dict[str, Any]] = []

    class Layer:
        async def group_send(self, group: str, message: dict[str, Any]) -> None:
            sent.append(message)

    monkeypatch.setattr(live, "get_channel_layer", Layer)
    cache.clear()
    assert live.push_board_rows([channel.pk]) == 1
    [pushed] = sent[0]["rows"]
    page = _row(client_for(viewer).get("/").content.decode(), channel.pk)
    # The push is ASCII (non-ASCII as character references) and marked for an oob swap;
    # otherwise the same row (its sample age may have ticked by a second in between).
    pushed_html = pushed["html"].replace(' hx-swap-oob="true"', "")

    def same(html: str) -> str:
        html = re.sub(r"&#(\d+);", lambda m: chr(int(m.group(1))), html)
        return re.sub(r"<time [^>]*>[^<]*</time>", "<time/>", html)

    assert same(_row(pushed_html, channel.pk)) == same(page)
    assert 'hx-swap-oob="true"' in pushed["html"] and 'hx-swap-oob="true"' not in page


@pytest.mark.parametrize(
    "values",
    [[], ["orders"], [HOSTILE, "a-b", "z"], ["a\x00b", "<c>"], ["a\nb", "c"], ["", "a", ""]],
)
def test_channel_options_render_as_the_template_loop_did(values: list[str]) -> None:
    """``dashboard.html.options`` replaces a template loop: same output, escaping included
    (also when a value holds the newline it joins on)."""
    from django.template import engines

    from dashboard.html import options

    loop = engines["django"].from_string(
        '{% for c in channels %}<option value="{{ c }}"{% if c == channel %} selected{% endif %}>'
        "{{ c }}</option>{% endfor %}"
    )
    for chosen in ["", "a-b", HOSTILE, "a\x00b"]:
        expected = loop.render({"channels": values, "channel": chosen})
        assert str(options(values, chosen)) == expected


#: The row partial of ``templates/dashboard/board.html`` before the rows moved to Python.
TEMPLATE_ROW = """{% load dlo_health %}{% with h=row.health %}
<tr id="{{ row.dom_id }}" class="row-{{ row.state }}{% if row.stale %} is-stale{% endif %}"{% if oob %} hx-swap-oob="true"{% endif %}>
<td data-label="Channel"><a href="{{ row.channel.get_absolute_url }}">{{ row.channel.name }}</a><div class="sub">{{ row.channel.broker.name }}{% if row.channel.owner_team %} · {{ row.channel.owner_team }}{% endif %}</div></td>
<td data-label="State"><span class="state state-{{ row.state }}">{{ row.state_label }}</span>{% for value, label in row.dlq_flags %} <span class="state state-{{ value }}">{{ label }}</span>{% endfor %}{% if row.evidence %}<div class="evidence sub">{{ row.evidence.0|visible }}</div>{% endif %}</td>
<td class="n" data-label="Backlog">{{ h.backlog|num }}</td>
<td class="n" data-label="In flight">{{ h.in_flight|num }}</td>
<td class="n" data-label="Consumers">{% if h %}{{ h.active_consumers|num }} / {{ h.consumers|num }}{% else %}—{% endif %}</td>
<td class="n" data-label="Oldest / lag">{% if h.oldest_age_s is not None %}{{ h.oldest_age_s|duration }}{% elif h.lag_s is not None %}~{{ h.lag_s|duration }}{% else %}—{% endif %}</td>
<td class="n" data-label="Retrying">{% if not h %}—{% elif h.retry_waiting is not None %}{{ h.retry_waiting|num }}{% elif h.retry_unknown %}unknown<div class="sub why">{{ h.retry_unknown }}</div>{% else %}—{% endif %}</td>
<td class="n" data-label="DLQ">{{ h.dlq_depth|num }}{% if h.dlq_unresolved %}<div class="stored">+{{ h.dlq_unresolved|num }} stored</div>{% endif %}</td>
<td class="n" data-label="Poison">{{ h.poison_depth|num }}{% if h.poison_unresolved %}<div class="stored">+{{ h.poison_unresolved|num }} stored</div>{% endif %}</td>
<td data-label="Backlog, 1 h">{{ row.spark }}</td>
<td data-label="Drain ETA">{{ row.eta }}</td>
<td data-label="Last sample">{% if row.last_sample_at %}<time datetime="{{ row.last_sample_at|date:'c' }}" data-age data-broker="{{ row.channel.broker.pk }}">{{ row.last_sample_at|date:'M j, H:i:s T' }}</time>{% else %}never{% endif %}</td>
</tr>{% endwith %}
"""  # noqa: E501

SPARKS: list[list[Any]] = [
    [], [[0, None]], [[60, 5]], [[60, 0], [120, 0]], [[60, 3], [120, None], [180, 4], [240, 7.5]],
    [[i * 60, (i * 37) % 11 * 1234.5] for i in range(60)], [[3000, -3], [3600, 1e12]],
]  # fmt: skip


def test_rows_are_the_old_partials_rows_byte_for_byte() -> None:
    """Hostile registry and broker text, every kind of sparkline, stale, never-polled and
    disabled-broker rows: ``row_html`` renders what the template partial rendered."""
    from django.template import Context, Engine

    from channels_registry.models import Channel
    from dashboard.board.page import board_rows, conditions_for, make_row
    from dashboard.board.rows import row_html, rows_html

    now = timezone.now()
    off = make_broker(name=f"off {HOSTILE}", enabled=False, url_env="")
    for n, spark in enumerate(SPARKS * 2):
        broker = off if n % 4 == 3 else None
        team = ["", f"team {HOSTILE}"][n % 2]
        channel = make_channel(
            broker, name=f"{n} {HOSTILE}", slug=f"ch-{n}_X", address=f"q{n}", owner_team=team
        )
        if n == 5:
            continue  # never polled
        start = (now - dt.timedelta(hours=1)).timestamp()
        ChannelHealth.objects.create(
            channel=channel,
            state=HealthState.values[n % len(HealthState.values)],
            updated_at=now - dt.timedelta(seconds=[5, 5000][n % 3 == 2]),
            last_sample_at=None if n % 5 == 4 else now - dt.timedelta(seconds=n * 7.3),
            evidence=[] if n % 3 == 0 else [f"said {HOSTILE}", "more"],
            dlq_flags=[["dlq-nonempty"], [], ["poison-nonempty", "unknown-flag"]][n % 3],
            backlog=[None, 0, 12345678][n % 3],
            in_flight=[None, 2][n % 2],
            consumers=[None, 0, 4][n % 3],
            active_consumers=[None, 3][n % 2],
            oldest_age_s=[None, 12.5, None, 86400 * 3][n % 4],
            lag_s=[None, 150.0, 0.4][n % 3],
            dlq_depth=[None, 7][n % 2],
            dlq_unresolved=[None, 0, 2][n % 3],
            poison_unresolved=[0, 5][n % 2],
            retry_waiting=[None, 21, None, 0][n % 4],
            retry_unknown=["", "", f"retry queue {HOSTILE!r} not found", ""][n % 4],
            drain_rate=[None, 0.0, 3.0][n % 3],
            eta_s=[None, 7200.0][n % 2],
            spark=[[start + t, v] for t, v in spark],
        )
    rows = board_rows(conditions_for(), now)  # from tuples (``dashboard.board.data``)
    assert len(rows) == 2 * len(SPARKS) and any(r.stale for r in rows)
    # The partial renders each row as made from model instances, as the board did.
    channels = Channel.objects.select_related("broker", "health").in_bulk()
    model_rows = [make_row(channels[row.channel.pk], now) for row in rows]
    partial = Engine.get_default().from_string(TEMPLATE_ROW)  # the project's engine
    # Beside the partial's markup, each <tr> carries its version (issue 29): the digest of
    # what the partial rendered.
    from dashboard.board.versions import row_digest

    def unversioned(html: str) -> str:
        return re.sub(r' data-v="[0-9a-f]{16}"', "", html, count=1)

    for row, model_row in zip(rows, model_rows, strict=True):
        for oob in (False, True):
            expected = partial.render(Context({"row": model_row, "oob": oob}))
            html = str(row_html(row, oob))
            assert unversioned(html) == expected
            assert f' data-v="{row_digest(expected)}"' in html.split(">", 1)[0]
    expected_all = "".join(partial.render(Context({"row": r})) for r in model_rows)
    assert re.sub(r' data-v="[0-9a-f]{16}"', "", rows_html(rows)) == expected_all


def _pushed(pk: int) -> str:
    """The row as ``dashboard.board.live`` renders it for a push."""
    from dashboard.board.data import load_rows
    from dashboard.board.page import make_row
    from dashboard.board.rows import row_html

    return str(row_html(make_row(load_rows([pk])[pk], timezone.now()), True))


def test_a_row_patch_carries_the_changed_cells_only_escaped() -> None:
    """Issue 29: a row whose numbers and evidence moved goes as a patch of those cells (the
    server's escaped HTML, never the channel cell); a new state or flag, or a new name, goes as
    the whole row."""
    import json

    from dashboard.board.versions import row_digest, row_patch, version_of

    channel = _hostile_channel()
    first = _pushed(channel.pk)
    health = ChannelHealth.objects.get(channel=channel)
    health.backlog, health.evidence = 1234999, [f"now {HOSTILE}"]
    health.save()
    second = _pushed(channel.pk)
    patch = row_patch(channel.pk, first, second)
    assert patch is not None and patch.startswith("<!--dlo {") and patch.endswith("}-->")
    body = patch[len("<!--dlo ") : -len("-->")]
    assert "<" not in body and ">" not in body  # JSON escapes: the comment cannot close early
    pk, cells, start, end = json.loads(body)["patch"]
    assert pk == channel.pk and set(cells) == {"1", "2"}  # the state cell's evidence, backlog
    # From the version the first row carries to the second's: what the page checks.
    assert (start, end) == (version_of(first), version_of(second)) and start != end
    assert start == row_digest(first) and end == row_digest(second)
    assert cells["2"] == "1,234,999"
    assert "now &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;" in cells["1"]
    assert "<script>" not in cells["1"] and "\u202e" not in cells["1"]
    # Each cell as the whole row has it: the page sets the cell to exactly this.
    assert f">{cells['1']}</td>" in second and f">{cells['2']}</td>" in second
    v = version_of(first)
    unchanged = f'<!--dlo {{"patch":[{channel.pk},{{}},"{v}","{v}"]}}-->'
    assert row_patch(channel.pk, first, first) == unchanged

    health.state, health.severity = HealthState.STOPPED, SEVERITY[HealthState.STOPPED]
    health.save()
    assert row_patch(channel.pk, second, _pushed(channel.pk)) is None  # a new state: whole
    health.state, health.severity = HealthState.STALLED, SEVERITY[HealthState.STALLED]
    health.dlq_flags = []
    health.save()
    assert row_patch(channel.pk, second, _pushed(channel.pk)) is None  # a flag gone: whole
    health.dlq_flags = ["dlq-nonempty"]
    health.save()
    channel.name = "Renamed <b>"
    channel.save()
    assert row_patch(channel.pk, second, _pushed(channel.pk)) is None  # a new name: whole
    assert row_patch(1, "<tr><td>a</td></tr>", "<tr><td>b</td></tr>") is None  # not a board row
    unversioned = second.replace(f' data-v="{version_of(second)}"', "")
    assert row_patch(channel.pk, unversioned, second) is None  # no version to start from


def test_the_page_and_the_push_give_a_row_the_same_version(viewer: Any) -> None:
    """Issue 29: the board page's row (HTTP) carries the version the push renders for the same
    row, so the first poll after a page loaded may go as patches; the clock alone (a later
    sample time, a sparkline redrawn) does not change it, its numbers do."""
    from dashboard.board.versions import version_of

    channel = _hostile_channel()
    page = client_for(viewer).get("/").content.decode()
    found = re.search(rf'<tr id="ch-{channel.pk}"[^>]*>', page)
    assert found is not None, page[:2000]
    pushed = _pushed(channel.pk)
    assert 'hx-swap-oob="true"' in pushed and "hx-swap-oob" not in found.group(0)
    assert version_of(found.group(0)) == version_of(pushed) != ""
    health = ChannelHealth.objects.get(channel=channel)
    health.last_sample_at = health.last_sample_at + dt.timedelta(seconds=30)
    health.save()
    assert version_of(_pushed(channel.pk)) == version_of(pushed)
    health.backlog += 1
    health.save()
    assert version_of(_pushed(channel.pk)) != version_of(pushed)
