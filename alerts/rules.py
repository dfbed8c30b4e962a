"""The alert rules: pure functions, no database, no network (tested on synthetic histories).

Every channel gets the default rules its declaration allows (``channel_specs``); every broker
gets a poller-stale rule (``broker_spec``). Each evaluation turns facts into one observed
value per rule (``observe``) and moves the rule's alert through its states (``step``):

1. Hysteresis: an inactive rule becomes active when ``value >= enter``; an active one stays
   active while ``value > exit`` (``exit < enter``), so a value hovering at the threshold does
   not flap.
2. ``for_s``: the condition must hold that long (pending) before the alert fires;
   ``clear_for_s``: a firing alert resolves only after the condition has been clear that long.
3. Unknown (``None``) holds: a rule that cannot be measured neither fires nor resolves (a stale
   poller must not resolve fifty alerts, nor raise them).
4. Inhibition: a pending or firing poller-stale alert mutes every channel alert of its broker;
   a few channel rules mute a narrower one with the same cause (``INHIBITS``). A plan awaiting
   approval is never inhibited: it asks a person for a decision whatever the broker does.

Every plan awaiting a second person's approval gets a plan-awaits-approval rule
(``approval_spec``, ``observe_plan``): it fires at once and resolves as soon as the plan is
approved, rejected or cancelled.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from alerts.rule_keys import THRESHOLD_RULES, WINDOW_RULES, RuleKey, Severity
from channels_registry.checks import AlertCoverage
from channels_registry.health import DEFAULT_DLQ_AGE_S, HealthState, fmt_duration, fmt_int

DEFAULT_WINDOW_S = 300
EXIT_RATIO = 0.8

#: source rule → rules it mutes on the same channel (same cause, one page).
INHIBITS: dict[str, set[str]] = {
    RuleKey.NO_CONSUMERS: {RuleKey.STOPPED},
    RuleKey.STOPPED: {RuleKey.BACKLOG, RuleKey.LAG, RuleKey.MESSAGE_AGE},
    RuleKey.STALLED: {RuleKey.BACKLOG, RuleKey.LAG, RuleKey.MESSAGE_AGE},
    RuleKey.POISON_DEPTH: {RuleKey.POISON_INFLOW},
}
#: Rules no other alert mutes (a plan awaiting approval is not caused by the broker).
NEVER_INHIBITED = {RuleKey.APPROVAL_PENDING}


@dataclasses.dataclass(frozen=True)
class RuleSpec:
    """One rule as it applies to one channel (or broker)."""

    rule: str
    severity: str
    enter: float
    exit: float
    threshold: float | None
    for_s: float = 0.0
    clear_for_s: float = 0.0
    window_s: float | None = None

    def is_active(self, value: float | None, was_active: bool) -> bool | None:
        if value is None:
            return None
        return value > self.exit if was_active else value >= self.enter


@dataclasses.dataclass(frozen=True)
class Override:
    enabled: bool = True
    for_s: int | None = None
    threshold: float | None = None
    window_s: int | None = None


def _numeric(
    rule: str, severity: str, threshold: float, *, for_s: float, clear_for_s: float = 60.0
) -> RuleSpec:
    """``value >= threshold`` fires; it clears below ``EXIT_RATIO`` of it."""
    return RuleSpec(
        rule, severity, threshold, threshold * EXIT_RATIO, threshold, for_s, clear_for_s
    )


def _boolean(rule: str, severity: str, *, for_s: float, clear_for_s: float) -> RuleSpec:
    return RuleSpec(rule, severity, 1.0, 0.5, None, for_s, clear_for_s)


def inflow_default_enabled(channel: Any) -> bool:
    """DLQ inflow pages on new dead letters where the depth rule would not: no depth threshold,
    or one above 0. With a threshold of 0 the depth alert already fires on the first letter."""
    return channel.has_dlq and (channel.alert_dlq_depth is None or channel.alert_dlq_depth > 0)


def channel_specs(channel: Any, overrides: Mapping[str, Override] | None = None) -> list[RuleSpec]:
    """The rules of one channel from its declaration, with the admin's overrides applied.

    ``channel`` is anything with a ``Channel``'s declaration attributes."""
    overrides = overrides or {}
    specs: list[RuleSpec] = []
    default_on: dict[str, bool] = {}

    def add(spec: RuleSpec, enabled: bool = True) -> None:
        default_on[spec.rule] = enabled
        specs.append(spec)

    if channel.has_dlq:
        add(
            dataclasses.replace(
                _numeric(RuleKey.DLQ_INFLOW, Severity.WARNING, 1, for_s=0, clear_for_s=0),
                exit=0.0,
                window_s=DEFAULT_WINDOW_S,
            ),
            inflow_default_enabled(channel),
        )
        if channel.alert_dlq_depth is not None:
            # "0 alerts on the first dead letter": depth > threshold, and depths are integers.
            t = float(channel.alert_dlq_depth)
            add(
                RuleSpec(
                    RuleKey.DLQ_DEPTH,
                    Severity.CRITICAL,
                    t + 1,
                    math.floor(t * EXIT_RATIO),
                    t,
                    0.0,
                    0.0,
                )
            )
        add(
            _numeric(
                RuleKey.DLQ_AGE, Severity.WARNING, float(DEFAULT_DLQ_AGE_S), for_s=0, clear_for_s=0
            )
        )
    if channel.poison_address:
        add(
            dataclasses.replace(
                _numeric(RuleKey.POISON_INFLOW, Severity.CRITICAL, 1, for_s=0, clear_for_s=0),
                exit=0.0,
                window_s=DEFAULT_WINDOW_S,
            )
        )
    if channel.poison_address:
        # Poison is never retried into success, so any poison message waiting pages: depth > 0
        # (or > the DLQ threshold when one is declared), the same floor as the DLQ's.
        t = float(channel.alert_dlq_depth or 0)
        add(
            RuleSpec(
                RuleKey.POISON_DEPTH,
                Severity.CRITICAL,
                t + 1,
                math.floor(t * EXIT_RATIO),
                t,
                0.0,
                0.0,
            )
        )
    if channel.has_dlq or channel.poison_address:
        # A declared dead-letter address the broker does not have drops what is sent to it.
        add(_boolean(RuleKey.DEAD_LETTER_MISSING, Severity.CRITICAL, for_s=0, clear_for_s=0))
    if channel.alert_lag_messages:
        add(_numeric(RuleKey.BACKLOG, Severity.WARNING, channel.alert_lag_messages, for_s=120))
    if channel.alert_lag_seconds:
        add(_numeric(RuleKey.LAG, Severity.WARNING, channel.alert_lag_seconds, for_s=120))
    if channel.alert_oldest_age_s:
        add(_numeric(RuleKey.MESSAGE_AGE, Severity.WARNING, channel.alert_oldest_age_s, for_s=120))
    add(_boolean(RuleKey.STALLED, Severity.CRITICAL, for_s=120, clear_for_s=60))
    add(_boolean(RuleKey.STOPPED, Severity.CRITICAL, for_s=60, clear_for_s=60))
    add(_boolean(RuleKey.POISONED, Severity.CRITICAL, for_s=0, clear_for_s=120))
    add(_boolean(RuleKey.NO_CONSUMERS, Severity.CRITICAL, for_s=60, clear_for_s=60))

    result = []
    for spec in specs:
        override = overrides.get(spec.rule)
        enabled = default_on[spec.rule] if override is None else override.enabled
        if not enabled:
            continue
        if override is not None:
            spec = _apply_override(spec, override)
        result.append(spec)
    return result


