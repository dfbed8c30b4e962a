"""The declaration checks: each violation in DOMAIN.md that a declaration shows."""

from __future__ import annotations

from typing import Any

import pytest

from channels_registry.checks import ERROR, WARNING, check_channel
from channels_registry.models import BrokerKind, Channel
from tests.conftest import GOOD_CONTRACT, make_broker

pytestmark = pytest.mark.django_db


def codes(**overrides: Any) -> dict[str, str]:
    broker = make_broker(kind=overrides.pop("kind", BrokerKind.RABBITMQ))
    channel = Channel(
        broker=broker, name="c", slug="c", address="q", **{**GOOD_CONTRACT, **overrides}
    )
    return {f.code: f.severity for f in check_channel(channel)}


@pytest.mark.parametrize("kind", [BrokerKind.RABBITMQ, BrokerKind.ACTIVEMQ])
def test_good_contract_has_no_findings(kind: str) -> None:
    assert codes(kind=kind) == {}


@pytest.mark.parametrize(
    ("overrides", "code", "severity"),
    [
        ({"semantic": ""}, "semantic-unstated", ERROR),
        ({"idempotency_source": "", "idempotency_key": ""}, "no-idempotency-key", ERROR),
        ({"dedup_ttl_s": None}, "dedup-unbounded", ERROR),
        ({"dedup_ttl_s": 600}, "dedup-ttl-short", ERROR),
        ({"dedup_scope": "per-producer"}, "dedup-per-producer", ERROR),
        ({"retry_max_attempts": None, "retry_ttl_s": None}, "retry-unbounded", ERROR),
        ({"backoff_base_s": None}, "retry-no-backoff", ERROR),
        ({"backoff_factor": 1.0}, "retry-no-backoff", ERROR),
        ({"backoff_cap_s": None}, "backoff-uncapped", WARNING),
        ({"backoff_jitter": False}, "backoff-no-jitter", WARNING),
        ({"dlq_address": "", "dlq_strategies": ["ttl-with-backoff"]}, "no-dlq", ERROR),
        ({"dlq_strategies": []}, "no-dlq-strategy", WARNING),
        ({"alert_dlq_depth": None}, "dlq-no-alert", ERROR),
        ({"dlq_address": "", "poison_address": "p"}, "dlq-alert-without-dlq", ERROR),
        ({"poison_address": ""}, "poison-no-address", ERROR),
        (
            {"poison_address": "", "dlq_strategies": ["ttl-with-backoff"], "schema_name": ""},
            "poison-retried",
            WARNING,
        ),
        ({"mark_in_transaction": False}, "mark-not-transactional", WARNING),
        ({"dlq_records_reason": False}, "dlq-no-metadata", WARNING),
        ({"ordering": ""}, "ordering-unstated", WARNING),
        ({"ordering": "fifo-group"}, "fifo-not-provided", ERROR),
        ({"ordering": "global"}, "global-order-competing", ERROR),
        ({"ordering_key": ""}, "ordering-no-key", ERROR),
        ({"ordering_rationale": ""}, "partition-no-rationale", WARNING),
        (
            {"shared_subscription": True, "dedup_store_shared": False},
            "shared-sub-local-dedup",
            ERROR,
        ),
        ({"retention_s": None}, "no-retention", WARNING),
        ({"schema_version": ""}, "no-schema-version", WARNING),
        ({"alert_lag_messages": None, "alert_lag_seconds": None}, "no-lag-alert", WARNING),
        ({"max_in_flight": None}, "unbounded-in-flight", WARNING),
    ],
)
def test_each_violation_is_found(overrides: dict[str, Any], code: str, severity: str) -> None:
    found = codes(**overrides)
    assert found.get(code) == severity, found


def test_retry_count_alone_without_backoff_or_alert_is_an_error() -> None:
    found = codes(
        dlq_strategies=["retry-count-limit"],
        backoff_base_s=None,
        alert_dlq_depth=None,
        retry_ttl_s=None,
        retry_max_attempts=3,
    )
    assert found["retry-count-only"] == ERROR
    assert found["retry-no-backoff"] == ERROR


