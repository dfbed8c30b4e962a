"""An alert's value at firing and now, as text.

Alerts are rewritten only when their state changes (``alerts.evaluate``), so their summary is
the text of that moment; the board moves on. ``values_now`` reads each firing rule's value as
it is now, by the evaluator's own definitions: depths, lag and ages from the channel's current
health row (the numbers the board shows), plus the stored dead letters the rule counts (new
ones in the rule's window for inflow, unresolved ones for depth and age). ``None`` where a
value is not known (no health row, a stale poller). The alert pages poll every 10 s, so the
value moves with the data.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.db.models import Min

from alerts import rules
from alerts.evaluate import _DLQ, _DLQ_AGE, _POISON, _growth, inflow_counts, load_overrides
from alerts.models import Alert, RuleKey
from channels_registry.health import fmt_duration, fmt_int
from channels_registry.models import ChannelHealth
from dlq.models import OPEN_Q, EntryState, Source

DURATION_RULES = {RuleKey.LAG, RuleKey.MESSAGE_AGE, RuleKey.DLQ_AGE, RuleKey.POLLER_STALE}
STATE_RULES = {RuleKey.STALLED, RuleKey.STOPPED, RuleKey.POISONED, RuleKey.NO_CONSUMERS}
INFLOW_SOURCE: dict[str, str] = {
    RuleKey.DLQ_INFLOW: Source.DLQ,
    RuleKey.POISON_INFLOW: Source.POISON,
}


def value_now(alert: Alert, health: ChannelHealth | None) -> float | None:
    """The rule's value in the channel's current health alone (the stored dead letters that
    ``values_now`` adds are not counted), ``None`` when not known there."""
    if health is None or alert.rule in STATE_RULES:
        return None
    if alert.rule == RuleKey.BACKLOG:
        return _f(health.backlog)
    if alert.rule == RuleKey.LAG:
        return _f(health.lag_s)
    if alert.rule == RuleKey.MESSAGE_AGE:
        return _f(health.oldest_age_s)
    if alert.rule == RuleKey.DLQ_DEPTH:
        return _sum(health.dlq_depth, health.dlq_unresolved)
    if alert.rule == RuleKey.POISON_DEPTH:
        return _sum(health.poison_depth, health.poison_unresolved)
    return None


def _sum(on_broker: int | None, stored: int | None) -> float | None:
    if on_broker is None and stored is None:
        return None
    return float((on_broker or 0) + (stored or 0))


def _f(value: float | None) -> float | None:
    return None if value is None else float(value)


def _window_s(alert: Alert, overrides: dict[int, dict[str, rules.Override]]) -> float:
    """The inflow window the channel's rule counts over (the admin may override it)."""
    if alert.channel is not None:
        for spec in rules.channel_specs(alert.channel, overrides.get(alert.channel.pk)):
            if spec.rule == alert.rule and spec.window_s:
                return spec.window_s
    return float(rules.DEFAULT_WINDOW_S)


def values_now(alerts: Iterable[Alert], now: dt.datetime) -> dict[int, float | None]:
    """Per active alert id, its rule's value now. A fixed handful of queries: the health rows,
    one count per distinct inflow window, one oldest-unresolved aggregate."""
    active = [a for a in alerts if a.is_active and a.channel_id and a.rule not in STATE_RULES]
    if not active:
        return {}
    ids = {a.channel_id for a in active if a.channel_id is not None}
    healths = {h.pk: h for h in ChannelHealth.objects.filter(pk__in=ids).defer("observed")}
    inflow = [a for a in active if a.rule in INFLOW_SOURCE]
    overrides = load_overrides(sorted({a.channel_id for a in inflow if a.channel_id}))
    windows = {a.pk: _window_s(a, overrides) for a in inflow}
    # The evaluator's own count, so "now" is what the rule would compare with its threshold.
    counts = inflow_counts(sorted(ids), set(windows.values()), now)
    oldest: dict[int, dt.datetime] = {}
    if any(a.rule == RuleKey.DLQ_AGE for a in active):
        oldest = dict(
            EntryState.objects.filter(OPEN_Q, channel_id__in=ids, source=Source.DLQ)
            .values("channel_id")
            .annotate(oldest=Min("dead_lettered_at"))
            .order_by()
            .values_list("channel_id", "oldest")
        )
    result: dict[int, float | None] = {}
    for a in active:
        health = healths.get(a.channel_id or 0)
        if health is None:
            result[a.pk] = None
        elif a.rule in INFLOW_SOURCE:
            # As the evaluator counts: letters stored in the window, or the broker's queue
            # growth in it when ingest is behind, whichever is more.
            w = windows[a.pk]
            index = _DLQ if a.rule == RuleKey.DLQ_INFLOW else _POISON
            stored = counts.get((w, health.pk, INFLOW_SOURCE[a.rule]), 0)
            result[a.pk] = float(
                max(stored, _growth(health.window or [], index, now.timestamp() - w))
            )
        elif a.rule == RuleKey.DLQ_AGE:
            ages = []
            if health.pk in oldest:
                ages.append((now - oldest[health.pk]).total_seconds())
            last = health.window[-1] if health.window else None
            if last is not None and last[_DLQ_AGE] is not None and health.dlq_depth:
                ages.append(float(last[_DLQ_AGE]))
            result[a.pk] = max(ages) if ages else (0.0 if health.dlq_depth == 0 else None)
        else:
            result[a.pk] = value_now(a, health)
    return result


def fmt_value(rule: str, value: float | None) -> str:
    if value is None:
        return "unknown"
    return fmt_duration(value) if rule in DURATION_RULES else fmt_int(value)


def describe(alert: Alert, current: float | None) -> str:
    """ "at firing 166 · now 352" (or less, where a value is not known)."""
    parts = []
    if alert.fired_at is not None and alert.fired_value is not None:
        parts.append(f"at firing {fmt_value(alert.rule, alert.fired_value)}")
    if alert.is_active and alert.rule not in STATE_RULES and current is not None:
        parts.append(f"now {fmt_value(alert.rule, current)}")
    return " · ".join(parts)