def _apply_override(spec: RuleSpec, override: Override) -> RuleSpec:
    if override.for_s is not None:
        spec = dataclasses.replace(spec, for_s=float(override.for_s))
    if override.window_s is not None and spec.window_s is not None:
        spec = dataclasses.replace(spec, window_s=float(override.window_s))
    if override.threshold is not None and spec.rule in THRESHOLD_RULES:
        t = float(override.threshold)
        if spec.rule in WINDOW_RULES:
            spec = dataclasses.replace(spec, enter=max(1.0, t), exit=0.0, threshold=max(1.0, t))
        else:
            spec = dataclasses.replace(spec, enter=t, exit=t * EXIT_RATIO, threshold=t)
    return spec


def enabled_rules(channel: Any, overrides: Mapping[str, Override] | None = None) -> set[str]:
    return {s.rule for s in channel_specs(channel, overrides)}


def approval_spec() -> RuleSpec:
    """Plan awaits approval: fires at once (a person is waiting), resolves at once."""
    return _boolean(RuleKey.APPROVAL_PENDING, Severity.WARNING, for_s=0, clear_for_s=0)


def broker_spec(stale_after_s: float) -> RuleSpec:
    """Poller stale: no successful poll for ``stale_after_s``; clears at half of it."""
    return RuleSpec(
        RuleKey.POLLER_STALE, Severity.CRITICAL, stale_after_s, stale_after_s / 2, stale_after_s
    )


