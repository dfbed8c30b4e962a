"""Health evaluation: pure functions over a window of samples and a channel's declaration.

Nothing here touches the database or the network, so every state is unit-tested on synthetic
histories. ``evaluate`` returns a state, DLQ flags and evidence strings a human can check
against the charts ("backlog grew 4,210 → 9,877 over 10 min while acks stalled").

Design choices:

1. Trends use the Theil–Sen estimator (median of pairwise slopes), so one dip or one spike
   neither clears nor triggers LAGGING / CATCHING_UP.
2. Hysteresis: entering LAGGING needs a significant rise (or a threshold crossed); leaving it
   needs the trend to stop rising *and* every threshold to be below 80 % of its value. POISONED
   is also sticky until redeliveries stop for the whole window.
3. Counters (produced, acked, redelivered...) are monotonic; a decrease is a broker restart,
   counted as a reset (progress = the new value), never as negative progress.
4. ``None`` is unknown: a rule that needs an unknown value does not fire, and the evidence says
   what could not be measured instead of pretending it was zero. Without any traffic counter
   (produced, delivered, acked) nothing is claimed about traffic: no IDLE, no "steady" OK, but
   UNKNOWN with the reason (docs/health.md).
5. Progress is acknowledgements where the broker counts them, else deliveries of new messages:
   a consumer that retries one message later (NATS ``nak`` with a delay, a message parked in a
   retry queue) keeps consuming, and that is progress.
6. Retries are not poison: POISONED needs redeliveries of at least 20 % of the deliveries
   *and* no more messages finished than came back in the window (acknowledgements, else new
   deliveries minus the growth of in-flight). A consumer retrying 40 % of its deliveries with
   a backoff still finishes more than it retries; a poison loop finishes nothing.
7. ``stall_s`` (how long without progress before STALLED / STOPPED) and ``window_s`` (the
   trend window) come from the caller: the poller passes the settings, the tests short ones.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from django.db import models


class HealthState(models.TextChoices):
    UNKNOWN = "unknown", "Unknown"
    STALE = "stale", "Stale"
    IDLE = "idle", "Idle"
    OK = "ok", "OK"
    CATCHING_UP = "catching-up", "Catching up"
    LAGGING = "lagging", "Lagging"
    STALLED = "stalled", "Stalled"
    STOPPED = "stopped", "Stopped"
    POISONED = "poisoned", "Poisoned"


class DlqFlag(models.TextChoices):
    INFLOW = "dlq-inflow", "DLQ inflow"
    AGED = "dlq-aged", "DLQ aged"
    NONEMPTY = "dlq-nonempty", "DLQ non-empty"


#: Worst first: the board sorts by this rank (higher is worse).
SEVERITY: dict[str, int] = {
    HealthState.POISONED: 90,
    HealthState.STOPPED: 80,
    HealthState.STALE: 75,
    HealthState.STALLED: 70,
    HealthState.LAGGING: 60,
    DlqFlag.INFLOW: 55,
    DlqFlag.AGED: 45,
    HealthState.UNKNOWN: 40,
    DlqFlag.NONEMPTY: 35,
    HealthState.CATCHING_UP: 30,
    HealthState.OK: 10,
    HealthState.IDLE: 5,
}

#: Fields of one compact point, in the order ``Point.as_list`` writes them.
POINT_FIELDS = (
    "t",
    "backlog",
    "in_flight",
    "consumers",
    "active_consumers",
    "redelivered",
    "oldest_age_s",
    "produced",
    "delivered",
    "acked",
    "dead_lettered",
    "dlq_depth",
    "dlq_age_s",
    "poison_depth",
    "exists",
    "unacked_age_s",
    "max_deliveries",
)


@dataclasses.dataclass(frozen=True)
class Point:
    """One sample as health sees it. ``t`` is epoch seconds; ``None`` is unknown."""

    t: float
    backlog: int | None = None
    in_flight: int | None = None
    consumers: int | None = None
    active_consumers: int | None = None
    redelivered: int | None = None
    oldest_age_s: float | None = None
    produced: int | None = None
    delivered: int | None = None
    acked: int | None = None
    dead_lettered: int | None = None
    dlq_depth: int | None = None
    dlq_age_s: float | None = None
    poison_depth: int | None = None
    exists: bool = True
    #: Idle time of the oldest delivered-but-unacknowledged message.
    unacked_age_s: float | None = None
    #: Highest delivery count among pending messages (Redis XPENDING), where the broker says.
    max_deliveries: int | None = None

    def as_list(self) -> list[Any]:
        return [getattr(self, name) for name in POINT_FIELDS]

    @classmethod
    def from_list(cls, values: Sequence[Any]) -> Point:
        return cls(**dict(zip(POINT_FIELDS, values, strict=False)))


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Alert thresholds from the declaration; ``None`` means not declared."""

    lag_messages: int | None = None
    lag_seconds: int | None = None
    min_consumers: int | None = None
    dlq_depth: int | None = None
    oldest_age_s: int | None = None
    #: The declared ack / processing timeout and retry budget (attempts).
    ack_timeout_s: int | None = None
    retry_max_attempts: int | None = None

    @classmethod
    def from_channel(cls, channel: Any) -> Thresholds:
        return cls(
            lag_messages=channel.alert_lag_messages,
            lag_seconds=channel.alert_lag_seconds,
            min_consumers=channel.alert_min_consumers,
            dlq_depth=channel.alert_dlq_depth,
            oldest_age_s=channel.alert_oldest_age_s,
            ack_timeout_s=getattr(channel, "ack_timeout_s", None),
            retry_max_attempts=channel.retry_max_attempts,
        )


