"""The board's rows as HTML (``dashboard.board_html``): escaped like the template engine
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
from dashboard import live
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
    assert "42 s ago</time>" in row


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
    [[], ["orders"], [HOSTILE, "a-b", "z"], ["a\x00b", "<c>"], ["", "a", ""]],
)
def test_channel_options_render_as_the_template_loop_did(values: list[str]) -> None:
    """``dashboard.html.options`` replaces a template loop: same output, escaping included
    (also when a value holds the NUL it joins on)."""
    from django.template import engines

    from dashboard.html import options

    loop = engines["django"].from_string(
        '{% for c in channels %}<option value="{{ c }}"{% if c == channel %} selected{% endif %}>'
        "{{ c }}</option>{% endfor %}"
    )
    for chosen in ["", "a-b", HOSTILE, "a\x00b"]:
        expected = loop.render({"channels": values, "channel": chosen})
        assert str(options(values, chosen)) == expected
