"""Alert evaluation: the database side of ``alerts.rules``.

``do_evaluate_alerts(now)`` runs every ~15 s (``config.periodic``). It is one transaction
behind a lock on the ``EvaluatorState`` row, so two schedulers never evaluate at once, and
re-running it with the same ``now`` changes nothing (``rules.step`` is idempotent).

Steps: 1. lock; 2. read brokers, channels + health, dead-letter aggregates, overrides, active
alerts, silences (a fixed handful of queries, whatever the channel count); 3. step every rule;
4. resolve alerts whose rule no longer applies; 5. inhibition and silences; 6. queue
notifications (firing once muting allows; resolved where a firing went); 7. save and count.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections import defaultdict
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Min, Q
from django.utils import timezone

from alerts import rules
from alerts.models import (
    ACTIVE_STATES,
    Alert,
    AlertState,
    Destination,
    EvaluatorState,
    Notification,
    RuleKey,
    RuleOverride,
    Silence,
    Transition,
)
from alerts.notify import absolute_url
from alerts.notify_tasks import deliver_notifications_task
from channels_registry.health import POINT_FIELDS, DlqFlag, HealthState
from channels_registry.models import Broker, BrokerPollState, Channel, ChannelHealth
from channels_registry.polling import stale_after_s
from dlq.models import OPEN_Q, DeadLetter, EntryState, Source
from dlq.models.plans import PlanStatus, ReplayPlan

log = logging.getLogger(__name__)

_T = POINT_FIELDS.index("t")
_DLQ = POINT_FIELDS.index("dlq_depth")
_DLQ_AGE = POINT_FIELDS.index("dlq_age_s")
_POISON = POINT_FIELDS.index("poison_depth")


@dataclasses.dataclass
class EvaluationResult:
    rules: int = 0
    fired: int = 0
    resolved: int = 0
    pending: int = 0
    notifications: int = 0
    duration_ms: int = 0

    def summary(self) -> str:
        return (
            f"{self.rules} rule(s) evaluated: {self.fired} fired, {self.resolved} resolved,"
            f" {self.pending} pending, {self.notifications} notification(s) queued"
            f" in {self.duration_ms} ms"
        )


def channel_key(rule: str, channel_id: int) -> str:
    return f"{rule}:c{channel_id}"


def broker_key(broker_id: int) -> str:
    return f"{RuleKey.POLLER_STALE}:b{broker_id}"


def plan_key(plan_id: int) -> str:
    return f"{RuleKey.APPROVAL_PENDING}:p{plan_id}"


def group_wait_s() -> float:
    return float(getattr(settings, "DLO_ALERT_GROUP_WAIT_S", 30))


def load_overrides(channel_ids: list[int] | None = None) -> dict[int, dict[str, rules.Override]]:
    qs = RuleOverride.objects.all()
    if channel_ids is not None:
        qs = qs.filter(channel_id__in=channel_ids)
    result: dict[int, dict[str, rules.Override]] = defaultdict(dict)
    for o in qs:
        result[o.channel_id][o.rule] = rules.Override(o.enabled, o.for_s, o.threshold, o.window_s)
    return result


def _growth(window: list[list[Any]], index: int, since: float) -> int:
    """How much a depth rose to its last value from its lowest point since ``since``."""
    values = [p[index] for p in window if p[_T] >= since and p[index] is not None]
    if len(values) < 2:
        return 0
    return max(0, values[-1] - min(values[:-1]))


def _facts(
    channel: Channel,
    health: ChannelHealth | None,
    window: list[list[Any]],
    now: dt.datetime,
    broker_fresh: bool,
    unresolved: dict[tuple[int, str], dict[str, Any]],
    inflow: dict[tuple[float, int, str], int],
    windows: set[float],
) -> rules.ChannelFacts:
    limit = stale_after_s(channel.broker)
    if (
        health is None
        or not broker_fresh
        or health.state == HealthState.STALE
        or health.last_sample_at is None
        or (now - health.last_sample_at).total_seconds() > limit
    ):
        return rules.ChannelFacts(fresh=False)
    last = window[-1] if window else None
    dlq = unresolved.get((channel.pk, Source.DLQ), {})
    poison = unresolved.get((channel.pk, Source.POISON), {})
    # The broker's DLQ depth at the sample, plus entries ingested up to the sample: letters
    # ingested since were still on the broker then, so they are not counted twice.
    dlq_depth = (health.dlq_depth or 0) + dlq.get("before", 0)
    oldest = dlq.get("oldest")
    ages = [(now - oldest).total_seconds()] if oldest is not None else []
    if last is not None and last[_DLQ_AGE] is not None and health.dlq_depth:
        ages.append(float(last[_DLQ_AGE]))
    now_s = now.timestamp()
    dlq_in: dict[float, int] = {}
    poison_in: dict[float, int] = {}
    for w in windows:
        since = now_s - w
        dlq_in[w] = max(inflow.get((w, channel.pk, Source.DLQ), 0), _growth(window, _DLQ, since))
        poison_in[w] = max(
            inflow.get((w, channel.pk, Source.POISON), 0), _growth(window, _POISON, since)
        )
    return rules.ChannelFacts(
        fresh=True,
        state=health.state,
        evidence=tuple(health.evidence or ()),
        backlog=health.backlog,
        in_flight=health.in_flight,
        consumers=health.consumers,
        active_consumers=health.active_consumers,
        lag_s=health.lag_s,
        oldest_age_s=health.oldest_age_s,
        dlq_depth=dlq_depth if channel.has_dlq else None,
        dlq_oldest_age_s=max(ages) if ages else None,
        poison_depth=(health.poison_depth or 0) + poison.get("before", 0),
        dlq_inflow=dlq_in,
        poison_inflow=poison_in,
        missing_dead_letter=missing_dead_letter(health),
    )


def missing_dead_letter(health: ChannelHealth) -> list[str]:
    """Declared dead-letter addresses the last poll found missing (from its observed findings)."""
    for finding in health.observed_findings or []:
        if finding.get("code") == "observed.dead-letter-missing":
            return [str(a) for a in finding.get("addresses") or []]
    return []


def _dead_letter_aggregates(
    channels: list[Channel], poll_times: dict[int, dt.datetime | None]
) -> dict[tuple[int, str], dict[str, Any]]:
    """Unresolved entries per (channel, source): count ingested up to the broker's last sample,
    and the oldest dead-letter time. One query per broker (brokers are few)."""
    result: dict[tuple[int, str], dict[str, Any]] = {}
    by_broker: dict[int, list[int]] = defaultdict(list)
    for c in channels:
        if c.has_dlq or c.poison_address:
            by_broker[c.broker_id].append(c.pk)
    for broker_id, ids in by_broker.items():
        sampled = poll_times.get(broker_id)
        before = Q(ingested_at__lte=sampled) if sampled is not None else Q(entry__isnull=False)
        rows = (
            EntryState.objects.filter(OPEN_Q, channel_id__in=ids)
            .values("channel_id", "source")
            .annotate(before=Count("entry_id", filter=before), oldest=Min("dead_lettered_at"))
            .order_by()
        )
        for row in rows:
            result[(row["channel_id"], row["source"])] = dict(row)
    return result


def inflow_counts(
    channel_ids: list[int], windows: set[float], now: dt.datetime
) -> dict[tuple[float, int, str], int]:
    result: dict[tuple[float, int, str], int] = {}
    if not channel_ids:
        return result
    for w in windows:
        rows = (
            DeadLetter.objects.filter(
                channel_id__in=channel_ids, dead_lettered_at__gte=now - dt.timedelta(seconds=w)
            )
            .values("channel_id", "source")
            .annotate(n=Count("id"))
            .order_by()
        )
        for row in rows:
            result[(w, row["channel_id"], row["source"])] = row["n"]
    return result


def _track(alert: Alert | None) -> rules.Track | None:
    if alert is None:
        return None
    return rules.Track(
        alert.state,
        alert.started_at.timestamp(),
        alert.fired_at.timestamp() if alert.fired_at else None,
        alert.clear_since.timestamp() if alert.clear_since else None,
    )


def _at(epoch: float | None) -> dt.datetime | None:
    return None if epoch is None else dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


class _Run:
    """The bookkeeping of one evaluation."""

    def __init__(self, now: dt.datetime, active: dict[str, Alert]) -> None:
        self.now = now
        self.active = active
        self.seen: set[str] = set()
        self.new: list[Alert] = []
        self.changed: dict[int, Alert] = {}
        self.deleted: list[int] = []
        self.resolved: list[Alert] = []
        self.result = EvaluationResult()

    def apply(
        self,
        key: str,
        spec: rules.RuleSpec,
        obs: rules.Observation,
        broker: Broker,
        channel: Channel | None,
    ) -> None:
        self.seen.add(key)
        self.result.rules += 1
        alert = self.active.get(key)
        track, event = rules.step(_track(alert), obs.value, spec, self.now.timestamp())
        evidence = [obs.summary, *obs.evidence]
        if event is None:
            # Steady alerts are not rewritten every 15 s: only a moving clear clock is saved.
            if alert is not None and track is not None:
                clear_since = _at(track.clear_since)
                if clear_since != alert.clear_since:
                    alert.clear_since = clear_since
                    alert.last_evaluated_at = self.now
                    self.changed[alert.pk] = alert
            return
        if event == rules.Event.CANCELLED:
            assert alert is not None
            self.deleted.append(alert.pk)
            del self.active[key]
            return
        if event == rules.Event.RESOLVED:
            assert alert is not None
            alert.state = AlertState.RESOLVED
            alert.resolved_at = self.now
            alert.resolve_evidence = evidence
            alert.value = obs.value
            alert.clear_since = None
            alert.last_evaluated_at = self.now
            self.changed[alert.pk] = alert
            self.resolved.append(alert)
            del self.active[key]
            self.result.resolved += 1
            return
        assert track is not None
        if alert is None:
            alert = Alert(
                rule=spec.rule,
                key=key,
                broker=broker,
                channel=channel,
                severity=spec.severity,
                threshold=spec.threshold,
                started_at=dt.datetime.fromtimestamp(track.started_at, tz=dt.UTC),
            )
            self.new.append(alert)
            self.active[key] = alert
        elif alert.pk is not None:
            self.changed[alert.pk] = alert
        alert.state = track.state
        alert.summary = obs.summary[:300]
        alert.value = obs.value
        alert.last_evaluated_at = self.now
        if event == rules.Event.FIRING:
            alert.fired_at = self.now
            alert.fired_value = obs.value
            alert.evidence = evidence
            self.result.fired += 1
        else:
            self.result.pending += 1

    def retire(self, key: str, reason: str) -> None:
        """The rule no longer applies (disabled, channel gone): a firing alert resolves."""
        alert = self.active.pop(key)
        if alert.state == AlertState.PENDING:
            self.deleted.append(alert.pk)
            return
        alert.state = AlertState.RESOLVED
        alert.resolved_at = self.now
        alert.resolve_evidence = [reason]
        alert.last_evaluated_at = self.now
        self.changed[alert.pk] = alert
        self.resolved.append(alert)
        self.result.resolved += 1


def do_evaluate_alerts(now: dt.datetime | None = None) -> EvaluationResult:
    """Evaluate every rule once (see the module docstring)."""
    started = time.monotonic()
    now = now or timezone.now()
    EvaluatorState.objects.get_or_create(pk=1)
    with transaction.atomic():
        # 1. Lock: concurrent evaluations queue here.
        EvaluatorState.objects.select_for_update().get(pk=1)
        run = _evaluate(now)
        run.result.duration_ms = round((time.monotonic() - started) * 1000)
        EvaluatorState.objects.filter(pk=1).update(
            last_run_at=now,
            last_duration_ms=run.result.duration_ms,
            evaluations=_inc("evaluations"),
            alerts_fired=_inc("alerts_fired", run.result.fired),
            alerts_resolved=_inc("alerts_resolved", run.result.resolved),
        )
        if run.result.notifications:
            transaction.on_commit(deliver_notifications_task.delay, robust=True)
    return run.result


def _inc(field: str, by: int = 1) -> Any:
    from django.db.models import F

    return F(field) + by


def _evaluate(now: dt.datetime) -> _Run:
    """Steps 2-7 of one evaluation, inside ``do_evaluate_alerts``' transaction."""
    brokers = list(Broker.objects.filter(enabled=True))
    poll_states = {s.broker_id: s for s in BrokerPollState.objects.filter(broker__in=brokers)}
    active = {
        a.key: a
        for a in Alert.objects.filter(state__in=ACTIVE_STATES).select_related("channel", "broker")
    }
    run = _Run(now, active)
    fresh = _poller_rules(run, brokers, poll_states)
    _channel_rules(run, poll_states, fresh)
    _approval_rules(run)
    # 4. Alerts whose rule no longer applies.
    for key in [k for k in run.active if k not in run.seen]:
        run.retire(key, "The rule no longer applies: disabled, or the channel was removed.")
    _mute(run)
    # 7 (first half). Save, so new alerts have ids for their notifications.
    if run.deleted:
        Alert.objects.filter(pk__in=run.deleted, state=AlertState.PENDING).delete()
    Alert.objects.bulk_create(run.new)
    _notify(run)
    _save(run)
    return run