@dataclasses.dataclass(frozen=True)
class Unresolved:
    """Dead letters the dashboard stored and nobody replayed or discarded yet. Ingest empties the
    broker's DLQ into the store, so these are waiting for triage although the broker's DLQ
    reads 0; DLQ flags count them beside the broker's depth."""

    dlq: int = 0
    poison: int = 0
    #: Epoch seconds of the oldest one's death, None when there is none.
    oldest_t: float | None = None


@dataclasses.dataclass
class Assessment:
    state: HealthState
    dlq_flags: list[DlqFlag] = dataclasses.field(default_factory=list)
    evidence: list[str] = dataclasses.field(default_factory=list)
    #: Net drain rate in messages per second (positive: the backlog is shrinking).
    drain_rate: float | None = None
    #: Seconds until the backlog is empty at the current net drain rate.
    eta_s: float | None = None
    #: Oldest undelivered message age, else backlog / ack rate; seconds.
    lag_s: float | None = None

    @property
    def severity(self) -> int:
        return severity_of(self.state, self.dlq_flags)


def severity_of(state: str, dlq_flags: Sequence[str] = ()) -> int:
    """The board's rank of a state with its DLQ flags (higher is worse): the worst of them.
    Stored on ``ChannelHealth.severity`` so the board sorts in SQL; anything that changes a
    row's state or flags outside a poll recomputes it with ``ChannelHealth.refresh_severity``."""
    return max([SEVERITY.get(state, 0), *(SEVERITY.get(f, 0) for f in dlq_flags)])


# Tunables, deliberately few. WINDOW_S: the trend window. MIN_POINTS: fewer points make no trend.
WINDOW_S = 600.0
MIN_POINTS = 4
SLOPE_MAX_POINTS = 24
STALL_MIN_S = 60.0
#: IDLE needs nothing to move for at least this long, whatever the stall window: counters
#: that move in steps stand still between them (RabbitMQ's statistics: every 5 s by default),
#: so a stall window set near that step (``DLO_HEALTH_STALL_S=5``) called a busy new queue
#: IDLE. Twice the step, and a few seconds more.
IDLE_MIN_S = 15.0
EXIT_RATIO = 0.8
DEFAULT_DLQ_AGE_S = 3600


