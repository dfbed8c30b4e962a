"""Health states over synthetic histories: no network, no database."""

from __future__ import annotations

from typing import Any

import pytest

from channels_registry.health import (
    DlqFlag,
    HealthState,
    Point,
    Thresholds,
    counter_progress,
    evaluate,
    theil_sen,
)

NOW = 1_700_000_000.0
STEP = 15.0
THRESHOLDS = Thresholds(
    lag_messages=10_000, lag_seconds=300, min_consumers=1, dlq_depth=0, oldest_age_s=3600
)


def history(n: int = 41, **series: Any) -> list[Point]:
    """``n`` points 15 s apart ending at NOW; each keyword is a constant or a function of i."""
    points = []
    for i in range(n):
        values = {k: (v(i) if callable(v) else v) for k, v in series.items()}
        points.append(Point(t=NOW - (n - 1 - i) * STEP, **values))
    return points


def assess(points: list[Point], previous: str | None = None, thresholds: Thresholds = THRESHOLDS):
    return evaluate(points, thresholds, previous=previous, now=NOW, stale_after_s=60)


HEALTHY = {
    "in_flight": 3,
    "consumers": 2,
    "active_consumers": 2,
    "redelivered": 0,
    "dlq_depth": 0,
    "poison_depth": 0,
}


def test_theil_sen_ignores_one_outlier() -> None:
    series = [(float(i), float(10 * i)) for i in range(10)]
    series[5] = (5.0, -1000.0)
    assert theil_sen(series) == pytest.approx(10.0)


def test_counter_progress_treats_a_decrease_as_a_reset() -> None:
    assert counter_progress([100, 150, 20, 50]) == 50 + 20 + 30
    assert counter_progress([None, 5]) is None


def test_no_points_is_unknown() -> None:
    assert assess([]).state == HealthState.UNKNOWN


def test_old_points_are_stale_never_ok() -> None:
    points = history(5, backlog=0, acked=lambda i: i, **HEALTHY)
    result = evaluate(points, THRESHOLDS, now=NOW + 600, stale_after_s=60)
    assert result.state == HealthState.STALE
    assert "10 min ago" in result.evidence[0]


def test_missing_address_is_unknown_with_evidence() -> None:
    result = assess([Point(t=NOW, exists=False)])
    assert result.state == HealthState.UNKNOWN
    assert "does not exist" in result.evidence[0]


def test_idle_when_nothing_waits_and_nothing_moves() -> None:
    result = assess(history(backlog=0, acked=500, produced=500, **{**HEALTHY, "in_flight": 0}))
    assert result.state == HealthState.IDLE


def test_ok_with_steady_backlog_and_progress() -> None:
    result = assess(history(backlog=lambda i: 40 + (i % 3), acked=lambda i: 100 * i, **HEALTHY))
    assert result.state == HealthState.OK
    assert result.dlq_flags == []


def test_lagging_when_backlog_rises_with_evidence() -> None:
    result = assess(history(backlog=lambda i: 4210 + 141 * i, acked=lambda i: 10 * i, **HEALTHY))
    assert result.state == HealthState.LAGGING
    assert result.evidence[0].startswith("backlog grew 4,210 → 9,850 over 10 min")


def test_lagging_evidence_says_acks_stalled() -> None:
    result = assess(history(backlog=lambda i: 1000 + 50 * i, acked=7, **HEALTHY))
    # Acks not moving with consumers attached is STALLED, the worse state.
    assert result.state == HealthState.STALLED


def test_lagging_on_declared_threshold_alone() -> None:
    result = assess(history(backlog=12_000, acked=lambda i: 500 * i, **HEALTHY))
    assert result.state == HealthState.LAGGING
    assert any("≥ declared 10,000" in e for e in result.evidence)


def test_lagging_on_lag_seconds() -> None:
    result = assess(history(backlog=50, oldest_age_s=900.0, acked=lambda i: 10 * i, **HEALTHY))
    assert result.state == HealthState.LAGGING
    assert any("lag 15 min vs declared 300 s" in e for e in result.evidence)


def test_one_dip_does_not_clear_lagging() -> None:
    def backlog(i: int) -> int:
        return 100 if i == 38 else 1000 + 40 * i

    result = assess(history(backlog=backlog, acked=lambda i: 10 * i, **HEALTHY), previous="ok")
    assert result.state == HealthState.LAGGING


def test_one_spike_does_not_trigger_lagging() -> None:
    def backlog(i: int) -> int:
        return 5000 if i == 39 else 200

    result = assess(history(backlog=backlog, acked=lambda i: 100 * i, **HEALTHY), previous="ok")
    assert result.state == HealthState.OK


