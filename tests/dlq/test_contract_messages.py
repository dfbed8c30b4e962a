"""Issue 14, items 8, 11 and 12 without a broker: schemas at ingest, in the preview and at
registration; job-aware triage; delivery counts and AMQP timestamps."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.actions import Actor
from audit.models import AuditEvent
from channels_registry.actions import SchemaRejected, do_register_schema
from channels_registry.models import MessageSchema
from channels_registry.schemas import compatibility_problems
from dlq.models import DeadLetter, Source
from dlq.plans.preview import Selection, build_preview
from dlq.triage.filters import EntryFilter
from tests.conftest import make_channel
from tests.dlq.conftest import letter, store

pytestmark = pytest.mark.django_db

ORDER_V3: dict[str, Any] = {
    "type": "object",
    "required": ["order_id", "amount"],
    "properties": {
        "order_id": {"type": "string"},
        "amount": {"type": "number", "minimum": 0},
        "customer": {"type": "object", "properties": {"id": {"type": "string"}}},
    },
}


def register(version: str, schema: dict[str, Any], name: str = "orders.OrderPlaced") -> Any:
    return do_register_schema(
        MessageSchema(name=name, version=version, schema=schema), actor=Actor.system("test")
    )


# --- item 8: schemas -------------------------------------------------------------------


def test_a_body_failing_the_registered_schema_is_poison_with_the_failing_path(
    client: Client, oncall: User
) -> None:
    register("3", ORDER_V3)
    channel = make_channel()
    good, bad = store(
        channel,
        letter(b'{"order_id": "o1", "amount": 5}'),
        letter(b'{"order_id": "o2", "amount": -1}'),
    )
    assert good.source == Source.DLQ and good.schema_error == {}
    assert bad.source == Source.POISON
    assert bad.schema_error["path"] == "$.amount"
    assert "less than the minimum of 0" in bad.schema_error["message"]
    assert bad.reason.startswith("schema-invalid: -1 is less than the minimum")
    assert bad.error_message.startswith("$.amount: ")
    client.force_login(oncall)
    page = client.get(bad.get_absolute_url()).content.decode()
    assert "fails orders.OrderPlaced</span> at <code>$.amount</code>" in page


def test_the_entrys_own_registered_version_selects_the_schema() -> None:
    register("2", {"type": "object", "required": ["legacy_id"]})
    register("3", ORDER_V3)
    channel = make_channel()
    (entry,) = store(channel, letter(b'{"schema_version": "2", "order_id": "o1", "amount": 1}'))
    assert entry.schema_error["message"] == "'legacy_id' is a required property"


def test_no_registered_schema_changes_nothing() -> None:
    channel = make_channel()
    (entry,) = store(channel, letter(b'{"amount": -1}'))
    assert entry.source == Source.DLQ and entry.schema_error == {}


def test_replay_preview_warns_when_entries_fail_todays_schema(oncall: User) -> None:
    channel = make_channel()
    entries = store(channel, letter(b'{"order_id": "o1"}'), letter(b'{"order_id": "o2"}'))
    register("3", ORDER_V3)  # registered after they were dead-lettered: today's schema
    selection = Selection(EntryFilter(), [e.pk for e in entries])
    preview = build_preview("replay", selection, DeadLetter.objects.all())
    warning = next(w for w in preview.warnings if w.code == "schema_invalid")
    assert warning.count == 2
    assert "today's schema orders.OrderPlaced v3" in warning.message
    assert "'amount' is a required property" in warning.message


@pytest.mark.parametrize(
    ("mode", "change", "broken"),
    [
        ("backward", {"required": ["order_id", "amount", "currency"]}, True),
        ("backward", {"required": ["order_id"]}, False),
        ("forward", {"required": ["order_id"]}, True),
        ("forward", {"required": ["order_id", "amount", "currency"]}, False),
        ("full", {"required": ["order_id"]}, True),
        (
            "backward",
            {"properties": {**ORDER_V3["properties"], "amount": {"type": "string"}}},
            True,
        ),
        ("", {"required": ["anything"]}, False),
    ],
)
def test_compatibility_modes(mode: str, change: dict[str, Any], broken: bool) -> None:
    assert bool(compatibility_problems(ORDER_V3, {**ORDER_V3, **change}, mode)) is broken


def test_registering_an_incompatible_version_is_refused_under_the_declared_mode() -> None:
    make_channel(schema_compatibility="backward")
    register("3", ORDER_V3)
    v4 = json.loads(json.dumps(ORDER_V3))
    v4["required"].append("currency")
    with pytest.raises(SchemaRejected, match=r"\$.currency: newly required"):
        register("4", v4)
    assert not MessageSchema.objects.filter(version="4").exists()
    v4["required"].remove("currency")
    v4["properties"]["currency"] = {"type": "string"}
    register("4", v4)
    assert AuditEvent.objects.filter(action="registry.schema.register").count() == 2


def test_registering_something_that_is_not_a_json_schema_is_refused() -> None:
    with pytest.raises(SchemaRejected, match="Not a valid JSON Schema"):
        register("1", {"type": "no-such-type"})


# --- item 11: job-aware triage ------------------------------------------------------------


SIDEKIQ = {
    "class": "HardWorker",
    "jid": "b4a577edbccf1d805744efa9",
    "args": [1, "fast"],
    "queue": "default",
    "retry_count": 4,
    "error_class": "Net::ReadTimeout",
    "error_message": "Net::ReadTimeout with #<TCPSocket:(closed)>",
}


def test_sidekiq_jobs_are_recognised_out_of_the_box() -> None:
    channel = make_channel(idempotency_source="json-path", idempotency_key="$.jid")
    (entry,) = store(channel, letter(json.dumps(SIDEKIQ).encode(), headers={}))
    assert entry.message_type == "HardWorker"
    assert entry.job["kind"] == "sidekiq" and entry.job["id"] == SIDEKIQ["jid"]
    assert entry.error_class == "Net::ReadTimeout"
    assert entry.redelivery_count == 4
    assert entry.idempotency_key == SIDEKIQ["jid"]


def test_declared_type_header_or_json_path() -> None:
    by_header = make_channel(
        slug="h", address="h", message_type_source="header", message_type_key="X-Event-Type"
    )
    (entry,) = store(by_header, letter(headers={"x-event-type": "OrderPlaced"}))
    assert entry.message_type == "OrderPlaced"
    by_path = make_channel(
        slug="p", address="p", message_type_source="json-path", message_type_key="$.meta.type"
    )
    (entry,) = store(by_path, letter(b'{"meta": {"type": "OrderShipped"}}'))
    assert entry.message_type == "OrderShipped"


def test_the_message_type_splits_failure_groups() -> None:
    channel = make_channel(message_type_source="header", message_type_key="task")
    a, b, c = store(
        channel,
        letter(headers={"task": "billing.charge"}),
        letter(headers={"task": "billing.refund"}),
        letter(headers={"task": "billing.charge"}),
    )
    assert a.group_id == c.group_id != b.group_id
    assert a.group is not None and a.group.message_type == "billing.charge"


# --- item 12: redeliveries and times ------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-delivery-count": 4}, 4),
        ({"x-attempts": "5"}, 5),
        ({"x-retry-count": "2"}, 2),
        ({}, 1),
    ],
)
def test_delivery_counts_beyond_x_death(headers: dict[str, Any], expected: int) -> None:
    channel = make_channel()
    (entry,) = store(channel, letter(headers=headers, redelivery_count=1))
    assert entry.redelivery_count == expected


def test_amqp_timestamp_shows_as_a_time(client: Client, oncall: User) -> None:
    channel = make_channel()
    (entry,) = store(
        channel, letter(properties={"content_type": "application/json", "timestamp": 1700000000})
    )
    client.force_login(oncall)
    page = client.get(entry.get_absolute_url()).content.decode()
    assert "2023-11-14 22:13:20 UTC (1700000000)" in page