def theil_sen(series: Sequence[tuple[float, float]]) -> float | None:
    """Median of the pairwise slopes (units per second); None with fewer than two times.

    Quadratic in the points, so a long series is thinned to ``SLOPE_MAX_POINTS`` evenly spaced
    ones first (the estimate stays robust; a poll of 1,000 channels stays cheap)."""
    if len(series) > SLOPE_MAX_POINTS:
        step = (len(series) - 1) / (SLOPE_MAX_POINTS - 1)
        series = [series[round(i * step)] for i in range(SLOPE_MAX_POINTS)]
    slopes = [
        (y2 - y1) / (t2 - t1)
        for i, (t1, y1) in enumerate(series)
        for (t2, y2) in series[i + 1 :]
        if t2 > t1
    ]
    return statistics.median(slopes) if slopes else None


def counter_progress(values: Sequence[int | None]) -> int | None:
    """Total forward movement of a monotonic counter; a decrease is a reset. None if unknown."""
    known = [v for v in values if v is not None]
    if len(known) < 2:
        return None
    total = 0
    for before, after in zip(known, known[1:], strict=False):
        total += after - before if after >= before else after
    return total


def fmt_int(value: float | None) -> str:
    return "unknown" if value is None else f"{round(value):,}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def stale(reason: str) -> Assessment:
    """The assessment of a channel whose broker did not answer: never OK."""
    return Assessment(HealthState.STALE, evidence=[reason])


def evaluate(
    points: Sequence[Point],
    thresholds: Thresholds,
    *,
    previous: str | None = None,
    now: float,
    stale_after_s: float,
    unresolved: Unresolved | None = None,
    stall_s: float = STALL_MIN_S,
    window_s: float = WINDOW_S,
) -> Assessment:
    """Assess the channel from ``points`` (oldest first) at time ``now``.

    Steps: 1. no data / old data → UNKNOWN / STALE; 2. measure the window (trend, counters,
    consumers); 3. DLQ flags; 4. the primary state, worst rule first, with hysteresis against
    ``previous``; 5. drain rate and ETA.
    """
    # 1. Freshness.
    early = _freshness(points, now=now, stale_after_s=stale_after_s)
    if early is not None:
        return early
    # 2. The window.
    w = _measure(points, now=now, stall_s=stall_s, window_s=window_s)
    result = Assessment(HealthState.OK, lag_s=w.lag_s)
    # 3. Dead letters (secondary flags, independent of the primary state).
    result.dlq_flags, dlq_evidence = _dlq_flags(
        w.window or [w.last], thresholds, unresolved or Unresolved(), now
    )
    # 4. Primary state, worst first.
    state, evidence = _primary_state(w, thresholds, previous)
    evidence.extend(_blocked_evidence(w.last, thresholds, state))
    result.state = state
    result.evidence = evidence + dlq_evidence
    # 5. Drain rate and ETA: only meaningful while the backlog shrinks.
    if w.slope is not None:
        result.drain_rate = -w.slope
        if w.slope < 0 and w.backlog:
            result.eta_s = w.backlog / -w.slope
    return result


@dataclasses.dataclass(frozen=True)
class _Window:
    """What step 2 of ``evaluate`` measures over the trend window."""

    last: Point
    window: list[Point]
    span: float
    backlog_series: list[tuple[float, float]]
    slope: float | None
    acks: int | None
    produced: int | None
    redelivered: int | None
    delivered: int | None
    ack_rate: float | None
    backlog: int | None
    lag_s: float | None
    #: Seconds without progress after which a consumer counts as stalled / stopped.
    stall_s: float = STALL_MIN_S
    #: Seconds the progress counter (acks, else deliveries) has not moved; None if unknown.
    quiet_s: float | None = None
    #: Whether the broker reports any traffic counter (produced, delivered, acked) at all.
    traffic_known: bool = True
    #: Messages the consumers finished in the window (see ``_completions``); None if unknown.
    completed: int | None = None

    @property
    def stuck(self) -> bool:
        """No progress for at least the stall window."""
        return self.quiet_s is not None and self.quiet_s >= self.stall_s

    @property
    def looping(self) -> bool:
        """Redeliveries are at least 20 % of the deliveries (and at least 3)."""
        return self.redelivered is not None and self.redelivered >= max(
            3, 0.2 * (self.delivered or 0)
        )

    @property
    def progressing(self) -> bool:
        """The consumers finish more messages than come back: retries (a ``nak`` with a delay,
        a retry queue) by a consumer making progress, not a poison loop."""
        return (
            self.completed is not None
            and self.redelivered is not None
            and self.completed > self.redelivered
        )

    @property
    def waiting(self) -> int:
        return (self.backlog or 0) + (self.last.in_flight or 0)

    @property
    def rise(self) -> float | None:
        return self.slope * self.span if self.slope is not None else None


