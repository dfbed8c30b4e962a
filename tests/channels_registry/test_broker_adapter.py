"""``Broker.adapter()``: the one way to build a broker's adapter (issue 25)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from brokers.nats_jetstream import NatsJetStreamAdapter
from brokers.redis_streams import RedisStreamsAdapter
from channels_registry.models import BrokerConfigError, BrokerKind, installation_id
from tests.conftest import make_broker

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]


@override_settings(DLO_HEALTH_STALL_S=45)
def test_an_adapter_carries_the_installation_and_the_shared_settings() -> None:
    broker = make_broker(
        name="layers25-redis",
        kind=BrokerKind.REDIS,
        url_env="",
        url_secret="redis://127.0.0.1:6379/0",
    )
    adapter = broker.adapter()
    assert isinstance(adapter, RedisStreamsAdapter)
    assert adapter.installation_id == ""  # only NATS names consumers after the installation
    assert adapter.active_idle_s == 45.0


@override_settings(DLO_NATS_DRAIN_ACK_WAIT_S=12, DLO_NATS_DRAIN_MAX_ACK_PENDING=34)
def test_a_nats_adapter_gets_the_drain_settings() -> None:
    broker = make_broker(
        name="layers25-nats", kind=BrokerKind.NATS, url_env="", url_secret="nats://127.0.0.1:4222"
    )
    adapter = broker.adapter()
    assert isinstance(adapter, NatsJetStreamAdapter)
    assert (adapter.drain_ack_wait_s, adapter.drain_max_ack_pending) == (12.0, 34)
    assert adapter.installation_id == installation_id()


def test_given_the_installation_it_reads_no_database(
    django_assert_num_queries: Any,
) -> None:
    """Polling builds adapters on worker threads, which must not query (a thread's query
    waits on the caller's open transaction): it passes the id it read before."""
    broker = make_broker(
        name="layers25-nats2", kind=BrokerKind.NATS, url_env="", url_secret="nats://127.0.0.1:4222"
    )
    with django_assert_num_queries(0):
        adapter = broker.adapter("inst-1")
    assert adapter.installation_id == "inst-1"


def test_without_a_url_it_refuses() -> None:
    with pytest.raises(BrokerConfigError):
        make_broker(name="layers25-none", url_env="", url_secret="").adapter()


def test_no_app_builds_an_adapter_another_way() -> None:
    """``brokers.get_adapter`` is called by ``Broker.adapter`` only (the demo's topology tool
    and comparison build theirs from URLs with no broker row)."""
    allowed = {
        "channels_registry/models.py",
        "dashboard/demo/compare.py",
        "dashboard/demo/topology.py",
    }
    callers = set()
    for package in ("alerts", "audit", "channels_registry", "dashboard", "dlq"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Name | ast.Attribute) and "get_adapter" in (
                    getattr(node, "id", None),
                    getattr(node, "attr", None),
                ):
                    callers.add(str(path.relative_to(ROOT)))
    assert callers <= allowed
