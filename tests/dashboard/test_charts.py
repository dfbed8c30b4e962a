"""Issue 15.4: the channel charts carry values on hover, poison and inflow-rate series, and
marks for the channel's events (a failure group first seen, a plan run, an alert firing)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.utils import timezone
from django.utils.safestring import mark_safe

from alerts.models import Alert
from channels_registry.charts import Line, line_chart
from channels_registry.models import ChannelSample
from tests.conftest import client_for, make_channel
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db


def test_hover_titles_give_every_series_value_at_that_time() -> None:
    svg = str(
        line_chart(
            [Line("dlq", "DLQ depth", [(0.0, 1.0), (60.0, 7.0)]),
             Line("poison", "Poison", [(0.0, None), (60.0, 2.0)])],
            0.0, 60.0, label="Dead letters",
        )
    )  # fmt: skip
    titles = re.findall(r"<title>([^<]*)</title>", svg)
    assert "00:00:00 UTC: DLQ depth 1 · Poison unknown" in titles
    assert "00:01:00 UTC: DLQ depth 7 · Poison 2" in titles
    assert 'class="series s-poison"' in svg


def test_channel_page_marks_groups_plans_and_alerts_on_the_charts(oncall: Any) -> None:
    channel = make_channel()
    now = timezone.now()
    for i in range(6):
        ChannelSample.objects.create(
            channel=channel, taken_at=now - dt.timedelta(minutes=5 - i), backlog=10 * i,
            dlq_depth=i, poison_depth=1, produced=600 * i,
        )  # fmt: skip
    entries = store(channel, letter(headers={"x-exception-class": "Timeout"}))
    client = client_for(oncall)
    client.post(
        "/dead-letters/discard/",
        {"id": str(entries[0].pk), "action_reason": "known", "request_key": "c1"},
    )
    Alert.objects.create(
        rule="dlq-depth", key="k", broker=channel.broker, channel=channel, state="firing",
        severity="warning", summary="DLQ depth 4 > 3", started_at=now, fired_at=now,
        last_evaluated_at=now,
    )  # fmt: skip
    html = client.get(channel.get_absolute_url()).content.decode()
    assert "Inflow rate (msg/s)" in html and "Inflow 10.0" in html  # 600 per minute
    assert 'class="series s-poison"' in html
    group = entries[0].group_id
    assert f"failure group #{group} first seen: Timeout" in html
    assert 'class="mark mark-plan"' in html and "discard plan #" in html
    assert "alert fired: DLQ depth 4 &gt; 3" in html
    assert html.count('<rect class="hit"') >= 6 * 3


@pytest.mark.parametrize(
    "series",
    [[], [(0.0, None)], [(30.0, 5.0)], [(0.0, 0.0), (60.0, 0.0)],
     [(0.0, 3.0), (10.0, None), (20.0, 4.0), (30.0, 7.5)], [(0.0, -3.0), (60.0, 1e12)],
     [(float(t), (t * 37) % 11 * 1234.5) for t in range(0, 3600, 60)]],
)  # fmt: skip
def test_sparkline_is_the_svg_format_html_built(series: list[Any]) -> None:
    """The board's sparkline is built with f-strings (drawn for every row): the same SVG as
    ``format_html`` built, every number and the label escaped alike."""
    from django.utils.html import format_html

    from channels_registry.charts import _segments, sparkline

    known = [v for _, v in series if v is not None]
    if not known:
        expected = format_html(
            '<svg class="spark spark-empty" width="{}" height="{}" role="img" aria-label="no'
            ' data"><line x1="0" y1="{}" x2="{}" y2="{}"/></svg>', 140, 32, 31, 140, 31
        )  # fmt: skip
    else:
        parts = []
        for seg in _segments(series, 0.0, 3600.0, max(known), 140, 32):
            if " " in seg:
                parts.append(format_html('<polyline points="{}"/>', seg))
            else:
                parts.append(format_html('<circle cx="{}" cy="{}" r="1.5"/>', *seg.split(",")))
        text = f"backlog, last hour: max {max(known):,.0f}, now {known[-1]:,.0f}"
        expected = format_html(
            '<svg class="spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img"'
            ' aria-label="{}"><title>{}</title>{}</svg>',
            140, 32, 140, 32, text, text, mark_safe("".join(parts)),
        )  # fmt: skip
    assert str(sparkline(series, 0.0, 3600.0)) == str(expected)


@pytest.mark.parametrize(
    ("top", "ticks"),
    [(0.0, [0, 1]), (7.0, [0, 2, 4, 6, 8]), (336.0, [0, 100, 200, 300, 400]),
     (1.0, [0, 0.5, 1.0]), (12_500.0, [0, 5000, 10000, 15000])],
)  # fmt: skip
def test_y_axis_ticks_are_round_and_reach_the_top(top: float, ticks: list[float]) -> None:
    from channels_registry.charts import nice_ticks

    assert nice_ticks(top) == pytest.approx(ticks)
    assert nice_ticks(2.0, integer=True) == [0, 1, 2]  # counts: no half consumers


def test_a_chosen_range_is_clamped_and_bad_input_is_said_not_raised(viewer: Any) -> None:
    from channels_registry.charts import MAX_WINDOW_S, parse_window

    now = dt.datetime(2026, 1, 2, 12, 0, tzinfo=dt.UTC)
    t = now.timestamp()
    assert parse_window({}, now) == (None, "")
    assert parse_window({"from": str(int(t - 600)), "to": str(int(t - 60))}, now) == (
        (t - 600, t - 60),
        "",
    )
    assert parse_window({"from": "2026-01-02T11:00"}, now) == ((t - 3600, t), "")
    assert parse_window({"from": "0", "to": str(int(t + 999))}, now)[0] == (t - MAX_WINDOW_S, t)
    for bad in ({"from": "yesterday"}, {"from": "9" * 400}, {"from": str(int(t))},
                {"from": "9999-12-31T23:00-05:00"}):  # fmt: skip
        window, why = parse_window(bad, now)
        assert window is None and why
    channel = make_channel()
    ChannelSample.objects.create(channel=channel, taken_at=timezone.now(), backlog=5)
    client = client_for(viewer)
    page = client.get(channel.get_absolute_url() + "?from=nonsense").content.decode()
    assert "That range is not a time" in page
    start = int((timezone.now() - dt.timedelta(minutes=30)).timestamp())
    page = client.get(channel.get_absolute_url() + f"?from={start}").content.decode()
    assert page.count(f'data-start="{start}"') == 4  # every chart draws the chosen range
    assert "Backlog as a table" in page and '<tr data-t="' in page