def test_hysteresis_keeps_lagging_near_the_threshold() -> None:
    points = history(backlog=9000, acked=lambda i: 500 * i, **HEALTHY)
    assert assess(points, previous="ok").state == HealthState.OK
    held = assess(points, previous="lagging")
    assert held.state == HealthState.LAGGING
    assert "still near" in held.evidence[0]
    assert (
        assess(history(backlog=7000, acked=lambda i: 500 * i, **HEALTHY), previous="lagging").state
        == HealthState.OK
    )


def test_catching_up_with_drain_rate_and_eta() -> None:
    result = assess(history(backlog=lambda i: 9000 - 150 * i, acked=lambda i: 200 * i, **HEALTHY))
    assert result.state == HealthState.CATCHING_UP
    assert result.drain_rate == pytest.approx(10.0)
    assert result.eta_s == pytest.approx(3000 / 10.0)


def test_stalled_when_consumers_attached_but_acks_do_not_move() -> None:
    result = assess(history(backlog=300, acked=1234, **HEALTHY))
    assert result.state == HealthState.STALLED
    assert "no message acknowledged in 10 min" in result.evidence[0]


def test_stopped_without_consumers() -> None:
    result = assess(
        history(backlog=300, acked=1234, **{**HEALTHY, "consumers": 0, "active_consumers": 0})
    )
    assert result.state == HealthState.STOPPED
    assert result.evidence[0] == ("300 messages waiting, 3 unacknowledged, and no active consumer.")


def test_stopped_with_unacknowledged_messages_left_by_a_vanished_consumer() -> None:
    gone = {**HEALTHY, "consumers": 0, "active_consumers": 0, "in_flight": 3}
    result = assess(history(backlog=0, acked=1234, **gone))
    assert result.state == HealthState.STOPPED
    assert result.evidence[0] == (
        "3 delivered but unacknowledged, and no active consumer to finish them."
    )


def test_stopped_when_head_moves_and_nothing_is_acked_and_consumers_unknown() -> None:
    result = assess(history(produced=lambda i: 10 * i, acked=0, backlog=None))
    assert result.state == HealthState.STOPPED


def test_poisoned_when_redeliveries_rise() -> None:
    result = assess(
        history(
            backlog=20,
            acked=lambda i: i,
            delivered=lambda i: 3 * i,
            redelivered=lambda i: 2 * i,
            in_flight=3,
            consumers=2,
            active_consumers=2,
        )
    )
    assert result.state == HealthState.POISONED


def test_retries_with_backoff_by_a_consumer_making_progress_are_not_poison() -> None:
    """NATS-like (no ack count): 40 new messages delivered per step, every one finished but
    for the 40 % nak-ed with a delay, redelivered later: redeliveries are 29 % of deliveries,
    fewer than the messages finished."""
    result = assess(
        history(
            backlog=5,
            delivered=lambda i: 40 * i,
            redelivered=lambda i: 16 * i,
            in_flight=lambda i: 30 + (i % 4),
            consumers=1,
            active_consumers=1,
        )
    )
    assert result.state == HealthState.OK
    assert any("not a poison loop" in e for e in result.evidence), result.evidence


def test_a_poison_loop_finishing_nothing_is_poisoned_without_an_ack_count() -> None:
    """NATS-like: new messages keep arriving, each nak-ed straight back; none is finished, so
    in-flight grows by every new delivery."""
    result = assess(
        history(
            backlog=0,
            delivered=lambda i: 2 * i,
            redelivered=lambda i: 20 * i,
            in_flight=lambda i: 2 * i,
            consumers=1,
            active_consumers=1,
        )
    )
    assert result.state == HealthState.POISONED


def test_poisoned_is_sticky_until_redeliveries_stop() -> None:
    few = history(
        backlog=20,
        acked=lambda i: 10 * i,
        delivered=lambda i: 10 * i,
        redelivered=lambda i: i // 20,
        consumers=1,
        active_consumers=1,
    )
    assert assess(few, previous="ok").state != HealthState.POISONED
    assert assess(few, previous="poisoned").state == HealthState.POISONED
    none = history(
        backlog=20, acked=lambda i: 10 * i, redelivered=5, consumers=1, active_consumers=1
    )
    assert assess(none, previous="poisoned").state != HealthState.POISONED


def test_dlq_flags_inflow_nonempty_and_aged() -> None:
    result = assess(
        history(
            backlog=0,
            acked=lambda i: i,
            dlq_depth=lambda i: i // 10,
            dlq_age_s=7200.0,
            poison_depth=0,
            consumers=1,
            active_consumers=1,
            in_flight=0,
        )
    )
    assert set(result.dlq_flags) == {DlqFlag.INFLOW, DlqFlag.NONEMPTY, DlqFlag.AGED}
    assert any(e == "DLQ grew 0 → 4" for e in result.evidence)
    assert result.severity >= 55