def _freshness(points: Sequence[Point], *, now: float, stale_after_s: float) -> Assessment | None:
    """Step 1: the assessment when there is no fresh sample of an existing address, else None."""
    if not points:
        return Assessment(HealthState.UNKNOWN, evidence=["No sample yet: waiting for a poll."])
    last = points[-1]
    if now - last.t > stale_after_s:
        return stale(f"Last sample {fmt_duration(now - last.t)} ago: the poller is behind.")
    if not last.exists:
        return Assessment(
            HealthState.UNKNOWN,
            evidence=["The declared address does not exist on the broker."],
        )
    return None


def _measure(
    points: Sequence[Point], *, now: float, stall_s: float = STALL_MIN_S, window_s: float = WINDOW_S
) -> _Window:
    """Step 2: trend, counters and lag over the last ``window_s`` of existing samples."""
    last = points[-1]
    window = [p for p in points if p.t >= now - window_s and p.exists]
    span = window[-1].t - window[0].t if len(window) > 1 else 0.0
    backlog_series = [(p.t, float(p.backlog)) for p in window if p.backlog is not None]
    slope = theil_sen(backlog_series) if len(backlog_series) >= MIN_POINTS else None
    acks = counter_progress([p.acked for p in window])
    if acks is None:
        acks = counter_progress([p.delivered for p in window])
    produced = counter_progress([p.produced for p in window])
    redelivered = counter_progress([p.redelivered for p in window])
    delivered = counter_progress([p.delivered for p in window])
    ack_rate = acks / span if acks is not None and span > 0 else None
    # How long the progress counter (acks, else deliveries) has not moved: a consumer that
    # worked for nine minutes and hung for two has stalled, whatever the trend window says.
    quiet_s = _quiet_span(window, "acked" if last.acked is not None else "delivered")
    backlog = last.backlog
    lag_s = last.oldest_age_s
    if lag_s is None and backlog is not None and ack_rate:
        lag_s = backlog / ack_rate
    return _Window(
        last=last,
        window=window,
        span=span,
        backlog_series=backlog_series,
        slope=slope,
        acks=acks,
        produced=produced,
        redelivered=redelivered,
        delivered=delivered,
        ack_rate=ack_rate,
        backlog=backlog,
        lag_s=lag_s,
        stall_s=stall_s,
        quiet_s=quiet_s,
        traffic_known=any(
            getattr(last, name) is not None for name in ("produced", "delivered", "acked")
        ),
        completed=counter_progress([p.acked for p in window])
        if last.acked is not None
        else _completions(window),
    )


def _completions(window: Sequence[Point]) -> int | None:
    """Messages finished over ``window`` where the broker counts no acknowledgements but does
    count deliveries of new messages (NATS: the delivered stream sequence): the new messages
    delivered minus the growth of those delivered and not yet acknowledged (in flight, a
    ``nak``-ed message waiting for its retry included). A message leaves in-flight only when
    it is acknowledged, terminated or given up: finished either way."""
    points = [p for p in window if p.delivered is not None and p.in_flight is not None]
    if len(points) < 2:
        return None
    delivered = counter_progress([p.delivered for p in points])
    if delivered is None:
        return None
    return max(0, delivered - ((points[-1].in_flight or 0) - (points[0].in_flight or 0)))


