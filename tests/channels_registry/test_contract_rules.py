"""Issue 14, items 1, 4, 5, 6 and 9: the rules the declaration checks used to miss or misjudge,
principle names and whys on every finding, the glossary page and the seeds' preset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from alerts.models import RuleKey
from alerts.rules import ChannelFacts, Override, channel_specs, observe
from channels_registry.checks import ERROR, WARNING, check_channel, redelivery_window_s
from channels_registry.models import Broker, BrokerKind, Channel
from channels_registry.principles import PRINCIPLES, WHY
from tests.conftest import GOOD_CONTRACT, make_broker, make_channel, make_user

pytestmark = pytest.mark.django_db

FIXTURE = Path(__file__).parent / "fixtures" / "anti_patterns.yaml"


def found(**overrides: Any) -> dict[str, str]:
    kind = overrides.pop("kind", BrokerKind.RABBITMQ)
    broker = Broker.objects.filter(kind=kind).first() or make_broker(name=kind, kind=kind)
    channel = Channel(
        broker=broker, name="c", slug="c", address="q", **{**GOOD_CONTRACT, **overrides}
    )
    return {f.code: f.severity for f in check_channel(channel)}


# --- item 1: shared subscription and per-key order --------------------------------------


@pytest.mark.parametrize("kind", [BrokerKind.RABBITMQ, BrokerKind.NATS, BrokerKind.ACTIVEMQ])
def test_shared_subscription_with_per_key_order_is_an_error(kind: str) -> None:
    extra = {"address_group": "g"} if kind == BrokerKind.NATS else {}
    assert found(kind=kind, shared_subscription=True, **extra)["shared-sub-breaks-order"] == ERROR


@pytest.mark.parametrize(
    "pinned", [{"single_active_consumer": True}, {"partition_mechanism": "consistent-hash"}]
)
def test_a_partitioning_mechanism_keeps_per_key_order(pinned: dict[str, Any]) -> None:
    assert "shared-sub-breaks-order" not in found(shared_subscription=True, **pinned)


def test_shared_subscription_without_order_is_fine() -> None:
    assert "shared-sub-breaks-order" not in found(shared_subscription=True, ordering="none")


# --- item 4: retry TTL and the dedup window ----------------------------------------------


def test_ttl_with_backoff_without_a_ttl_is_an_error() -> None:
    assert found(retry_ttl_s=None)["retry-ttl-missing"] == ERROR


def test_retry_count_strategy_without_a_count_is_an_error() -> None:
    result = found(dlq_strategies=["retry-count-limit", "dlq-alert"], retry_max_attempts=None)
    assert result["retry-count-missing"] == ERROR


def test_dedup_ttl_must_outlive_attempts_times_capped_backoff_plus_ack_timeout() -> None:
    # The example: 5 s dedup, 10 attempts, 60 s cap (no retry TTL at all).
    result = found(dedup_ttl_s=5, retry_max_attempts=10, retry_ttl_s=None, dlq_strategies=[])
    assert result["dedup-ttl-short"] == ERROR
    channel = Channel(**{**GOOD_CONTRACT, "retry_ttl_s": None, "retry_max_attempts": 10})
    assert redelivery_window_s(channel) == 10 * 60 + 30
    # 630 s: a 631 s TTL is enough, 630 s is not.
    assert "dedup-ttl-short" not in found(dedup_ttl_s=631, retry_max_attempts=10, retry_ttl_s=None)
    assert "dedup-ttl-short" in found(dedup_ttl_s=630, retry_max_attempts=10, retry_ttl_s=None)


def test_ack_timeout_is_declared_and_the_retry_window_outlasts_it() -> None:
    assert found(ack_timeout_s=None)["ack-timeout-unstated"] == WARNING
    assert found(ack_timeout_s=60, retry_ttl_s=45)["retry-window-below-ack-timeout"] == WARNING


def test_demo_consumer_dead_letters_when_the_declared_retry_window_is_spent() -> None:
    from dashboard.demo.consumers import (
        FIRST_ATTEMPT_HEADER,
        DedupStore,
        Delivery,
        ReferenceConsumer,
        RetryPolicy,
        Route,
    )

    channel = Channel(**{**GOOD_CONTRACT, "retry_ttl_s": 60, "retry_max_attempts": 10})
    policy = RetryPolicy.from_declaration(channel)
    assert policy.ttl_s == 60
    now = [1000.0]
    consumer = ReferenceConsumer("orders", policy, DedupStore(600, 100), clock=lambda: now[0])
    body = (
        b'{"schema_version": "1", "order_id": "o1", "customer": {"id": "c1"}, "amount": 1,'
        b' "demo": {"fail_times": 99}}'
    )
    first = consumer.handle(Delivery(body, {"Idempotency-Key": "k1"}, attempt=1))
    assert first.route == Route.RETRY
    assert first.headers[FIRST_ATTEMPT_HEADER] == "1000.000"
    now[0] = 1061.0  # attempts are left (2 of 10), but the window is spent
    second = consumer.handle(Delivery(body, first.headers, attempt=2))
    assert second.route == Route.DEAD_LETTER
    assert second.headers["reason"] == "retry-window-exhausted"


# --- item 5: poison at parity with the DLQ -----------------------------------------------


def test_missing_poison_queue_with_a_schema_is_an_error() -> None:
    assert found(poison_address="", dlq_strategies=["ttl-with-backoff"])["poison-retried"] == ERROR


def test_poison_gets_a_default_depth_rule_that_fires_on_the_first_message() -> None:
    channel = make_channel()
    specs = {s.rule: s for s in channel_specs(channel)}
    assert RuleKey.POISON_DEPTH in specs
    facts = ChannelFacts(fresh=True, poison_depth=1)
    spec = specs[RuleKey.POISON_DEPTH]
    assert spec.is_active(observe(spec, facts).value, was_active=False)
    quiet = ChannelFacts(fresh=True, poison_depth=0)
    assert not spec.is_active(observe(spec, quiet).value, was_active=False)


def test_disabling_the_poison_inflow_rule_is_a_finding() -> None:
    from alerts.models import RuleOverride

    channel = make_channel()
    RuleOverride.objects.create(channel=channel, rule=RuleKey.POISON_INFLOW, enabled=False)
    codes = {f.code: f.severity for f in check_channel(channel)}
    assert codes["poison-inflow-disabled"] == WARNING
    RuleOverride.objects.create(channel=channel, rule=RuleKey.POISON_DEPTH, enabled=False)
    codes = {f.code: f.severity for f in check_channel(channel)}
    assert codes["poison-no-alert"] == ERROR
    assert {s.rule for s in channel_specs(channel, {"poison-inflow": Override(False)})} >= {
        RuleKey.POISON_DEPTH
    }


# --- item 6: severities ------------------------------------------------------------------


def test_naturally_idempotent_processing_needs_no_key() -> None:
    result = found(idempotency_source="", idempotency_key="", consumer_idempotent=True)
    assert "no-idempotency-key" not in result


def test_exactly_once_with_a_separate_dedup_mark_is_an_error() -> None:
    result = found(semantic="exactly-once-via-idempotency", mark_in_transaction=False)
    assert result["mark-not-transactional"] == ERROR
    assert found(mark_in_transaction=False)["mark-not-transactional"] == WARNING


# --- item 9: principles named and explained ----------------------------------------------


def test_every_finding_names_its_principle_and_says_why() -> None:
    broker = make_broker()
    channel = Channel(broker=broker, name="c", slug="c", address="q")
    findings = [f.as_dict() for f in check_channel(channel)]
    assert findings
    for finding in findings:
        assert finding["principle_name"] == PRINCIPLES[finding["principle"]].name
        assert len(finding["why"]) > 40


def test_every_check_code_has_its_own_why() -> None:
    broker = make_broker()
    worst = Channel(
        broker=broker,
        name="c",
        slug="c",
        address="q",
        **{
            **GOOD_CONTRACT,
            "semantic": "exactly-once-via-idempotency",
            "mark_in_transaction": False,
            "shared_subscription": True,
            "dedup_store_shared": False,
            "ack_timeout_s": None,
            "retry_ttl_s": None,
        },
    )
    for finding in check_channel(worst):
        assert finding.code in WHY, finding.code


def test_channel_page_links_findings_to_the_glossary(client: Client) -> None:
    channel = make_channel(ack_timeout_s=None)
    client.force_login(make_user("viewer", "viewer"))
    page = client.get(channel.get_absolute_url()).content.decode()
    assert 'href="/channels/principles/#P6"' in page
    assert "P6 · Backpressure is bounded" in page
    assert "Why: Without a declared ack" in page
    glossary = client.get("/channels/principles/").content.decode()
    for code, principle in PRINCIPLES.items():
        assert f'id="{code}"' in glossary
        assert principle.name in glossary
    assert "24 hours" in glossary


def test_blank_channel_form_offers_the_seed_defaults(admin_client: Client) -> None:
    blank = admin_client.get("/admin/channels_registry/channel/add/").content.decode()
    assert "?preset=seeds" in blank
    assert "Dedup TTL: 86400" in blank
    preset = admin_client.get("/admin/channels_registry/channel/add/?preset=seeds")
    form = preset.context["adminform"].form
    assert form.initial["dedup_ttl_s"] == 86400
    assert form.initial["backoff_base_s"] == 1.0
    assert form.initial["backoff_factor"] == 2.0
    assert form.initial["backoff_cap_s"] == 60.0
    assert form.initial["retry_max_attempts"] == 3
    assert form.initial["ack_timeout_s"] == 30
    assert form.initial["retry_ttl_s"] == 1800


def test_registry_check_names_every_anti_pattern_of_the_seeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(CommandError):
        call_command("registry", "import", str(FIXTURE), "--check")
    out = capsys.readouterr().out
    expected = {
        "semantic-unstated": "P4 (Delivery semantics are explicit)",
        "no-idempotency-key": "P3 (Consumers are idempotent)",
        "dedup-unbounded": "P6 (Backpressure is bounded)",
        "dedup-per-producer": "P3 (Consumers are idempotent)",
        "retry-no-backoff": "P6 (Backpressure is bounded)",
        "retry-unbounded": "P5 (Dead-letter handling is defined)",
        "dlq-no-alert": "P10 (Messaging is observable)",
        "poison-retried": "P5 (Dead-letter handling is defined)",
        "mark-not-transactional": "P3 (Consumers are idempotent)",
        "dlq-no-metadata": "P5 (Dead-letter handling is defined)",
        "fifo-not-provided": "P2 (Ordering is a property, not an assumption)",
        "shared-sub-breaks-order": "P2 (Ordering is a property, not an assumption)",
        "shared-sub-local-dedup": "P3 (Consumers are idempotent)",
        "no-retention": "P8 (Replay and retention are configured)",
        "no-schema-version": "P1 (Messages are contracts)",
        "partition-no-rationale": "P7 (Partitioning is intentional)",
        "no-lag-alert": "P10 (Messaging is observable)",
        "retry-count-only": "P6 (Backpressure is bounded)",
        "dedup-ttl-short": "P6 (Backpressure is bounded)",
        "ack-timeout-unstated": "P6 (Backpressure is bounded)",
    }
    for code, principle in expected.items():
        assert f"{principle} {code}:" in out, code
    assert Channel.objects.count() == 0


def test_every_observed_finding_code_has_its_own_why() -> None:
    import re

    source = (Path(__file__).parents[2] / "channels_registry" / "observed.py").read_text()
    codes = set(re.findall(r'"observed\.([a-z-]+)"', source))
    assert codes and codes <= set(WHY), codes - set(WHY)