def test_dlq_below_declared_threshold_is_not_flagged() -> None:
    thresholds = Thresholds(dlq_depth=10)
    result = assess(history(backlog=0, acked=1, dlq_depth=3, poison_depth=0), thresholds=thresholds)
    assert DlqFlag.NONEMPTY not in result.dlq_flags
    assert DlqFlag.INFLOW not in result.dlq_flags


def test_unknown_backlog_is_not_reported_as_zero() -> None:
    result = assess(
        history(acked=lambda i: i, produced=lambda i: i, consumers=1, active_consumers=1)
    )
    assert result.state == HealthState.OK
    assert "unknown" in result.evidence[0].lower()


def test_fewer_consumers_than_declared_minimum_is_evidence() -> None:
    thresholds = Thresholds(min_consumers=3)
    result = assess(history(backlog=40, acked=lambda i: 10 * i, **HEALTHY), thresholds=thresholds)
    assert any("fewer than the declared minimum 3" in e for e in result.evidence)


def test_theil_sen_thins_long_series_without_losing_the_trend() -> None:
    series = [(float(i), 3.0 * i + (500.0 if i == 50 else 0.0)) for i in range(200)]
    assert theil_sen(series) == pytest.approx(3.0)


# --- issue 22: the board tells the truth (docs/health.md) -----------------------------------


def test_progress_without_an_ack_count_is_deliveries_so_a_delayed_retry_is_not_a_stall() -> None:
    """NATS: the ack floor stops at a message nak'd with a delay; the adapter reports acked as
    unknown and the delivered stream sequence moves: that is a healthy consumer."""
    points = history(
        backlog=2,
        in_flight=6,
        delivered=lambda i: 100 + 20 * i,
        produced=lambda i: 102 + 20 * i,
        consumers=1,
        active_consumers=1,
    )
    result = assess(points)
    assert result.state == HealthState.OK, result.evidence
    assert result.lag_s == pytest.approx(1.5)  # 2 waiting at 1.3 msg/s, not minutes


def test_a_consumer_that_worked_then_hung_is_stalled_after_the_stall_window() -> None:
    """Nine minutes of acks, then none for two: STALLED, whatever the 10-minute window holds."""
    points = history(backlog=50, acked=lambda i: min(i, 33) * 10, **HEALTHY)
    result = assess(points)
    assert result.state == HealthState.STALLED
    assert "no message acknowledged in 2 min" in result.evidence[0]
    short = evaluate(points, THRESHOLDS, now=NOW, stale_after_s=60, stall_s=150)
    assert short.state != HealthState.STALLED


def test_no_traffic_counter_is_unknown_never_idle() -> None:
    """RabbitMQ over AMQP alone: backlog and consumers, no rates. Nothing can be said about
    traffic: UNKNOWN with the reason, not "Nothing waiting and no traffic"."""
    points = history(backlog=0, consumers=1)
    result = assess(points)
    assert result.state == HealthState.UNKNOWN
    assert result.evidence[0].startswith("Traffic unknown")


def test_idle_needs_more_than_a_statistics_step_even_with_a_short_stall_window() -> None:
    """RabbitMQ's counters move every 5 s: with a 5 s stall window, eight polls a second
    apart in which nothing moved were called IDLE on a busy new queue (the truth harness,
    ``TRUTH_STALL_S=5``). Nothing moving needs IDLE_MIN_S (15 s) before it is idle."""
    from channels_registry.health import IDLE_MIN_S

    def points(n: int) -> list[Point]:
        return [
            Point(t=NOW - (n - 1 - i), backlog=0, in_flight=0, produced=7, acked=7, consumers=1)
            for i in range(n)
        ]

    short = evaluate(points(9), THRESHOLDS, now=NOW, stale_after_s=60, stall_s=5)
    assert short.state == HealthState.UNKNOWN
    assert "too short to call it idle (needs 15 s)" in short.evidence[0]
    enough = evaluate(points(int(IDLE_MIN_S) + 2), THRESHOLDS, now=NOW, stale_after_s=60, stall_s=5)
    assert enough.state == HealthState.IDLE


def test_idle_needs_a_history_as_long_as_the_stall_window() -> None:
    points = history(3, backlog=0, in_flight=0, produced=7, acked=7, consumers=1)
    assert assess(points).state == HealthState.UNKNOWN  # 30 s of stillness is not idle yet
    assert assess(history(8, backlog=0, in_flight=0, produced=7, acked=7)).state == (
        HealthState.IDLE
    )


def test_stopped_when_consumers_are_unknown_and_nothing_is_consumed_while_messages_wait() -> None:
    points = history(backlog=40, delivered=500, produced=lambda i: 500 + i)
    result = assess(points)
    assert result.state == HealthState.STOPPED
    assert "none consumed" in result.evidence[0]