def _quiet_span(window: Sequence[Point], field: str) -> float | None:
    """Seconds since ``field`` (a monotonic counter) last changed, over ``window``."""
    values = [(p.t, getattr(p, field)) for p in window if getattr(p, field) is not None]
    if len(values) < 2:
        return None
    last_t, last_v = values[-1]
    start = last_t
    for t, v in reversed(values[:-1]):
        if v != last_v:
            break
        start = t
    return last_t - start


def _primary_state(
    w: _Window, thresholds: Thresholds, previous: str | None
) -> tuple[HealthState, list[str]]:
    """Step 4: the primary state and its evidence, worst rule first: stuck states (poisoned,
    stopped, stalled), then the backlog's trend."""
    evidence: list[str] = []
    state = _stuck_state(w, thresholds, previous, evidence)
    if state is None:
        state = _trend_state(w, thresholds, previous, evidence)
        if w.looping and w.progressing:
            evidence.append(
                f"{fmt_int(w.redelivered)} redeliveries in {fmt_duration(w.span)} while"
                f" {fmt_int(w.completed)} messages were finished: retries by a consumer making"
                " progress, not a poison loop."
            )
    return state, evidence


def _stuck_state(
    w: _Window, thresholds: Thresholds, previous: str | None, evidence: list[str]
) -> HealthState | None:
    """POISONED, STOPPED or STALLED with its evidence appended, else None."""
    last, span, waiting, backlog = w.last, w.span, w.waiting, w.backlog
    # A poison loop: messages keep coming back and the consumers do not get through more
    # than come back. Retries with backoff by a consumer making progress are not poison
    # (docs/health.md, "Retries are not poison"); once POISONED, it stays so until the
    # redeliveries stop.
    poison_enter = w.looping and not w.progressing
    over_budget = (
        thresholds.retry_max_attempts is not None
        and last.max_deliveries is not None
        and last.max_deliveries > thresholds.retry_max_attempts
    )
    if over_budget:
        evidence.append(
            f"A pending message has been delivered {fmt_int(last.max_deliveries)} times, past"
            f" the declared retry budget of {thresholds.retry_max_attempts}: nothing claims it"
            " into the DLQ."
        )
        return HealthState.POISONED
    if poison_enter or (previous == HealthState.POISONED and w.redelivered):
        evidence.append(
            f"{fmt_int(w.redelivered)} redeliveries in {fmt_duration(span)}"
            f" for {fmt_int(w.delivered)} deliveries: messages keep coming back."
        )
        return HealthState.POISONED
    if waiting > 0 and (last.active_consumers == 0 or last.consumers == 0):
        held = last.in_flight or 0
        if held and not backlog:
            evidence.append(
                f"{fmt_int(held)} delivered but unacknowledged, and no active consumer to"
                " finish them."
            )
        elif held:
            evidence.append(
                f"{fmt_int(backlog)} messages waiting, {fmt_int(held)} unacknowledged, and no"
                " active consumer."
            )
        else:
            evidence.append(f"{fmt_int(backlog)} messages waiting and no active consumer.")
        return HealthState.STOPPED
    if (last.active_consumers or last.consumers or 0) > 0 and waiting > 0 and w.stuck:
        evidence.append(
            f"{fmt_int(last.active_consumers or last.consumers)} consumer(s) attached but no"
            f" message acknowledged in {fmt_duration(w.quiet_s)} ({fmt_int(waiting)} waiting)."
        )
        return HealthState.STALLED
    if (
        last.consumers is None
        and last.active_consumers is None
        and w.stuck
        and (waiting > 0 or (w.produced or 0) > 0)
    ):
        if waiting > 0:
            evidence.append(
                f"{fmt_int(waiting)} messages waiting and none consumed in"
                f" {fmt_duration(w.quiet_s)}; the broker does not say whether a consumer is"
                " attached."
            )
        else:
            evidence.append(
                f"{fmt_int(w.produced)} messages produced in {fmt_duration(span)} and none"
                " acknowledged."
            )
        return HealthState.STOPPED
    return None


