"""The rule state machine on synthetic histories: no database."""

from __future__ import annotations

import types
from typing import Any

from alerts import rules
from alerts.models import RuleKey
from alerts.rules import ChannelFacts, Event, Override, RuleSpec, Track, step

BACKLOG = rules._numeric(RuleKey.BACKLOG, "warning", 100, for_s=120, clear_for_s=60)


def run(spec: RuleSpec, values: list[float | None], every: float = 15.0) -> list[tuple[float, str]]:
    """Feed one value per evaluation; return (time, event) for each transition."""
    track: Track | None = None
    events = []
    for i, value in enumerate(values):
        now = i * every
        track, event = step(track, value, spec, now)
        if event is not None:
            events.append((now, event.value))
    return events


def test_for_duration_fires_only_after_holding() -> None:
    events = run(BACKLOG, [150] * 10)
    assert events == [(0, "pending"), (120, "firing")]


def test_pending_is_cancelled_when_the_value_drops_below_exit() -> None:
    events = run(BACKLOG, [150, 150, 150, 50, 150])
    assert events == [(0, "pending"), (45, "cancelled"), (60, "pending")]


def test_hysteresis_a_flapping_value_pages_once() -> None:
    # Above the threshold long enough to fire, then hovering around it (95 ↔ 105): the exit
    # level is 80, so it neither resolves nor fires again.
    values: list[float | None] = [150] * 9 + [95, 105] * 20
    events = run(BACKLOG, values)
    assert events == [(0, "pending"), (120, "firing")]


def test_resolve_needs_the_value_clear_for_clear_for_s() -> None:
    values: list[float | None] = [150] * 9 + [10, 10, 90, 10, 10, 10, 10, 10]
    events = run(BACKLOG, values)
    # 10 at 135 starts the clear clock; 90 (> exit 80) at 165 resets it; clear again from 180,
    # resolved 60 s later.
    assert events == [(0, "pending"), (120, "firing"), (240, "resolved")]


def test_unknown_holds_the_state() -> None:
    values: list[float | None] = [150] * 9 + [None] * 20 + [150]
    assert run(BACKLOG, values) == [(0, "pending"), (120, "firing")]
    assert run(BACKLOG, [None, None]) == []


def test_unknown_while_pending_neither_fires_nor_cancels() -> None:
    track, _ = step(None, 150, BACKLOG, 0)
    track2, event = step(track, None, BACKLOG, 500)
    assert (track2, event) == (track, None)


def test_step_is_idempotent_on_re_entry() -> None:
    track, event = step(None, 150, BACKLOG, 0)
    assert event == Event.PENDING
    again, event2 = step(track, 150, BACKLOG, 0)
    assert (again, event2) == (track, None)
    firing, event3 = step(track, 150, BACKLOG, 120)
    assert event3 == Event.FIRING
    assert step(firing, 150, BACKLOG, 120) == (firing, None)


def test_for_zero_fires_at_once_and_resolves_at_once() -> None:
    depth = RuleSpec(RuleKey.DLQ_DEPTH, "critical", 1, 0, 0)
    assert run(depth, [0, 3, 3, 0, 0]) == [(15, "firing"), (45, "resolved")]


def test_dlq_depth_threshold_hysteresis() -> None:
    (spec,) = [
        s for s in rules.channel_specs(_channel(alert_dlq_depth=100)) if s.rule == "dlq-depth"
    ]
    assert (spec.enter, spec.exit) == (101, 80)
    assert run(spec, [101, 90, 81, 100, 80]) == [(0, "firing"), (60, "resolved")]


def _channel(**overrides: Any) -> Any:
    fields = {
        "dlq_address": "orders.dlq",
        "poison_address": "orders.poison",
        "alert_dlq_depth": 0,
        "alert_lag_messages": 10000,
        "alert_lag_seconds": 300,
        "alert_oldest_age_s": 3600,
        "alert_min_consumers": 1,
    }
    fields.update(overrides)
    fields.setdefault("has_dlq", bool(fields["dlq_address"]))  # Channel.has_dlq
    return types.SimpleNamespace(**fields)


