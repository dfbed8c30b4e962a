"""The failure groups' rows as HTML (``dlq.triage.groups_html``): byte for byte what the template's
row loop rendered, hostile text, long and non-ASCII errors included, from the tuples the page
loads rather than model instances."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.template import Context, Template
from django.utils import timezone

from dlq.models import FailureGroup
from dlq.triage.groups_html import GROUP_FIELDS, Group, group_rows_html
from dlq.triage.views import _group_rows
from tests.conftest import make_channel
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert('x')</script>&\"\u202e\x07 e\u0301\u0301\u0301"

#: The row loop as ``templates/dlq/group_list.html`` had it before the rows moved to Python,
#: with the broker's text through ``visible`` as the entry list shows it.
TEMPLATE_ROWS = """{% load dlo_time dlq_text %}  {% for r in rows %}
    <tr>
      <td><a href="{% url 'channel_detail' r.group.channel.slug %}">{{ r.group.channel.slug }}</a></td>
      <td>{% if r.group.message_type %}<code>{{ r.group.message_type|visible }}</code> · {% endif %}{{ r.group.reason|default:"—"|visible }}</td>
      <td><a href="{% url 'dlq:entry_list' %}?group={{ r.group.pk }}"><code>{{ r.group.error_class|default:"(no error class)"|visible }}</code></a>{% if r.group.normalized_error %}<div class="sub dlq-clip">{{ r.group.normalized_error|visible|truncatechars:160 }}</div>{% endif %}</td>
      <td class="num"><a href="{% url 'dlq:entry_list' %}?group={{ r.group.pk }}" aria-label="{{ r.group.open_count }} open of {{ r.group.count }}"><strong>{{ r.group.open_count }}</strong></a> / <a href="{% url 'dlq:entry_list' %}?group={{ r.group.pk }}">{{ r.group.count }}</a></td>
      <td class="num"><span class="trend trend-{{ r.trend }}">{{ r.recent }} <span aria-hidden="true">{% if r.trend == "up" %}▲{% elif r.trend == "down" %}▼{% else %}={% endif %}</span></span> <span class="sub">{% if r.trend == "up" %}up from{% elif r.trend == "down" %}down from{% else %}same as{% endif %} {{ r.previous }} the day before</span></td>
      <td>{{ r.group.first_seen|when }}</td>
      <td>{{ r.group.last_seen|when }}</td>
      <td>{% if r.group.sample_id %}<a href="{% url 'dlq:entry_detail' r.group.sample_id %}">#{{ r.group.sample_id }}</a>{% if r.sample %}<div class="sub dlq-clip">{{ r.sample }}</div>{% endif %}{% endif %}</td>
    </tr>
  {% endfor %}
"""  # noqa: E501

ERRORS = [
    "", "x" * 159, "y" * 160, "z" * 161, HOSTILE * 12, "é" * 200, "e\u0301" * 170,
    f"plain {HOSTILE}", "tab\there\x1b[31m",
]  # fmt: skip


def _groups() -> list[FailureGroup]:
    channel = make_channel(slug="orders-eu_2")
    samples = store(
        channel,
        letter(headers={"x-error-message": f"said {HOSTILE}" * 20}),
        letter(headers={"x-error-message": ""}),
    )
    now = timezone.now()
    for n, error in enumerate(ERRORS):
        FailureGroup.objects.create(
            channel=channel,
            fingerprint=f"f{n}",
            reason=["", "rejected", HOSTILE][n % 3],
            error_class=["", "KeyError", HOSTILE][n % 3 - 1],
            normalized_error=error,
            count=10 + n,
            open_count=n % 4,
            first_seen=now - dt.timedelta(hours=n, microseconds=n),
            last_seen=now - dt.timedelta(minutes=n),
            message_type=["", f"orders/{HOSTILE}"][n % 2],
            sample=samples[n % 2] if n % 3 else None,
        )
    return list(FailureGroup.objects.select_related("channel").order_by("-open_count", "-id"))


def test_rows_are_the_templates_rows_byte_for_byte() -> None:
    instances = _groups()
    loaded = FailureGroup.objects.order_by("-open_count", "-id").values_list(*GROUP_FIELDS)
    rows = _group_rows([Group._make(values) for values in loaded])
    assert [r["group"].id for r in rows] == [g.pk for g in instances]
    assert any(r["sample"] for r in rows)  # the sample's error, already through ``visible``
    by_id = {g.pk: g for g in instances}
    template_rows: list[dict[str, Any]] = [{**r, "group": by_id[r["group"].id]} for r in rows]
    for r, trend in zip(template_rows, ["up", "down", "flat", "sideways"] * 3, strict=False):
        r["trend"], r["recent"], r["previous"] = trend, 3, 2
    for r, t in zip(rows, template_rows, strict=True):
        r.update({"trend": t["trend"], "recent": t["recent"], "previous": t["previous"]})
    expected = Template(TEMPLATE_ROWS).render(Context({"rows": template_rows}))
    html = group_rows_html(rows)
    assert "<script>" not in html and "&lt;script&gt;alert(&#x27;x&#x27;)" in html
    assert "\u202e" not in html and "\x07" not in html and "⟨U+202E⟩" in html and "␇" in html
    assert "  " + html + "\n" == expected