def test_at_most_once_needs_no_retry_budget_or_key() -> None:
    found = codes(
        semantic="at-most-once",
        idempotency_source="",
        idempotency_key="",
        retry_max_attempts=None,
        retry_ttl_s=None,
        dlq_address="",
        poison_address="",
        dlq_strategies=[],
        alert_dlq_depth=None,
    )
    assert "retry-unbounded" not in found
    assert "no-idempotency-key" not in found
    assert "no-dlq" not in found


def test_global_order_with_single_active_consumer_is_fine() -> None:
    assert "global-order-competing" not in codes(ordering="global", single_active_consumer=True)


def test_fifo_groups_are_fine_on_nats() -> None:
    assert "fifo-not-provided" not in codes(
        ordering="fifo-group", kind=BrokerKind.NATS, address_group="c"
    )


def test_fifo_groups_are_fine_on_activemq() -> None:
    """ActiveMQ Classic's message groups (JMSXGroupID) pin a group to one consumer."""
    assert "fifo-not-provided" not in codes(ordering="fifo-group", kind=BrokerKind.ACTIVEMQ)


def test_errors_come_first() -> None:
    broker = make_broker()
    channel = Channel(broker=broker, name="c", slug="c", address="q")
    severities = [f.severity for f in check_channel(channel)]
    assert severities == sorted(severities, key=lambda s: s != ERROR)
    assert severities[0] == ERROR


def test_a_dlq_declared_by_several_channels_is_flagged_on_each_against_p5() -> None:
    from channels_registry.actions import do_delete_channel
    from tests.conftest import make_channel

    broker = make_broker()
    first = make_channel(broker, slug="orders-a", address="orders.a")
    assert first.error_count == 0
    # The same orders.dlq and orders.poison: one finding for each.
    second = make_channel(broker, slug="orders-b", address="orders.b")
    shared = [f for f in check_channel(second) if f.code == "dlq-shared-by-channels"]
    assert [(f.severity, f.principle) for f in shared] == [(ERROR, "P5")] * 2
    assert [f.message.split()[0] for f in shared] == ["orders.dlq", "orders.poison"]
    assert all("orders-a" in f.message for f in shared)
    # Saved through the action, the first channel's cached findings name the second too.
    from audit.actions import Actor
    from channels_registry.actions import do_save_channel

    do_save_channel(second, actor=Actor.system("test"), before=second.audit_snapshot())
    first.refresh_from_db()
    assert "dlq-shared-by-channels" in {f["code"] for f in first.findings}
    assert first.error_count == 2
    # Another broker's queue of the same name is another queue.
    make_channel(make_broker(name="other"), slug="orders-c", address="orders.c")
    assert [f.code for f in check_channel(first)].count("dlq-shared-by-channels") == 2
    do_delete_channel(second, actor=Actor.system("test"))
    first.refresh_from_db()
    assert first.error_count == 0 and first.findings == []


def test_activemq_shared_dlq_declared_by_several_channels_is_a_warning() -> None:
    """ActiveMQ.DLQ is drained per origin queue (each channel gets its own letters), so
    sharing it costs the per-channel depth and isolation: a warning, not an error."""
    from tests.conftest import make_channel

    broker = make_broker(kind=BrokerKind.ACTIVEMQ, name="amq")
    shared = {"dlq_address": "ActiveMQ.DLQ", "poison_address": ""}
    make_channel(broker, slug="amq-a", address="orders.a", **shared)
    second = make_channel(broker, slug="amq-b", address="orders.b", **shared)
    found = {f.code: f for f in check_channel(second)}
    assert found["dlq-shared-by-channels"].severity == WARNING
    assert "DLQ.orders.b" in found["dlq-shared-by-channels"].fix