def _poller_rules(
    run: _Run, brokers: list[Broker], poll_states: dict[int, BrokerPollState]
) -> dict[int, bool]:
    """3a. Poller stale, per broker. Returns, per broker, whether its poller is fresh."""
    fresh: dict[int, bool] = {}
    for broker in brokers:
        state = poll_states.get(broker.pk)
        limit = stale_after_s(broker)
        since = state.last_success_at if state and state.last_success_at else broker.created_at
        spec = rules.broker_spec(limit)
        obs = rules.observe_poller(
            spec,
            since_success_s=(run.now - since).total_seconds(),
            failures=state.consecutive_failures if state else 0,
            last_error=(state.last_error if state else "")[:200],
        )
        key = broker_key(broker.pk)
        run.apply(key, spec, obs, broker, None)
        fresh[broker.pk] = key not in run.active
    return fresh


def _channel_rules(
    run: _Run, poll_states: dict[int, BrokerPollState], fresh: dict[int, bool]
) -> None:
    """2 and 3b. Read the enabled channels and apply their rules."""
    now = run.now
    channels = list(
        Channel.objects.filter(enabled=True, broker__enabled=True)
        .select_related("broker", "health")
        # observed_findings stays: the dead-letter-missing rule reads it.
        .defer("health__spark", "health__observed", "health__window")
        .order_by("pk")
    )
    # The sample windows (for DLQ growth on the broker not yet ingested) only of channels
    # whose health saw dead-letter inflow: parsing every window would dominate the run.
    flagged = [
        c.pk
        for c in channels
        if getattr(c, "health", None) is not None and DlqFlag.INFLOW in (c.health.dlq_flags or [])
    ]
    windows_by_channel = dict(
        ChannelHealth.objects.filter(pk__in=flagged).values_list("pk", "window")
    )
    overrides = load_overrides()
    specs = {c.pk: rules.channel_specs(c, overrides.get(c.pk)) for c in channels}
    windows = {s.window_s for ss in specs.values() for s in ss if s.window_s is not None}
    poll_times = {b: s.last_success_at for b, s in poll_states.items()}
    unresolved = _dead_letter_aggregates(channels, poll_times)
    dead_channels = [c.pk for c in channels if c.has_dlq or c.poison_address]
    inflow = inflow_counts(dead_channels, windows, now)
    for channel in channels:
        health: ChannelHealth | None = getattr(channel, "health", None)
        facts = _facts(
            channel,
            health,
            windows_by_channel.get(channel.pk) or [],
            now,
            fresh.get(channel.broker_id, False),
            unresolved,
            inflow,
            windows,
        )
        for spec in specs[channel.pk]:
            obs = rules.observe(spec, facts)
            run.apply(channel_key(spec.rule, channel.pk), spec, obs, channel.broker, channel)


