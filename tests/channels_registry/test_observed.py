"""Declared vs observed (pure: no broker, no database)."""

from __future__ import annotations

import dataclasses

from channels_registry import checks, observed
from tests.conftest import GOOD_CONTRACT


class _Channel:
    address_display = "orders"

    def __init__(self) -> None:
        for name, value in GOOD_CONTRACT.items():
            setattr(self, name, value)


def test_observed_findings_have_the_declaration_checks_shape() -> None:
    findings = observed.compare(_Channel(), {"kind": "rabbitmq", "exists": False})
    assert findings, "a missing address is a finding"
    fields = [f.name for f in dataclasses.fields(checks.Finding)]
    for finding in findings:
        assert list(finding) == [*fields, "principle_name", "why"]
        assert finding["severity"] in (checks.ERROR, checks.WARNING)


def test_nothing_observed_yet_is_no_finding() -> None:
    assert observed.compare(_Channel(), None) == []


def test_a_topology_with_nothing_but_existence_says_what_was_not_checked() -> None:
    """RabbitMQ over AMQP alone: the queue exists, nothing else is known. Not "matches the
    declaration": a finding naming what was not compared and how to read it."""
    channel = _Channel()
    channel.broker = type("B", (), {"kind": "rabbitmq"})()  # type: ignore[attr-defined]
    findings = observed.compare(channel, {"address": "orders", "exists": True})
    assert [f["code"] for f in findings] == ["observed.unchecked"]
    assert "rabbitmq_management" in findings[0]["fix"]
