"""The entry list's rows as HTML (``dlq.triage.entries_html``): byte for byte what the template's
row loop rendered, hostile broker text included, and what the page shows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.template import Context, Template
from django.utils import timezone

from dlq.models import DeadLetter, Source, Status
from dlq.triage.entries_html import entry_rows_html
from tests.conftest import client_for, make_channel
from tests.dlq.conftest import letter, store, update_entries

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert('x')</script>&\"\u202e\x07 e\u0301\u0301\u0301"

#: The row loop as ``templates/dlq/entry_list.html`` had it before the rows moved to Python.
TEMPLATE_ROWS = """{% load dlq_text %}{% load dlo_time %}  {% for e, warn in rows %}
    <tr>
      {% if can_bulk %}<td class="select"><input type="checkbox" name="id" value="{{ e.pk }}" form="bulk" aria-label="Select entry {{ e.pk }}"></td>{% endif %}
      <td data-label="#"><a href="{% url 'dlq:entry_detail' e.pk %}">{{ e.pk }}</a>{% if e.is_repeat_offender %} <span class="badge badge-error" title="replayed {{ e.generation }} times, back every time">repeat offender</span>{% elif e.parent_id %} <span class="badge" title="a replay of #{{ e.parent_id }} that dead-lettered again">replay of #{{ e.parent_id }}</span>{% endif %}</td>
      <td data-label="Channel">{{ e.channel.slug }}</td>
      <td data-label="Source"><span class="badge {% if e.source == 'poison' %}badge-error{% else %}badge-warning{% endif %}">{{ e.get_source_display }}</span></td>
      <td data-label="Status">{{ e.get_status_display }}{% if e.purged_at %} <span class="badge">purged</span>{% elif warn %} <span class="badge badge-warning" title="payload purged at {{ e.eviction_at|date:'Y-m-d H:i' }}">evicts soon</span>{% endif %}</td>
      <td data-label="Type">{% if e.message_type %}<a href="?{% if f.channel %}channel={{ f.channel|urlencode }}&amp;{% endif %}type={{ e.message_type|urlencode }}"><code>{{ e.message_type|visible|truncatechars:60 }}</code></a>{% else %}—{% endif %}</td>
      <td data-label="Reason / error">{{ e.reason|visible|default:"—" }}{% if e.error_class %} · <code>{{ e.error_class|visible|truncatechars:80 }}</code>{% endif %}{% if e.error_message %}<div class="sub dlq-clip">{{ e.error_message|visible|truncatechars:140 }}</div>{% endif %}</td>
      <td data-label="Idempotency key">{% if e.missing_idempotency_key %}<span class="badge badge-error">missing</span>{% else %}<code>{{ e.idempotency_key|visible|truncatechars:40 }}</code>{% endif %}</td>
      <td data-label="Dead-lettered">{{ e.dead_lettered_at|when:"seconds" }}</td>
      <td class="num" data-label="Size">{{ e.size|filesizeformat }}</td>
    </tr>
  {% endfor %}
"""  # noqa: E501


def _entries() -> list[DeadLetter]:
    channel = make_channel(retention_s=3600)
    stored = store(channel, *[letter(b'{"n": %d}' % i + b" " * (i * 700)) for i in range(8)])
    now = timezone.now()
    variants: list[dict[str, Any]] = [
        {"reason": HOSTILE, "error_class": HOSTILE * 6, "error_message": HOSTILE * 30,
         "message_type": f"orders/{HOSTILE} &type=1", "idempotency_key": HOSTILE * 5},
        {"reason": "", "error_class": "", "error_message": "", "message_type": "",
         "missing_idempotency_key": True, "source": Source.POISON},
        {"generation": 3, "status": Status.REPLAYED, "purged_at": now},
        {"parent_id": stored[0].pk, "status": Status.DISCARDED,
         "ingested_at": now - dt.timedelta(seconds=3500)},
        {"status": "weird-status", "source": "weird", "error_message": "x" * 139},
        {"error_message": "y" * 140 + "\u0301" * 5, "error_class": "z" * 81},
        {"message_type": "a b/c?d=e", "idempotency_key": ""},
        {"reason": "\x1b\u200b", "status": Status.FAILED},
    ]  # fmt: skip
    for entry, change in zip(stored, variants, strict=True):
        update_entries([entry], **change)
    return list(DeadLetter.objects.select_related("channel", "state").order_by("-id"))


@pytest.mark.parametrize("can_bulk", [True, False])
@pytest.mark.parametrize("channel", ["", "orders", "a&b <c>/d é"])
def test_rows_are_the_templates_rows_byte_for_byte(can_bulk: bool, channel: str) -> None:
    now = timezone.now()
    rows = [(e, e.near_eviction(now)) for e in _entries()]
    assert any(warn for _, warn in rows)  # the "evicts soon" badge is covered
    context = Context({"rows": rows, "can_bulk": can_bulk, "f": {"channel": channel}})
    expected = Template(TEMPLATE_ROWS).render(context)
    assert "  " + entry_rows_html(rows, channel, can_bulk) + "\n" == expected


def test_list_page_shows_the_rows_escaped(oncall: User) -> None:
    entries = _entries()
    html = client_for(oncall).get("/dead-letters/list/").content.decode()
    assert "<script>" not in html.split("<tbody>", 1)[1]
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;⟨U+202E⟩" in html
    assert f'name="id" value="{entries[0].pk}" form="bulk"' in html
    row_start = '<tr>\n      <td class="select"><input type="checkbox" name="id"'
    assert html.count(row_start) == len(entries)
