"""The shipped Prometheus rules only use series the exporter really exposes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from alerts.evaluate import do_evaluate_alerts
from channels_registry.models import ChannelSample
from tests.alerts.conftest import set_health
from tests.conftest import make_channel
from tests.dlq.conftest import letter, store

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.django_db
def test_example_rules_reference_exported_series() -> None:
    channel = make_channel()
    now = timezone.now()
    set_health(channel, now, lag_s=3.0, oldest_age_s=2.0)
    ChannelSample.objects.create(channel=channel, taken_at=now, dead_lettered=1)
    store(channel, letter())
    do_evaluate_alerts()
    text = Client().get("/metrics").content.decode()
    exported = set()
    for family in text_string_to_metric_families(text):
        exported.update(s.name for s in family.samples)
    rules = yaml.safe_load((DOCS / "prometheus-rules.yml").read_text())
    used = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert {"alert", "expr", "labels", "annotations"} <= set(rule)
            used.update(re.findall(r"\bdlo_[a-z_]+", rule["expr"]))
    assert used and used <= exported, used - exported
    manager = yaml.safe_load((DOCS / "alertmanager.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert any("DloPollerDown" in m for r in manager["inhibit_rules"] for m in r["source_matchers"])
    assert "DloPollerDown" in names
    assert {"DloAuditCheckpointFailing", "DloAuditSealerBehind"} <= names