def _trend_state(
    w: _Window, thresholds: Thresholds, previous: str | None, evidence: list[str]
) -> HealthState:
    """LAGGING (with hysteresis), CATCHING_UP, IDLE or OK, with its evidence appended."""
    rise, series, span, backlog = w.rise, w.backlog_series, w.span, w.backlog
    lagging_reasons = _over_thresholds(w.last, w.lag_s, thresholds, ratio=1.0)
    lagging_hold = _over_thresholds(w.last, w.lag_s, thresholds, ratio=EXIT_RATIO)
    if (
        (rise is not None and rise >= _significant(series))
        or lagging_reasons
        or (previous == HealthState.LAGGING and ((rise is not None and rise > 0) or lagging_hold))
    ):
        if rise is not None and rise > 0 and series:
            tail = " while acks stalled" if w.acks == 0 else ""
            if w.ack_rate:
                tail = f" (acks {w.ack_rate:,.1f}/s)"
            evidence.append(
                f"backlog grew {fmt_int(series[0][1])} → {fmt_int(series[-1][1])}"
                f" over {fmt_duration(span)}{tail}"
            )
        evidence.extend(lagging_reasons or lagging_hold)
        return HealthState.LAGGING
    if backlog and rise is not None and rise < 0 and -rise >= _significant(series):
        evidence.append(
            f"backlog falling {fmt_int(series[0][1])} → {fmt_int(series[-1][1])}"
            f" over {fmt_duration(span)}"
        )
        return HealthState.CATCHING_UP
    if not w.traffic_known:
        # No rates, no acks, no positions: busy, idle and stalled look the same from here.
        level = "unknown" if backlog is None else f"{fmt_int(backlog)}, steady"
        evidence.append(
            f"Traffic unknown: the broker reports no rates or acknowledgements for this"
            f" address, so idle, busy and stalled cannot be told apart (backlog {level})."
        )
        return HealthState.UNKNOWN
    if w.waiting == 0 and not w.produced and not w.acks and backlog is not None:
        needs = max(w.stall_s, IDLE_MIN_S)
        if w.span < needs:
            # Counters that move in steps (RabbitMQ's statistics: every 5 s) stand still over
            # a short history: that is not yet evidence of no traffic.
            evidence.append(
                f"Nothing waiting; no traffic seen in the {fmt_duration(w.span)} sampled so far,"
                f" too short to call it idle (needs {fmt_duration(needs)})."
            )
            return HealthState.UNKNOWN
        evidence.append("Nothing waiting and no traffic in the window.")
        return HealthState.IDLE
    if backlog is None:
        evidence.append("Backlog unknown: the broker does not report it for this address.")
    else:
        evidence.append(f"backlog {fmt_int(backlog)}, steady")
    return HealthState.OK


def _blocked_evidence(last: Point, thresholds: Thresholds, state: HealthState) -> list[str]:
    """Evidence added whatever the primary state: a blocked ack, too few consumers."""
    evidence: list[str] = []
    if (
        thresholds.ack_timeout_s
        and last.unacked_age_s is not None
        and last.unacked_age_s > thresholds.ack_timeout_s
        and last.in_flight
    ):
        evidence.append(
            f"{fmt_int(last.in_flight)} in flight; the oldest has been unacknowledged for"
            f" {fmt_duration(last.unacked_age_s)}, past the declared"
            f" {fmt_duration(thresholds.ack_timeout_s)} ack timeout: a consumer is blocked."
        )
    if (
        thresholds.min_consumers is not None
        and last.active_consumers is not None
        and last.active_consumers < thresholds.min_consumers
        and state not in (HealthState.STOPPED,)
    ):
        evidence.append(
            f"{last.active_consumers} active consumer(s), fewer than the declared minimum"
            f" {thresholds.min_consumers}."
        )
    return evidence