def _approval_rules(run: _Run) -> None:
    """3c. Plan awaits approval, per plan: the plans awaiting approval, and the plans of the
    active approval alerts (approved, rejected or cancelled since: they resolve). One query.

    The alert's channel is the plan's, so destinations route it by owner team and a silence
    of the channel or of the rule mutes it, as every channel alert. Disabled channels and
    brokers count too: their plans still wait for a person."""
    prefix = f"{RuleKey.APPROVAL_PENDING}:p"
    tracked = [int(k.removeprefix(prefix)) for k in run.active if k.startswith(prefix)]
    plans = (
        ReplayPlan.objects.filter(Q(status=PlanStatus.AWAITING_APPROVAL) | Q(pk__in=tracked))
        .select_related("channel__broker")
        .defer("selection", "freeze_spec", "warnings")
        .order_by("pk")
    )
    spec = rules.approval_spec()
    for plan in plans:
        facts = rules.PlanFacts(
            plan_id=plan.pk,
            kind=plan.get_kind_display().lower(),
            awaiting=plan.status == PlanStatus.AWAITING_APPROVAL,
            status_label=plan.get_status_display(),
            requester=plan.requested_by_username,
            total=plan.total,
            channel=plan.channel.slug,
            reason=plan.reason,
            url=absolute_url(plan.get_absolute_url()),
        )
        channel = plan.channel
        run.apply(plan_key(plan.pk), spec, rules.observe_plan(facts), channel.broker, channel)


