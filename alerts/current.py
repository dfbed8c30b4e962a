"""An alert's value at firing and now, as text.

Alerts are rewritten only when their state changes (``alerts.evaluate``), so their summary is
the text of that moment; the board moves on. The value now comes from the channel's current
health row, the same numbers the board shows (``None`` where a rule's value is not kept there:
inflow windows, the oldest dead letter).
"""

from __future__ import annotations

from alerts.models import Alert, RuleKey
from channels_registry.health import fmt_duration, fmt_int
from channels_registry.models import ChannelHealth

DURATION_RULES = {RuleKey.LAG, RuleKey.MESSAGE_AGE, RuleKey.DLQ_AGE, RuleKey.POLLER_STALE}
STATE_RULES = {RuleKey.STALLED, RuleKey.STOPPED, RuleKey.POISONED, RuleKey.NO_CONSUMERS}


def value_now(alert: Alert, health: ChannelHealth | None) -> float | None:
    """The rule's value in the channel's current health, ``None`` when not known there."""
    if health is None or alert.rule in STATE_RULES:
        return None
    if alert.rule == RuleKey.BACKLOG:
        return _f(health.backlog)
    if alert.rule == RuleKey.LAG:
        return _f(health.lag_s)
    if alert.rule == RuleKey.MESSAGE_AGE:
        return _f(health.oldest_age_s)
    if alert.rule == RuleKey.DLQ_DEPTH:
        if health.dlq_depth is None and health.dlq_unresolved is None:
            return None
        return float((health.dlq_depth or 0) + (health.dlq_unresolved or 0))
    return None


def _f(value: float | None) -> float | None:
    return None if value is None else float(value)


def fmt_value(rule: str, value: float | None) -> str:
    if value is None:
        return "unknown"
    return fmt_duration(value) if rule in DURATION_RULES else fmt_int(value)


def describe(alert: Alert, health: ChannelHealth | None) -> str:
    """ "at firing 166 · now 352" (or less, where a value is not known)."""
    parts = []
    if alert.fired_at is not None and alert.fired_value is not None:
        parts.append(f"at firing {fmt_value(alert.rule, alert.fired_value)}")
    if alert.is_active and alert.rule not in STATE_RULES:
        current = value_now(alert, health)
        if current is not None:
            parts.append(f"now {fmt_value(alert.rule, current)}")
    return " · ".join(parts)
