"""The declaration checks: DOMAIN.md's list of violations, judged from a channel declaration.

Each check returns ``Finding``s with a severity, the principle it enforces (its name and the
finding's one-paragraph why come from ``principles.py``), a one-line explanation and the fix.
``check_channel`` runs them all; it reads only the declaration (what the broker really has
configured is compared elsewhere, from observed topology).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from django.db.models import Q

from channels_registry.models import (
    BrokerKind,
    Channel,
    DedupScope,
    DlqStrategy,
    Ordering,
    Semantic,
)
from channels_registry.principles import describe

ERROR = "error"
WARNING = "warning"


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    principle: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, Any]:
        """The stored form: the fields plus the principle's name and the finding's why."""
        return describe(dataclasses.asdict(self))


Check = Callable[[Channel], Iterator[Finding]]
CHECKS: list[Check] = []


def check(func: Check) -> Check:
    CHECKS.append(func)
    return func


def _needs_delivery(channel: Channel) -> bool:
    """At-least-once and exactly-once channels promise no loss, so they need the full kit."""
    return channel.semantic in (Semantic.AT_LEAST_ONCE, Semantic.EXACTLY_ONCE)


def _has_key(channel: Channel) -> bool:
    return bool(channel.idempotency_source)


@check
def semantic_stated(channel: Channel) -> Iterator[Finding]:
    if not channel.semantic:
        yield Finding(
            "semantic-unstated",
            ERROR,
            "P4",
            "The delivery semantic is not stated.",
            "Declare at-most-once, at-least-once or exactly-once-via-idempotency.",
        )


@check
def idempotency_key_declared(channel: Channel) -> Iterator[Finding]:
    # Processing that is idempotent by itself is the checklist's other way to absorb
    # redeliveries (P3), so it needs no key.
    if _needs_delivery(channel) and not _has_key(channel) and not channel.consumer_idempotent:
        yield Finding(
            "no-idempotency-key",
            ERROR,
            "P3",
            f"{channel.get_semantic_display()} delivery without an idempotency key: "
            "redeliveries and replays will be processed twice.",
            "Declare where the idempotency key lives (header, JSON path or message id).",
        )


@check
def dedup_store_bounded(channel: Channel) -> Iterator[Finding]:
    if _has_key(channel) and not channel.consumer_idempotent and not channel.dedup_ttl_s:
        yield Finding(
            "dedup-unbounded",
            ERROR,
            "P6",
            "The dedup store has no TTL or bound: it grows forever.",
            "Set a dedup TTL longer than the broker's maximum redelivery window.",
        )
    window = redelivery_window_s(channel)
    if channel.dedup_ttl_s and window is not None and channel.dedup_ttl_s <= window:
        yield Finding(
            "dedup-ttl-short",
            ERROR,
            "P6",
            f"The dedup TTL ({channel.dedup_ttl_s}s) does not outlive the longest redelivery "
            f"window the declaration implies ({window:g}s: {_window_parts(channel)}): a late "
            "redelivery is processed again.",
            f"Make the dedup TTL longer than {window:g}s (24 h is the usual choice).",
        )


def _backoff_delays(channel: Channel) -> list[float]:
    """The delay before each retry the declaration allows (capped exponential backoff)."""
    attempts = channel.retry_max_attempts or 0
    base = channel.backoff_base_s or 0.0
    factor = channel.backoff_factor or 1.0
    delays = []
    for i in range(min(attempts, 1000)):
        delay = base * factor**i if factor > 1 else base
        if channel.backoff_cap_s:
            delay = min(delay, channel.backoff_cap_s)
        delays.append(min(delay, 10**9))
    return delays


def redelivery_window_s(channel: Channel) -> float | None:
    """The longest time after the first attempt that a redelivery can still arrive: the retry
    window (TTL, or attempts × their capped backoff, whichever is longer) plus one ack timeout.
    None when the declaration bounds neither."""
    delays = _backoff_delays(channel)
    by_count = len(delays) * max(delays) if delays else None
    spans = [v for v in (channel.retry_ttl_s, by_count) if v is not None]
    if not spans:
        return None
    return float(max(spans)) + float(channel.ack_timeout_s or 0)


def _window_parts(channel: Channel) -> str:
    parts = []
    if channel.retry_max_attempts:
        delays = _backoff_delays(channel)
        parts.append(f"{channel.retry_max_attempts} attempts × {max(delays):g}s capped backoff")
    if channel.retry_ttl_s:
        parts.append(f"retry TTL {channel.retry_ttl_s}s")
    if channel.ack_timeout_s:
        parts.append(f"+ {channel.ack_timeout_s}s ack timeout")
    return ", ".join(parts)


@check
def dedup_key_per_message(channel: Channel) -> Iterator[Finding]:
    if _has_key(channel) and channel.dedup_scope == DedupScope.PER_PRODUCER:
        yield Finding(
            "dedup-per-producer",
            ERROR,
            "P3",
            "The dedup key is scoped per producer, so distinct messages collide and are dropped.",
            "Use a per-message key: a UUID or (entity, operation, version).",
        )


@check
def retry_budget_bounded(channel: Channel) -> Iterator[Finding]:
    if channel.semantic == Semantic.AT_MOST_ONCE:
        return
    if not channel.retry_max_attempts and not channel.retry_ttl_s:
        yield Finding(
            "retry-unbounded",
            ERROR,
            "P5",
            "The retry budget is unbounded: a failing message is retried forever.",
            "Set a maximum number of attempts and/or a retry TTL, then dead-letter.",
        )
    strategies = channel.dlq_strategies or []
    if DlqStrategy.TTL_BACKOFF in strategies and not channel.retry_ttl_s:
        yield Finding(
            "retry-ttl-missing",
            ERROR,
            "P5",
            "The TTL-with-backoff strategy is declared without a retry TTL: nothing says when "
            "retrying stops.",
            "Declare the retry TTL (the seeds use 30 minutes).",
        )
    if DlqStrategy.RETRY_COUNT in strategies and not channel.retry_max_attempts:
        yield Finding(
            "retry-count-missing",
            ERROR,
            "P5",
            "The retry-count strategy is declared without a maximum number of attempts.",
            "Declare the maximum attempts (the seeds use 3).",
        )


@check
def ack_timeout_declared(channel: Channel) -> Iterator[Finding]:
    if _needs_delivery(channel) and not channel.ack_timeout_s:
        yield Finding(
            "ack-timeout-unstated",
            WARNING,
            "P6",
            "No ack / processing timeout is declared: a blocked consumer holds its messages "
            "and nothing says when they count as stuck.",
            "Declare the ack timeout (the seeds use 30 s) and set the broker's to match.",
        )
    if (
        channel.ack_timeout_s
        and channel.retry_ttl_s
        and channel.retry_ttl_s < channel.ack_timeout_s
    ):
        yield Finding(
            "retry-window-below-ack-timeout",
            WARNING,
            "P6",
            f"The retry window ({channel.retry_ttl_s}s) is shorter than the ack timeout "
            f"({channel.ack_timeout_s}s): one hung attempt spends the whole budget.",
            "Make the retry TTL several ack timeouts long, or shorten the ack timeout.",
        )


@check
def retry_has_backoff(channel: Channel) -> Iterator[Finding]:
    retries = (channel.retry_max_attempts or 0) > 1 or bool(channel.retry_ttl_s)
    if not retries:
        return
    if not channel.backoff_base_s or (channel.backoff_factor or 0) <= 1:
        yield Finding(
            "retry-no-backoff",
            ERROR,
            "P6",
            "Retries without exponential backoff hammer a failing downstream.",
            "Declare a backoff base (s) and a factor > 1, with a cap.",
        )
        return
    if not channel.backoff_cap_s:
        yield Finding(
            "backoff-uncapped",
            WARNING,
            "P6",
            "Exponential backoff without a cap grows without bound.",
            "Declare a backoff cap (e.g. 60 s).",
        )
    if not channel.backoff_jitter:
        yield Finding(
            "backoff-no-jitter",
            WARNING,
            "P6",
            "Backoff without jitter makes failed consumers retry in lock-step.",
            "Enable jitter.",
        )


@check
def dlq_declared(channel: Channel) -> Iterator[Finding]:
    if _needs_delivery(channel) and not channel.has_dlq:
        yield Finding(
            "no-dlq",
            ERROR,
            "P5",
            "No dead-letter address: messages that exhaust their retries are lost or loop.",
            "Declare a DLQ address and a dead-letter strategy.",
        )
    if channel.has_dlq and not channel.dlq_strategies:
        yield Finding(
            "no-dlq-strategy",
            WARNING,
            "P5",
            "A DLQ is declared without a strategy saying how messages get there.",
            "Pick one or more strategies (TTL with backoff + DLQ + alert is the default).",
        )


#: ActiveMQ's shared dead-letter queue, drained per channel by origin (brokers/activemq.py).
ACTIVEMQ_SHARED_DLQ = "ActiveMQ.DLQ"


def dead_letter_sharers(channel: Channel, name: str) -> list[str]:
    """Slugs of the other enabled channels of the same broker declaring ``name`` as their DLQ
    or poison address."""
    if not name or not channel.broker_id:
        return []
    others = Channel.objects.filter(broker_id=channel.broker_id, enabled=True).filter(
        Q(dlq_address=name) | Q(poison_address=name)
    )
    if channel.pk is not None:
        others = others.exclude(pk=channel.pk)
    return sorted(others.values_list("slug", flat=True)[:20])


@check
def dlq_per_channel(channel: Channel) -> Iterator[Finding]:
    """P5, one dead-letter address per channel: several channels declaring one DLQ (or poison
    queue). Everywhere but ActiveMQ's shared DLQ, each channel's ingest drains the whole of
    it, taking the others' dead letters as its own: an error. ``ActiveMQ.DLQ`` is drained per
    origin queue, so each channel gets its own letters; what is lost is the per-channel
    depth (unknown) and isolation (one queue's flood pages ahead of the others'): a warning."""
    for name in dict.fromkeys((channel.dlq_address, channel.poison_address)):
        sharers = dead_letter_sharers(channel, name)
        if not sharers:
            continue
        shown = ", ".join(sharers[:5]) + (" …" if len(sharers) > 5 else "")
        kind = channel.broker.kind if channel.broker_id else None
        if kind == BrokerKind.ACTIVEMQ and name == ACTIVEMQ_SHARED_DLQ:
            yield Finding(
                "dlq-shared-by-channels",
                WARNING,
                "P5",
                f"{name} is also declared by {shown}: each channel ingests the dead letters"
                " of its own queue (by their original destination), but the broker cannot say"
                " how many wait for each channel, and a flood from one queue delays the others.",
                "Give each queue an individualDeadLetterStrategy (queuePrefix DLQ.) in the"
                f" broker's destinationPolicy and declare DLQ.{channel.address} here.",
            )
            continue
        yield Finding(
            "dlq-shared-by-channels",
            ERROR,
            "P5",
            f"{name} is also declared by {shown}: each channel's ingest drains the whole of it,"
            " so dead letters are attributed to whichever channel ingests first.",
            "Give each channel a dead-letter address of its own.",
        )


@check
def dlq_has_depth_alert(channel: Channel) -> Iterator[Finding]:
    if channel.has_dlq and channel.alert_dlq_depth is None:
        yield Finding(
            "dlq-no-alert",
            ERROR,
            "P10",
            "The DLQ has no depth alert: dead letters pile up silently.",
            "Set a DLQ depth alert threshold (0 alerts on the first dead letter).",
        )
    elif channel.has_dlq and (alerts := _alert_coverage(channel)) is not None:
        # The alert rules the channel really gets, with the admin's overrides applied.
        if not alerts.dlq_depth and not alerts.dlq_inflow:
            yield Finding(
                "dlq-no-alert",
                ERROR,
                "P10",
                "The DLQ's depth and inflow alert rules are both disabled: dead letters pile "
                "up silently.",
                "Re-enable the DLQ depth alert rule in the channel's alert rule overrides.",
            )
        elif not alerts.dlq_depth:
            yield Finding(
                "dlq-depth-alert-disabled",
                WARNING,
                "P10",
                "The DLQ depth alert rule is disabled; only new dead letters alert"
                + ("" if alerts.inflow_by_default else " (inflow enabled by override)")
                + ", not ones left untriaged.",
                "Re-enable the DLQ depth alert rule in the channel's alert rule overrides.",
            )
    if DlqStrategy.DLQ_ALERT in (channel.dlq_strategies or []) and not channel.has_dlq:
        yield Finding(
            "dlq-alert-without-dlq",
            ERROR,
            "P5",
            "The DLQ + alert strategy is declared but no DLQ address is.",
            "Declare the DLQ address.",
        )


@check
def poison_routed(channel: Channel) -> Iterator[Finding]:
    strategies = channel.dlq_strategies or []
    if DlqStrategy.POISON_QUEUE in strategies and not channel.poison_address:
        yield Finding(
            "poison-no-address",
            ERROR,
            "P5",
            "The poison-queue strategy is declared but no poison address is.",
            "Declare the poison address.",
        )
    elif _needs_delivery(channel) and not channel.poison_address:
        # With a declared schema, schema-invalid messages are certain to occur and certain to
        # fail every retry: routing them nowhere is an error, as a missing DLQ is.
        has_schema = bool(channel.schema_name)
        yield Finding(
            "poison-retried",
            ERROR if has_schema else WARNING,
            "P5",
            "No poison queue: "
            + ("messages failing the declared schema" if has_schema else "unparseable messages")
            + " are retried until the budget runs out.",
            "Declare a poison address and route parse/schema failures there at once.",
        )
    if channel.poison_address and (alerts := _alert_coverage(channel)) is not None:
        if not alerts.poison_inflow and not alerts.poison_depth:
            yield Finding(
                "poison-no-alert",
                ERROR,
                "P10",
                "The poison queue's inflow and depth alert rules are both disabled: poison "
                "messages pile up silently.",
                "Re-enable the poison inflow alert rule in the channel's alert rule overrides.",
            )
        elif not alerts.poison_inflow:
            yield Finding(
                "poison-inflow-disabled",
                WARNING,
                "P10",
                "The poison inflow alert rule is disabled: a new poison message pages nobody "
                "while older ones are still waiting.",
                "Re-enable the poison inflow alert rule in the channel's alert rule overrides.",
            )
    if (
        strategies == [DlqStrategy.RETRY_COUNT]
        and channel.alert_dlq_depth is None
        and not channel.backoff_base_s
    ):
        yield Finding(
            "retry-count-only",
            ERROR,
            "P6",
            "Retry-count limit alone, with no backoff and no alert.",
            "Add TTL-with-backoff and a DLQ alert.",
        )


@check
def mark_is_safe(channel: Channel) -> Iterator[Finding]:
    if _has_key(channel) and not channel.consumer_idempotent and not channel.mark_in_transaction:
        # Exactly-once is only as good as this window: a separate commit is the classic
        # double-processing bug, not a style issue.
        yield Finding(
            "mark-not-transactional",
            ERROR if channel.semantic == Semantic.EXACTLY_ONCE else WARNING,
            "P3",
            "Processing is not idempotent and the dedup mark commits separately: a crash "
            "between them processes the message twice.",
            "Commit the dedup mark in the same transaction as the processing, or make the "
            "processing idempotent.",
        )


@check
def dlq_metadata(channel: Channel) -> Iterator[Finding]:
    if channel.has_dlq and not channel.dlq_records_reason:
        yield Finding(
            "dlq-no-metadata",
            WARNING,
            "P5",
            "Dead letters carry no reason or audit metadata: triage is guesswork.",
            "Record reason, kind, dead-lettered-at, redelivery count and the idempotency key.",
        )


@check
def ordering_feasible(channel: Channel) -> Iterator[Finding]:
    kind = channel.broker.kind if channel.broker_id else None
    if not channel.ordering:
        yield Finding(
            "ordering-unstated",
            WARNING,
            "P2",
            "Ordering is not stated, so consumers may assume an order that is not provided.",
            "Declare none, per-key, FIFO group or global.",
        )
        return
    if channel.ordering == Ordering.FIFO_GROUP and kind in (BrokerKind.RABBITMQ, BrokerKind.REDIS):
        yield Finding(
            "fifo-not-provided",
            ERROR,
            "P2",
            f"FIFO groups are assumed, but a {BrokerKind(kind).label} channel does not provide "
            "them.",
            "Use per-key ordering with a single consumer per key, or a broker with groups.",
        )
    if channel.ordering == Ordering.GLOBAL and (
        channel.shared_subscription or not channel.single_active_consumer
    ):
        yield Finding(
            "global-order-competing",
            ERROR,
            "P2",
            "Global order is assumed while several consumers compete for messages.",
            "Enable a single active consumer, or relax the ordering to per-key.",
        )
    if (
        channel.ordering in (Ordering.PER_KEY, Ordering.FIFO_GROUP)
        and channel.shared_subscription
        and not keys_pinned(channel)
    ):
        yield Finding(
            "shared-sub-breaks-order",
            ERROR,
            "P2",
            f"{channel.get_ordering_display()} order is relied on while competing consumers "
            "share one subscription: neighbouring messages of one key go to different "
            "consumers and are processed out of order.",
            "Pin keys to consumers (consistent-hash exchange, single active consumer, one "
            "consumer per key range, per-subject consumers) and declare the mechanism, or "
            "declare ordering none.",
        )
    if channel.ordering in (Ordering.PER_KEY, Ordering.FIFO_GROUP) and not channel.ordering_key:
        yield Finding(
            "ordering-no-key",
            ERROR,
            "P7",
            "Per-key ordering is declared without naming the key.",
            "Name the ordering / partition key.",
        )


def keys_pinned(channel: Channel) -> bool:
    """Whether something keeps each key on one consumer: a single active consumer or a declared
    partitioning mechanism."""
    return bool(channel.single_active_consumer or channel.partition_mechanism)


@check
def partition_key_rationale(channel: Channel) -> Iterator[Finding]:
    if channel.ordering_key and not channel.ordering_rationale.strip():
        yield Finding(
            "partition-no-rationale",
            WARNING,
            "P7",
            "The partition key has no stated rationale.",
            "Say why this key (hot keys, ordering scope, expected cardinality).",
        )


@check
def shared_subscription_dedup(channel: Channel) -> Iterator[Finding]:
    if channel.shared_subscription and _has_key(channel) and not channel.dedup_store_shared:
        yield Finding(
            "shared-sub-local-dedup",
            ERROR,
            "P3",
            "Competing consumers each keep their own dedup store, so a redelivery to another "
            "consumer is processed again.",
            "Share the dedup store across consumers (e.g. Redis or the database).",
        )


@check
def retention_declared(channel: Channel) -> Iterator[Finding]:
    if not channel.retention_s:
        yield Finding(
            "no-retention",
            WARNING,
            "P8",
            "No retention is declared: the broker is used as a pipe and replay has no window.",
            "Declare a retention window.",
        )


@check
def schema_versioned(channel: Channel) -> Iterator[Finding]:
    if not channel.schema_name or not channel.schema_version:
        yield Finding(
            "no-schema-version",
            WARNING,
            "P1",
            "No schema name and version: poison cannot be told apart and evolution is blind.",
            "Declare the schema name and version.",
        )


@check
def observable(channel: Channel) -> Iterator[Finding]:
    if channel.alert_lag_messages is None and channel.alert_lag_seconds is None:
        yield Finding(
            "no-lag-alert",
            WARNING,
            "P10",
            "No backlog or lag alert: silent backlog is a bug.",
            "Set a backlog (messages) or lag (seconds) threshold.",
        )


@check
def bounded_in_flight(channel: Channel) -> Iterator[Finding]:
    if _needs_delivery(channel) and not channel.max_in_flight:
        yield Finding(
            "unbounded-in-flight",
            WARNING,
            "P6",
            "Unacknowledged messages per consumer are not bounded.",
            "Declare the prefetch / max unacked bound.",
        )


@dataclasses.dataclass(frozen=True)
class AlertCoverage:
    """Which dead-letter alert rules a channel really gets (its overrides applied)."""

    dlq_depth: bool
    dlq_inflow: bool
    poison_depth: bool
    poison_inflow: bool
    #: DLQ inflow is on by default for this channel (not only by an override).
    inflow_by_default: bool


#: Registered by the alerts app (``AlertsConfig.ready``), the layer above: the registry's
#: checks read the alert rules through it and never import alerts.
_coverage: Callable[[Channel], AlertCoverage] | None = None


def register_alert_coverage(coverage: Callable[[Channel], AlertCoverage] | None) -> None:
    global _coverage
    _coverage = coverage


def _alert_coverage(channel: Channel) -> AlertCoverage | None:
    """None without the alerts app: no alert finding is claimed either way."""
    return _coverage(channel) if _coverage is not None else None


def check_channel(channel: Channel) -> list[Finding]:
    """Run every declaration check; errors first, then warnings, each in check order."""
    findings = [finding for func in CHECKS for finding in func(channel)]
    return sorted(findings, key=lambda f: f.severity != ERROR)