# --- Facts and observations --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChannelFacts:
    """What is known about one channel now; ``None`` is unknown. ``fresh`` is False when the
    broker's poller is stale or the channel has never been sampled: then nothing is known."""

    fresh: bool
    state: str = HealthState.UNKNOWN
    evidence: Sequence[str] = ()
    backlog: int | None = None
    in_flight: int | None = None
    consumers: int | None = None
    active_consumers: int | None = None
    lag_s: float | None = None
    oldest_age_s: float | None = None
    #: Dead letters waiting for triage: on the broker's DLQ at the last sample, plus ingested
    #: entries not yet replayed or discarded (counted as of that sample, not twice).
    dlq_depth: int | None = None
    dlq_oldest_age_s: float | None = None
    poison_depth: int | None = None
    #: New dead letters / poison messages per window length (seconds → count).
    dlq_inflow: Mapping[float, int] = dataclasses.field(default_factory=dict)
    poison_inflow: Mapping[float, int] = dataclasses.field(default_factory=dict)
    #: Declared DLQ/poison addresses the broker does not have (None: not checked).
    missing_dead_letter: Sequence[str] | None = None


@dataclasses.dataclass(frozen=True)
class Observation:
    value: float | None
    summary: str
    evidence: tuple[str, ...] = ()


def observe(spec: RuleSpec, facts: ChannelFacts) -> Observation:
    """The rule's value and a one-line summary a human can check against the board."""
    if not facts.fresh:
        return Observation(None, "unknown: no current sample")
    rule = spec.rule
    t = spec.threshold
    evidence = tuple(facts.evidence)
    if rule == RuleKey.DLQ_INFLOW or rule == RuleKey.POISON_INFLOW:
        counts = facts.dlq_inflow if rule == RuleKey.DLQ_INFLOW else facts.poison_inflow
        n = counts.get(spec.window_s or DEFAULT_WINDOW_S)
        noun = "dead letter" if rule == RuleKey.DLQ_INFLOW else "poison message"
        summary = f"{fmt_int(n)} new {noun}(s) in {fmt_duration(spec.window_s)}"
        return Observation(None if n is None else float(n), summary, evidence)
    if rule == RuleKey.DLQ_DEPTH:
        return _num(
            facts.dlq_depth, f"DLQ depth {fmt_int(facts.dlq_depth)} > {fmt_int(t)}", evidence
        )
    if rule == RuleKey.DLQ_AGE:
        age = facts.dlq_oldest_age_s
        # An empty DLQ has no oldest letter: that is a known 0, not unknown.
        if age is None and facts.dlq_depth == 0:
            age = 0.0
        return _num(
            age, f"oldest dead letter {fmt_duration(age)} old (SLO {fmt_duration(t)})", evidence
        )
    if rule == RuleKey.POISON_DEPTH:
        return _num(
            facts.poison_depth,
            f"poison depth {fmt_int(facts.poison_depth)} > {fmt_int(t)}",
            evidence,
        )
    if rule == RuleKey.DEAD_LETTER_MISSING:
        missing = facts.missing_dead_letter
        if missing is None:
            return Observation(None, "dead-letter addresses not checked yet")
        summary = (
            f"declared dead-letter address(es) missing on the broker: {', '.join(missing)}"
            if missing
            else "declared dead-letter addresses exist"
        )
        return Observation(float(bool(missing)), summary, evidence)
    if rule == RuleKey.BACKLOG:
        return _num(facts.backlog, f"backlog {fmt_int(facts.backlog)} ≥ {fmt_int(t)}", evidence)
    if rule == RuleKey.LAG:
        return _num(facts.lag_s, f"lag {fmt_duration(facts.lag_s)} ≥ {fmt_duration(t)}", evidence)
    if rule == RuleKey.MESSAGE_AGE:
        return _num(
            facts.oldest_age_s,
            f"oldest message {fmt_duration(facts.oldest_age_s)} ≥ {fmt_duration(t)}",
            evidence,
        )
    if rule in (RuleKey.STALLED, RuleKey.STOPPED, RuleKey.POISONED):
        if facts.state in (HealthState.UNKNOWN, HealthState.STALE):
            return Observation(None, f"health {facts.state}")
        label = HealthState(rule).label
        return Observation(float(facts.state == rule), f"channel {label.lower()}", evidence)
    if rule == RuleKey.NO_CONSUMERS:
        consumers = facts.active_consumers
        if consumers is None:
            consumers = facts.consumers
        if consumers is None or facts.backlog is None:
            return Observation(None, "consumers or backlog unknown")
        waiting = facts.backlog + (facts.in_flight or 0)
        return Observation(
            float(consumers == 0 and waiting > 0),
            f"no active consumer, {fmt_int(waiting)} message(s) waiting",
            evidence,
        )
    raise ValueError(f"not a channel rule: {rule}")


def _num(value: float | None, summary: str, evidence: tuple[str, ...] = ()) -> Observation:
    return Observation(None if value is None else float(value), summary, evidence)