def _significant(series: Sequence[tuple[float, float]]) -> float:
    """How much the backlog must move over the window to count as a trend: 10 messages or 10 %
    of the median level, whichever is larger."""
    level = statistics.median([y for _, y in series]) if series else 0.0
    return max(10.0, 0.1 * level)


def _over_thresholds(
    last: Point, lag_s: float | None, thresholds: Thresholds, *, ratio: float
) -> list[str]:
    reasons = []
    if (
        thresholds.lag_messages is not None
        and last.backlog is not None
        and last.backlog >= thresholds.lag_messages * ratio
        and thresholds.lag_messages > 0
    ):
        reasons.append(
            f"backlog {fmt_int(last.backlog)} ≥ declared {fmt_int(thresholds.lag_messages)}"
            if ratio == 1.0
            else f"backlog {fmt_int(last.backlog)} still near the declared"
            f" {fmt_int(thresholds.lag_messages)}"
        )
    if (
        thresholds.lag_seconds is not None
        and lag_s is not None
        and lag_s >= thresholds.lag_seconds * ratio
        and thresholds.lag_seconds > 0
    ):
        reasons.append(f"lag {fmt_duration(lag_s)} vs declared {thresholds.lag_seconds} s")
    if (
        thresholds.oldest_age_s is not None
        and last.oldest_age_s is not None
        and last.oldest_age_s >= thresholds.oldest_age_s * ratio
        and thresholds.oldest_age_s > 0
    ):
        reasons.append(
            f"oldest message {fmt_duration(last.oldest_age_s)} old vs declared"
            f" {thresholds.oldest_age_s} s"
        )
    return reasons


def _dlq_flags(
    window: Sequence[Point], thresholds: Thresholds, unresolved: Unresolved, now: float
) -> tuple[list[DlqFlag], list[str]]:
    """Inflow from the broker's depths and counters; age and depth from what waits for triage:
    the broker's DLQ and poison queue plus the stored entries not yet resolved."""
    flags: list[DlqFlag] = []
    evidence: list[str] = []
    last = window[-1]
    depths = [p.dlq_depth for p in window if p.dlq_depth is not None]
    poison = [p.poison_depth for p in window if p.poison_depth is not None]
    grew = len(depths) > 1 and depths[-1] > depths[0]
    dead = counter_progress([p.dead_lettered for p in window])
    poison_grew = len(poison) > 1 and poison[-1] > poison[0]
    if grew or poison_grew or (dead or 0) > 0:
        flags.append(DlqFlag.INFLOW)
        if grew:
            evidence.append(f"DLQ grew {fmt_int(depths[0])} → {fmt_int(depths[-1])}")
        if poison_grew:
            evidence.append(f"poison queue grew {fmt_int(poison[0])} → {fmt_int(poison[-1])}")
        if (dead or 0) > 0 and not grew:
            evidence.append(f"{fmt_int(dead)} messages dead-lettered in the window")
    max_age = thresholds.oldest_age_s or DEFAULT_DLQ_AGE_S
    ages = [now - unresolved.oldest_t] if unresolved.oldest_t is not None else []
    if last.dlq_age_s is not None and last.dlq_depth:
        ages.append(last.dlq_age_s)
    if ages and max(ages) >= max_age:
        flags.append(DlqFlag.AGED)
        evidence.append(f"oldest dead letter waits {fmt_duration(max(ages))}")
    limit = thresholds.dlq_depth or 0
    stored = unresolved.dlq + unresolved.poison
    total = (last.dlq_depth or 0) + (last.poison_depth or 0) + stored
    if total > limit:
        flags.append(DlqFlag.NONEMPTY)
        waiting = f"{fmt_int(last.dlq_depth)} in the DLQ, {fmt_int(last.poison_depth)} poison"
        if stored:
            waiting += f", {fmt_int(stored)} stored awaiting triage"
        evidence.append(f"{waiting} (alert above {limit})")
    return flags, evidence