def _mute(run: _Run) -> None:
    """5. Inhibition and silences."""
    silences = list(Silence.objects.filter(starts_at__lte=run.now, ends_at__gt=run.now))
    muted = rules.inhibited((a.rule, a.broker_id, a.channel_id) for a in run.active.values())
    for alert in run.active.values():
        inhibited = (alert.rule, alert.broker_id, alert.channel_id) in muted
        silence = next((s for s in silences if s.matches(alert.channel_id, alert.rule)), None)
        if inhibited != alert.inhibited or (silence.pk if silence else None) != alert.silence_id:
            alert.inhibited = inhibited
            alert.silence = silence
            if alert.pk is not None:
                run.changed[alert.pk] = alert


def _notify(run: _Run) -> None:
    """6. Notifications: firing alerts not yet notified, and resolutions to the destinations
    that heard of the firing."""
    now = run.now
    destinations = list(Destination.objects.filter(enabled=True))
    notifications: list[Notification] = []
    due = now + dt.timedelta(seconds=group_wait_s())
    new_ids = {a.pk for a in run.new}
    for alert in run.active.values():
        if alert.state != AlertState.FIRING or alert.notified or alert.muted:
            continue
        alert.notified = True
        if alert.pk not in new_ids:
            run.changed[alert.pk] = alert
        for dest in destinations:
            if dest.wants(alert):
                notifications.append(_notification(alert, Transition.FIRING, dest, now, due))
    if run.resolved:
        went = Notification.objects.filter(
            alert__in=[a.pk for a in run.resolved], transition=Transition.FIRING
        ).values_list("alert_id", "destination_id")
        targets: dict[int, set[int]] = defaultdict(set)
        for alert_id, dest_id in went:
            targets[alert_id].add(dest_id)
        by_id = {d.pk: d for d in destinations}
        for alert in run.resolved:
            for dest_id in targets.get(alert.pk, set()):
                target = by_id.get(dest_id)
                if target is not None and target.send_resolved:
                    notifications.append(
                        _notification(alert, Transition.RESOLVED, target, now, due)
                    )
    Notification.objects.bulk_create(notifications, ignore_conflicts=True)
    run.result.notifications = len(notifications)