def observe_poller(
    spec: RuleSpec, *, since_success_s: float | None, failures: int, last_error: str
) -> Observation:
    """``since_success_s``: seconds since the last successful poll (or since the broker was
    declared, when it never succeeded)."""
    evidence = [f"{failures} failed poll(s) in a row: {last_error}"] if failures else []
    return Observation(
        since_success_s,
        f"no successful poll for {fmt_duration(since_success_s)}",
        tuple(evidence),
    )


@dataclasses.dataclass(frozen=True)
class PlanFacts:
    """A replay/discard plan as the approval rule sees it."""

    plan_id: int
    kind: str  # "replay" or "discard"
    awaiting: bool
    status_label: str
    requester: str
    total: int
    channel: str
    reason: str
    url: str


#: How much of a requester's name and reason an alert repeats (the summary has 300 chars).
_NAME_CHARS = 60
_REASON_CHARS = 200


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())  # no line breaks of the requester's in a one-line summary
    return text if len(text) <= n else text[: n - 1] + "…"


def observe_plan(facts: PlanFacts) -> Observation:
    """1 while the plan awaits approval, 0 once it does not. The summary names the plan, its
    requester, its size and the link to its page (the link first-class, never cut off)."""
    who = _clip(facts.requester, _NAME_CHARS) or "unknown"
    head = f"{facts.kind} plan #{facts.plan_id} of {fmt_int(facts.total)} entries by {who}"
    if facts.awaiting:
        summary = f"{head} awaits approval: {facts.url}"
    else:
        summary = f"{head} no longer awaits approval ({facts.status_label.lower()}): {facts.url}"
    evidence = (
        f"channel {_clip(facts.channel, 100)}",
        f"reason: {_clip(facts.reason, _REASON_CHARS)}",
    )
    return Observation(float(facts.awaiting), summary, evidence)


# --- The state machine ---------------------------------------------------------------------


class Event(enum.StrEnum):
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True)
class Track:
    """An alert's timing state; times are epoch seconds."""

    state: str  # "pending" or "firing"
    started_at: float
    fired_at: float | None = None
    clear_since: float | None = None


def step(
    track: Track | None, value: float | None, spec: RuleSpec, now: float
) -> tuple[Track | None, Event | None]:
    """Move one rule's alert by one evaluation. Re-running with the same ``now`` is a no-op."""
    active = spec.is_active(value, was_active=track is not None)
    if active is None:
        return track, None  # unknown holds
    if track is None:
        if not active:
            return None, None
        if spec.for_s <= 0:
            return Track("firing", now, now), Event.FIRING
        return Track("pending", now), Event.PENDING
    if track.state == "pending":
        if not active:
            return None, Event.CANCELLED
        if now - track.started_at >= spec.for_s:
            return Track("firing", track.started_at, now), Event.FIRING
        return track, None
    # Firing.
    if active:
        if track.clear_since is not None:
            return dataclasses.replace(track, clear_since=None), None
        return track, None
    clear_since = track.clear_since if track.clear_since is not None else now
    if now - clear_since >= spec.clear_for_s:
        return None, Event.RESOLVED
    return dataclasses.replace(track, clear_since=clear_since), None


def inhibited(
    alerts: Iterable[tuple[str, int, int | None]],
) -> set[tuple[str, int, int | None]]:
    """Which of the active ``(rule, broker_id, channel_id)`` alerts are muted by another."""
    items = list(alerts)
    stale_brokers = {b for r, b, c in items if r == RuleKey.POLLER_STALE}
    by_channel: dict[int, set[str]] = {}
    for r, _b, c in items:
        if c is not None:
            by_channel.setdefault(c, set()).add(r)
    muted = set()
    for item in items:
        rule, broker_id, channel_id = item
        if channel_id is None or rule in NEVER_INHIBITED:
            continue
        if broker_id in stale_brokers:
            muted.add(item)
            continue
        sources = by_channel.get(channel_id, set())
        if any(rule in INHIBITS.get(src, set()) for src in sources if src != rule):
            muted.add(item)
    return muted


def alert_coverage(channel: Any) -> AlertCoverage:
    """The dead-letter rules ``channel`` really gets, its admin overrides applied: what the
    registry's declaration checks read (registered by ``AlertsConfig.ready``)."""
    overrides = {}
    if channel.pk is not None:
        overrides = {
            o.rule: Override(o.enabled, o.for_s, o.threshold, o.window_s)
            for o in channel.alert_overrides.all()
        }
    enabled = enabled_rules(channel, overrides)
    return AlertCoverage(
        dlq_depth=RuleKey.DLQ_DEPTH in enabled,
        dlq_inflow=RuleKey.DLQ_INFLOW in enabled,
        poison_depth=RuleKey.POISON_DEPTH in enabled,
        poison_inflow=RuleKey.POISON_INFLOW in enabled,
        inflow_by_default=inflow_default_enabled(channel),
    )
