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
