"""``record_uniform`` (the replay's per-batch audit fast path) stores exactly what
``record_many`` stores: the same canonical texts byte for byte, the same columns, the same
hashes once sealed, and the chain verifies. Hostile values included (COPY's own escape
characters, NUL, lone surrogates, the template's private-use markers)."""

from __future__ import annotations

import datetime as dt
from typing import Any
from unittest import mock

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.actions import Actor, EventSpec, _event_fields, record_many, verify_chain
from audit.batch import _MARK, UniformEvents, record_uniform
from audit.models import AuditEvent

HOSTILE = [
    "tab\there",
    "new\nline\r\n",
    "back\\slash \\N \\t",
    'quote " and \\"',
    "nul \x00 byte",
    "lone \ud800 surrogate",
    "é" * 400,
    "\ue000dlo-slot-0\ue001",  # the template's own marker
    "\ue000dlo-slot-2\ue001",
    "\u2028\ufeff",
    "",
]
text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=80))
value = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), text)
VARYING = ("item", "replay_id", "attempts")


def _spec(slug: str, reason: str, target: str, plan: Any, outcome: str = "success") -> EventSpec:
    return EventSpec(
        "dlq.replay.replayed",
        "dlq.deadletter",
        0,
        "",
        slug,
        reason=reason,
        after={"plan": plan, "item": None, "replay_id": None, "attempts": None, "target": target},
        outcome=outcome,
    )


def _slow(spec: EventSpec, row: tuple[Any, ...], actor: Actor, now: dt.datetime) -> dict[str, Any]:
    after = {**(spec.after or {}), **dict(zip(VARYING, row[2:], strict=True))}
    return _event_fields(
        now=now, actor=actor, action=spec.action, target_type=spec.target_type,
        target_id=row[0], target_repr=row[1], channel_slug=spec.channel_slug,
        reason=spec.reason, before=None, after=after, changes=None, outcome=spec.outcome,
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    slug=text,
    reason=text,
    target=text,
    plan=st.one_of(st.integers(min_value=1, max_value=2**40), text),
    username=text,
    rows=st.lists(
        st.tuples(st.one_of(st.integers(min_value=0), text), text, value, value, value),
        min_size=1,
        max_size=5,
    ),
)
def test_the_template_builds_what_event_fields_builds(
    slug: str, reason: str, target: str, plan: Any, username: str, rows: list[tuple[Any, ...]]
) -> None:
    now = dt.datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=dt.UTC)
    actor = Actor(None, username)
    spec = _spec(slug, reason, target, plan)
    template = UniformEvents.build(spec, VARYING, actor=actor, now=now)
    if template is None:  # only when a shared value carries a marker
        assert any("\ue000" in v for v in (slug, reason, target, username, str(plan)))
        return
    for row in rows:
        assert template.fields(row) == _slow(spec, row, actor, now)


def test_the_relays_shape_is_templated() -> None:
    spec = _spec("orders", "", "orders.retry", 42)
    assert UniformEvents.build(spec, VARYING, actor=Actor.system("r"), now=timezone.now())
    assert _MARK.format(0) not in "orders"


# Everything but the MAC, whose nonce differs per event by design (``verify_chain`` checks it).
FIELDS = [f.name for f in AuditEvent._meta.concrete_fields if f.name not in {"id", "mac"}]


def _stored(first_seq: int, count: int) -> list[dict[str, Any]]:
    rows = AuditEvent.objects.filter(seq__gte=first_seq).order_by("seq").values(*FIELDS)
    return list(rows[:count])


@pytest.mark.django_db
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    reason=text,
    target=text,
    rows=st.lists(st.tuples(st.integers(min_value=0), text, value, value, value), max_size=6),
)
def test_stored_rows_and_hashes_equal_record_many(
    reason: str, target: str, rows: list[tuple[Any, ...]]
) -> None:
    now = timezone.now()
    actor = Actor(None, "replay-relay")
    spec = _spec("orders", reason, target, 7, outcome="failed")
    specs = [
        EventSpec(
            spec.action,
            spec.target_type,
            r[0],
            r[1],
            spec.channel_slug,
            reason=spec.reason,
            after={**(spec.after or {}), **dict(zip(VARYING, r[2:], strict=True))},
            outcome=spec.outcome,
        )  # fmt: skip
        for r in rows
    ]
    start = (AuditEvent.objects.order_by("-seq").values_list("seq", flat=True).first() or 0) + 1
    with (
        mock.patch("audit.actions.timezone.now", return_value=now),
        mock.patch("audit.batch.timezone.now", return_value=now),
    ):
        with transaction.atomic():
            assert record_many(specs, actor=actor) == len(rows)
            expected = _stored(start, len(rows))
            transaction.set_rollback(True)
        assert record_uniform(spec, VARYING, rows, actor=actor) == len(rows)
    assert _stored(start, len(rows)) == expected
    assert verify_chain().ok
