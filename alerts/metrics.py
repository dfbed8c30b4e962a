"""``/metrics``: Prometheus text format, built at scrape time from the latest rows.

A fresh ``CollectorRegistry`` per scrape holds one custom collector, so nothing is kept in
process memory: a deleted channel simply has no row next time and its series disappear.
Labels stay low-cardinality: ``broker``, ``channel`` (the slug), ``role`` (main / dlq /
poison). The queries are a fixed handful whatever the channel count: channels joined with their
health and broker, the latest samples (for the broker's counters), poll
states, an aggregate of unresolved dead letters, alert and notification counts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from typing import Any

from django.db.models import Count, Min, OuterRef, Subquery
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from alerts.models import Alert, AlertState, EvaluatorState, Notification, Severity
from channels_registry.health import HealthState
from channels_registry.models import Broker, BrokerPollState, Channel, ChannelSample
from channels_registry.polling import stale_after_s
from dlq.models import OPEN_Q, EntryState, PlanStatus, ReplayPlan
from dlq.models.plans import FINISHED

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
COUNTERS = ("produced", "delivered", "acked", "dead_lettered")


def _ts(value: dt.datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


@dataclasses.dataclass
class _ChannelFamilies:
    """The per-channel metric families, in the order they are exposed."""

    depth: GaugeMetricFamily
    in_flight: GaugeMetricFamily
    consumers: GaugeMetricFamily
    active: GaugeMetricFamily
    oldest: GaugeMetricFamily
    lag: GaugeMetricFamily
    sampled: GaugeMetricFamily
    state: GaugeMetricFamily
    messages: CounterMetricFamily
    unresolved: GaugeMetricFamily
    unresolved_age: GaugeMetricFamily
    stalled: GaugeMetricFamily
    on_broker: GaugeMetricFamily

    @classmethod
    def new(cls) -> _ChannelFamilies:
        labels = ["broker", "channel"]
        depth = GaugeMetricFamily(
            "dlo_channel_depth_messages",
            "Messages waiting on the broker: role=main is the backlog, dlq and poison the"
            " dead-letter and poison queues not yet ingested.",
            labels=[*labels, "role"],
        )
        in_flight = GaugeMetricFamily(
            "dlo_channel_in_flight_messages", "Delivered, not yet acknowledged.", labels=labels
        )
        consumers = GaugeMetricFamily("dlo_channel_consumers", "Attached consumers.", labels=labels)
        active = GaugeMetricFamily(
            "dlo_channel_active_consumers", "Consumers able to receive now.", labels=labels
        )
        oldest = GaugeMetricFamily(
            "dlo_channel_oldest_message_age_seconds",
            "Age of the oldest waiting message.",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "dlo_channel_lag_seconds",
            "Time lag: oldest waiting message, else backlog / ack rate.",
            labels=labels,
        )
        sampled = GaugeMetricFamily(
            "dlo_channel_last_sample_timestamp_seconds",
            "When the channel was last sampled.",
            labels=labels,
        )
        state = GaugeMetricFamily(
            "dlo_channel_health_state",
            "Health state as a state set: 1 for the current state, 0 for the others.",
            labels=[*labels, "state"],
        )
        messages = CounterMetricFamily(
            "dlo_channel_messages",
            "Broker counters mirrored from the latest sample (they reset with the broker).",
            labels=[*labels, "event"],
        )
        unresolved = GaugeMetricFamily(
            "dlo_dead_letters_unresolved",
            "Ingested dead letters not yet replayed or discarded.",
            labels=[*labels, "role"],
        )
        unresolved_age = GaugeMetricFamily(
            "dlo_dead_letters_oldest_unresolved_age_seconds",
            "Age of the oldest unresolved ingested dead letter.",
            labels=[*labels, "role"],
        )
        stalled = GaugeMetricFamily(
            "dlo_ingest_stalled_dead_letters",
            "Dead letters the broker said were waiting when the channel's last ingest fetched"
            " none (0: it fetched, or nothing was waiting).",
            labels=labels,
        )
        on_broker = GaugeMetricFamily(
            "dlo_dead_letters_on_broker_messages",
            "Dead letters on the broker in total, ingested or not (queue messages, XLEN, stream"
            " messages): never add it to the not-yet-ingested depth (docs/health.md).",
            labels=[*labels, "role"],
        )
        return cls(
            depth,
            in_flight,
            consumers,
            active,
            oldest,
            lag,
            sampled,
            state,
            messages,
            unresolved,
            unresolved_age,
            stalled,
            on_broker,
        )


def _exported_channels() -> list[Any]:
    """Enabled channels of enabled brokers with their health, and the id of the latest sample
    (by the (channel, taken_at) index), for the counters."""
    return list(
        Channel.objects.filter(enabled=True, broker__enabled=True)
        .select_related("broker", "health")
        .only(
            "slug",
            "broker__name",
            "broker__poll_interval_s",
            "health__state",
            "health__backlog",
            "health__in_flight",
            "health__consumers",
            "health__active_consumers",
            "health__oldest_age_s",
            "health__lag_s",
            "health__dlq_depth",
            "health__poison_depth",
            "health__dlq_retained",
            "health__poison_retained",
            "health__last_sample_at",
            "health__updated_at",
            "health__ingest_stalled",
            "health__ingest_checked_at",
        )
        .annotate(
            # The latest sample (by the (channel, taken_at) index), for the counters.
            latest_sample=Subquery(
                ChannelSample.objects.filter(
                    channel=OuterRef("pk"), taken_at=OuterRef("health__last_sample_at")
                )
                .order_by("-pk")
                .values("pk")[:1]
            )
        )
        .order_by("broker__name", "slug")
    )


class DloCollector:
    """A prometheus_client custom collector (``collect`` is the whole protocol)."""

    def __init__(self, now: dt.datetime | None = None) -> None:
        self.now = now or timezone.now()

    def collect(self) -> Iterator[Metric]:
        yield from self._channels()
        yield from self._pollers()
        yield from self._alerts()
        yield from self._audit()
        yield from self._replay_plans()

    def _channels(self) -> Iterator[Metric]:
        f = _ChannelFamilies.new()
        channels = _exported_channels()
        sample_ids = [c.latest_sample for c in channels if c.latest_sample is not None]
        counters = {
            row[0]: row[1:]
            for row in ChannelSample.objects.filter(pk__in=sample_ids).values_list(
                "channel_id", *COUNTERS
            )
        }
        for c in channels:
            self._add_channel(f, c, counters.get(c.pk, ()))
        names = {c.pk: (c.broker.name, c.slug) for c in channels}
        self._add_unresolved(f, names)
        yield from (getattr(f, field.name) for field in dataclasses.fields(f))

    def _add_channel(self, f: _ChannelFamilies, c: Channel, counters: tuple[Any, ...]) -> None:
        """One channel's series from its health row and its latest sample's counters."""
        lv = [c.broker.name, c.slug]
        h = getattr(c, "health", None)
        current = HealthState.UNKNOWN.value
        if h is not None:
            current = h.state
            limit = stale_after_s(c.broker)
            if h.updated_at is None or (self.now - h.updated_at).total_seconds() > limit:
                current = HealthState.STALE.value
            for role, value in (
                ("main", h.backlog),
                ("dlq", h.dlq_depth),
                ("poison", h.poison_depth),
            ):
                if value is not None:
                    f.depth.add_metric([*lv, role], value)
            for role, value in (("dlq", h.dlq_retained), ("poison", h.poison_retained)):
                if value is not None:
                    f.on_broker.add_metric([*lv, role], value)
            for family, value in (
                (f.in_flight, h.in_flight),
                (f.consumers, h.consumers),
                (f.active, h.active_consumers),
                (f.oldest, h.oldest_age_s),
                (f.lag, h.lag_s),
                (f.sampled, _ts(h.last_sample_at)),
            ):
                if value is not None:
                    family.add_metric(lv, value)
            if h.ingest_checked_at is not None:
                f.stalled.add_metric(lv, h.ingest_stalled or 0)
            for event, value in zip(COUNTERS, counters, strict=False):
                if value is not None:
                    f.messages.add_metric([*lv, event], value)
        for s in HealthState.values:
            f.state.add_metric([*lv, s], 1.0 if s == current else 0.0)

    def _add_unresolved(self, f: _ChannelFamilies, names: dict[int, tuple[str, str]]) -> None:
        """Unresolved ingested dead letters per exported channel and source (one aggregate)."""
        rows = (
            EntryState.objects.filter(OPEN_Q)
            .values("channel_id", "source")
            .annotate(n=Count("entry_id"), oldest=Min("dead_lettered_at"))
            .order_by()
        )
        for row in rows:
            found = names.get(row["channel_id"])
            if found is None:
                continue
            f.unresolved.add_metric([*found, row["source"]], row["n"])
            if row["oldest"] is not None:
                age = max(0.0, (self.now - row["oldest"]).total_seconds())
                f.unresolved_age.add_metric([*found, row["source"]], age)

    def _pollers(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "dlo_poller_up",
            "1 if the last poll of the broker succeeded recently.",
            labels=["broker"],
        )
        success = GaugeMetricFamily(
            "dlo_poller_last_success_timestamp_seconds", "Last successful poll.", labels=["broker"]
        )
        duration = GaugeMetricFamily(
            "dlo_poller_last_duration_seconds", "Broker time of the last poll.", labels=["broker"]
        )
        failures = GaugeMetricFamily(
            "dlo_poller_consecutive_failures", "Failed polls in a row.", labels=["broker"]
        )
        overruns = CounterMetricFamily(
            "dlo_poller_overruns",
            "Polls skipped because the previous one still ran.",
            labels=["broker"],
        )
        polls = CounterMetricFamily("dlo_poller_polls", "Polls finished.", labels=["broker"])
        states = {s.broker_id: s for s in BrokerPollState.objects.all()}
        for broker in Broker.objects.filter(enabled=True).order_by("name"):
            s: BrokerPollState | None = states.get(broker.pk)
            lv = [broker.name]
            fresh = (
                s is not None
                and s.last_success_at is not None
                and s.consecutive_failures == 0
                and (self.now - s.last_success_at).total_seconds() <= stale_after_s(broker)
            )
            up.add_metric(lv, 1.0 if fresh else 0.0)
            if s is None:
                continue
            if s.last_success_at is not None:
                success.add_metric(lv, s.last_success_at.timestamp())
            if s.last_duration_ms is not None:
                duration.add_metric(lv, s.last_duration_ms / 1000)
            failures.add_metric(lv, s.consecutive_failures)
            overruns.add_metric(lv, s.overruns)
            polls.add_metric(lv, s.polls)
        yield from (up, success, duration, failures, overruns, polls)

    def _alerts(self) -> Iterator[Metric]:
        alerts = GaugeMetricFamily(
            "dlo_alerts", "Active alerts by state and severity.", labels=["state", "severity"]
        )
        counts = {
            (r["state"], r["severity"]): r["n"]
            for r in Alert.objects.filter(state__in=[AlertState.PENDING, AlertState.FIRING])
            .values("state", "severity")
            .annotate(n=Count("id"))
            .order_by()
        }
        for st in (AlertState.PENDING, AlertState.FIRING):
            for sev in Severity.values:
                alerts.add_metric([st.value, sev], counts.get((st.value, sev), 0))
        queued = GaugeMetricFamily(
            "dlo_notifications", "Notification rows by delivery status.", labels=["status"]
        )
        by_status: dict[str, Any] = dict(
            Notification.objects.values_list("status").annotate(n=Count("id")).order_by()
        )
        for status in ("pending", "sending", "sent", "failed"):
            queued.add_metric([status], by_status.get(status, 0))
        yield from (alerts, queued)
        state = EvaluatorState.objects.filter(pk=1).first()
        for name, field, doc in (
            ("dlo_alert_evaluations", "evaluations", "Alert evaluations run."),
            ("dlo_alerts_fired", "alerts_fired", "Alerts that fired."),
            ("dlo_alerts_resolved", "alerts_resolved", "Alerts that resolved."),
            ("dlo_notifications_sent", "notifications_sent", "Notifications delivered."),
            ("dlo_notifications_failed", "notifications_failed", "Notifications given up on."),
            ("dlo_notification_deliveries", "delivery_attempts", "Messages attempted."),
            ("dlo_notification_delivery_errors", "delivery_errors", "Messages that failed."),
        ):
            family = CounterMetricFamily(name, doc)
            family.add_metric([], getattr(state, field) if state else 0)
            yield family
        last = GaugeMetricFamily(
            "dlo_alert_last_evaluation_timestamp_seconds", "When the rules last ran."
        )
        if state is not None and state.last_run_at is not None:
            last.add_metric([], state.last_run_at.timestamp())
            yield last

    def _audit(self) -> Iterator[Metric]:
        """The audit log's sealing window and its checkpoints (alert on
        ``dlo_audit_checkpoint_ok == 0``, ``dlo_audit_unsealed_oldest_seconds > 30`` or
        ``dlo_audit_refused_events > 0``)."""
        from audit.status import log_status

        status = log_status(self.now)
        for name, doc, value in (
            ("dlo_audit_head_seq", "The last sealed audit event.", status.head_seq),
            ("dlo_audit_unsealed_events", "Audit events not sealed yet.", status.unsealed),
            (
                "dlo_audit_unsealed_oldest_seconds",
                "Age of the oldest audit event not sealed yet (0 when none).",
                status.unsealed_age_s,
            ),
            (
                "dlo_audit_refused_events",
                "Audit rows the sealer refused (no valid MAC, or misdated): alert on > 0.",
                status.refused,
            ),
            (
                "dlo_audit_checkpoint_ok",
                "1 when the last signed checkpoint was written and is recent; 0 when the key "
                "or sink is missing or failing, or checkpoints are late.",
                1 if status.checkpoint_ok else 0,
            ),
            (
                "dlo_audit_checkpoint_age_seconds",
                "Seconds since the last signed checkpoint (-1 when none was written).",
                status.checkpoint_age_s if status.checkpoint_age_s is not None else -1,
            ),
        ):
            family = GaugeMetricFamily(name, doc)
            family.add_metric([], value)
            yield family

    def _replay_plans(self) -> Iterator[Metric]:
        """Unfinished plans by status, and how long the oldest has waited for its broker
        (alert on ``dlo_replay_plans{status="waiting_broker"} > 0``)."""
        plans = GaugeMetricFamily(
            "dlo_replay_plans", "Unfinished replay/discard plans by status.", labels=["status"]
        )
        rows = (
            ReplayPlan.objects.exclude(status__in=FINISHED)
            .values_list("status")
            .annotate(n=Count("id"), since=Min("waiting_since"))
            .order_by()
        )  # one query for both families
        counts = {status: (n, since) for status, n, since in rows}
        for status in PlanStatus.values:
            if status not in FINISHED:
                plans.add_metric([status], counts.get(status, (0, None))[0])
        waiting = GaugeMetricFamily(
            "dlo_replay_broker_wait_seconds",
            "How long the longest-waiting plan has waited for an unreachable broker (0: none).",
        )
        since = counts.get(PlanStatus.WAITING, (0, None))[1]
        waiting.add_metric([], (self.now - since).total_seconds() if since else 0.0)
        yield from (plans, waiting)


def render_metrics(now: dt.datetime | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DloCollector(now))
    return generate_latest(registry)