def test_default_rules_follow_the_declaration() -> None:
    names = {s.rule for s in rules.channel_specs(_channel())}
    assert names == {
        "dlq-depth",
        "dlq-age",
        "poison-inflow",
        "poison-depth",
        "dead-letter-missing",
        "backlog",
        "lag",
        "message-age",
        "stalled",
        "stopped",
        "poisoned",
        "no-consumers",
    }
    # Threshold 0 already alerts on the first dead letter; a higher or missing one adds inflow.
    assert "dlq-inflow" in rules.enabled_rules(_channel(alert_dlq_depth=50))
    no_depth = rules.enabled_rules(_channel(alert_dlq_depth=None))
    assert "dlq-inflow" in no_depth and "dlq-depth" not in no_depth
    bare = rules.enabled_rules(
        _channel(
            dlq_address="",
            poison_address="",
            alert_lag_messages=None,
            alert_lag_seconds=None,
            alert_oldest_age_s=None,
        )
    )
    assert bare == {"stalled", "stopped", "poisoned", "no-consumers"}


def test_overrides_disable_retune_and_enable() -> None:
    specs = rules.channel_specs(
        _channel(),
        {
            "stalled": Override(enabled=False),
            "backlog": Override(for_s=600),
            "dlq-age": Override(threshold=60),
            "dlq-inflow": Override(enabled=True, window_s=60, threshold=5),
        },
    )
    by_rule = {s.rule: s for s in specs}
    assert "stalled" not in by_rule
    assert by_rule["backlog"].for_s == 600
    assert (by_rule["dlq-age"].enter, by_rule["dlq-age"].threshold) == (60, 60)
    assert (by_rule["dlq-inflow"].window_s, by_rule["dlq-inflow"].enter) == (60, 5)


def test_observe_reads_the_facts_and_unknown_is_none() -> None:
    specs = {s.rule: s for s in rules.channel_specs(_channel(alert_dlq_depth=50))}
    facts = ChannelFacts(
        fresh=True,
        state="stopped",
        backlog=12,
        in_flight=0,
        consumers=0,
        active_consumers=0,
        dlq_depth=51,
        dlq_oldest_age_s=7200.0,
        dlq_inflow={300.0: 4},
    )
    assert rules.observe(specs["dlq-depth"], facts).value == 51
    assert rules.observe(specs["dlq-age"], facts).value == 7200
    assert rules.observe(specs["dlq-inflow"], facts).value == 4
    assert rules.observe(specs["stopped"], facts).value == 1
    assert rules.observe(specs["stalled"], facts).value == 0
    assert rules.observe(specs["no-consumers"], facts).value == 1
    assert rules.observe(specs["lag"], facts).value is None  # lag unknown
    assert "12 message(s) waiting" in rules.observe(specs["no-consumers"], facts).summary
    stale = ChannelFacts(fresh=False)
    assert all(rules.observe(s, stale).value is None for s in specs.values())


def test_a_stale_poller_inhibits_the_channel_alerts_of_its_broker_only() -> None:
    active = [
        ("poller-stale", 1, None),
        ("dlq-depth", 1, 10),
        ("stopped", 1, 11),
        ("dlq-depth", 2, 20),
    ]
    assert rules.inhibited(active) == {("dlq-depth", 1, 10), ("stopped", 1, 11)}


def test_same_cause_rules_inhibit_the_narrower_one() -> None:
    active = [("no-consumers", 1, 10), ("stopped", 1, 10), ("backlog", 1, 10), ("stopped", 1, 11)]
    assert rules.inhibited(active) == {("stopped", 1, 10), ("backlog", 1, 10)}


def test_poller_stale_spec_clears_at_half() -> None:
    spec = rules.broker_spec(60)
    assert run(spec, [10, 70, 50, 20], every=30) == [(30, "firing"), (90, "resolved")]