_SAVED_FIELDS = [
    "state",
    "summary",
    "value",
    "fired_value",
    "evidence",
    "resolve_evidence",
    "fired_at",
    "resolved_at",
    "clear_since",
    "last_evaluated_at",
    "inhibited",
    "silence",
    "notified",
]


def _save(run: _Run) -> None:
    """7. Save the changed alerts (the new ones were created before the notifications)."""
    new_ids = {a.pk for a in run.new}
    changed = [a for pk, a in run.changed.items() if pk not in new_ids]
    if changed:
        Alert.objects.bulk_update(changed, _SAVED_FIELDS, batch_size=500)
    if run.new and any(a.notified for a in run.new):
        Alert.objects.filter(pk__in=[a.pk for a in run.new if a.notified]).update(notified=True)


def _notification(
    alert: Alert, transition: str, dest: Destination, now: dt.datetime, due: dt.datetime
) -> Notification:
    return Notification(
        alert=alert,
        transition=transition,
        destination=dest,
        group_key=f"broker:{alert.broker_id}",
        created_at=now,
        next_attempt_at=due,
    )


BADGE_CAP = 100


def firing_count() -> int:
    """Firing alerts nobody muted: the badge's number, capped at ``BADGE_CAP`` (a bounded
    fetch instead of a COUNT, since every page renders it)."""
    return len(
        Alert.objects.filter(state=AlertState.FIRING, inhibited=False, silence__isnull=True)
        .values_list("pk", flat=True)
        .order_by()[:BADGE_CAP]
    )
