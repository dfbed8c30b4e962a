"""Declared vs observed: what the broker actually has configured, compared with the declaration.

``compare`` is pure: it takes a channel (its declared fields) and the adapter's ``Topology`` as a
dict (``dataclasses.asdict``, as stored on ``ChannelHealth.observed``) and returns findings in
the same shape as the declaration checks (code, severity, principle, message, fix).
"""

from __future__ import annotations

from typing import Any

from channels_registry.checks import ERROR, WARNING, Finding, keys_pinned
from channels_registry.models import Ordering, Semantic

SAFE_SEMANTICS = {Semantic.AT_LEAST_ONCE, Semantic.EXACTLY_ONCE}


def _finding(code: str, severity: str, principle: str, message: str, fix: str) -> dict[str, Any]:
    return Finding(code, severity, principle, message, fix).as_dict()


#: Findings read from every poll's samples (not from the less frequent topology inspection).
SAMPLE_CODES = frozenset(
    {
        "observed.dead-letter-missing",
        "observed.competing-consumers",
        "observed.pending-past-budget",
    }
)


def compare_sample(
    channel: Any,
    *,
    missing_dead_letter: list[str],
    active_consumers: int | None,
    max_deliveries: int | None = None,
) -> list[dict[str, Any]]:
    """Findings from one poll: declared dead-letter addresses the broker does not have,
    competing consumers on a channel that relies on per-key order without pinning keys, and
    pending messages delivered more often than the declared retry budget allows."""
    findings = []
    budget = channel.retry_max_attempts
    if budget and max_deliveries is not None and max_deliveries > budget:
        findings.append(
            _finding(
                "observed.pending-past-budget",
                ERROR,
                "P5",
                f"A pending message on {channel.address_display} has been delivered"
                f" {max_deliveries} times, past the declared retry budget of {budget}: no"
                " reaper moves it to the dead-letter address.",
                "Run a reaper (XAUTOCLAIM, then dead-letter by delivery count) or fix the one"
                " that should, and align it with the declared budget.",
            )
        )
    if missing_dead_letter:
        names = ", ".join(missing_dead_letter)
        finding = _finding(
            "observed.dead-letter-missing",
            ERROR,
            "P5",
            f"The declared dead-letter address {names} does not exist on the broker: "
            "whatever is dead-lettered there is dropped, and nothing can be ingested.",
            "Create the DLQ / poison queue or stream (with the routing to it), or correct "
            "the declared address.",
        )
        findings.append({**finding, "addresses": list(missing_dead_letter)})
    if (
        channel.ordering in (Ordering.PER_KEY, Ordering.FIFO_GROUP)
        and active_consumers is not None
        and active_consumers > 1
        and not keys_pinned(channel)
    ):
        findings.append(
            _finding(
                "observed.competing-consumers",
                ERROR,
                "P2",
                f"{active_consumers} consumers are active on {channel.address_display}, which "
                f"relies on {channel.get_ordering_display().lower()} order with no partitioning "
                "mechanism: messages of one key are processed concurrently, out of order.",
                "Run one active consumer (single active consumer), or partition the keys "
                "(consistent-hash exchange, one consumer per key range, per-subject consumers) "
                "and declare the mechanism.",
            )
        )
    return findings


def merge(
    previous: list[dict[str, Any]] | None,
    topology_findings: list[dict[str, Any]] | None,
    sample_findings: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The channel's observed findings after a poll: this poll's sample findings, plus the
    topology findings of this poll's inspection (or, without one, the last inspection's)."""
    if topology_findings is None:
        topology_findings = [f for f in previous or [] if f.get("code") not in SAMPLE_CODES]
    return sample_findings + topology_findings


def _limited(topology: dict[str, Any]) -> bool:
    """Whether a length limit exists, so that an overflow policy can actually drop messages."""
    raw = topology.get("raw") or {}
    args = raw.get("arguments") or {}
    policy = raw.get("effective_policy_definition") or {}
    if not isinstance(policy, dict):
        policy = {}
    rabbit = any(k in args for k in ("x-max-length", "x-max-length-bytes")) or any(
        k in policy for k in ("max-length", "max-length-bytes")
    )
    stream = raw.get("stream") or {}
    nats = any(
        isinstance(stream.get(k), int) and stream[k] > 0
        for k in ("max_msgs", "max_bytes", "max_msgs_per_subject")
    )
    return rabbit or nats


def compare(channel: Any, topology: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Findings for one channel; empty when the broker agrees with the declaration (or when
    nothing was observed yet)."""
    if not topology:
        return []
    address = channel.address_display
    if not topology.get("exists"):
        return [
            _finding(
                "observed.address-missing",
                ERROR,
                "P10",
                f"The broker has no {address}: nothing is being measured for this channel.",
                "Create the queue/stream/consumer, or correct the declared address.",
            )
        ]
    if all(topology.get(name) is None for name in _CHECKED_FIELDS):
        return [_unchecked(channel)]
    return (
        _no_dead_letter_exchange(channel, topology)
        + _retry_budget(channel, topology)
        + _dead_lettering_guarantee(channel, topology)
        + _loss_settings(channel, topology)
        + _in_flight(channel, topology)
        + _ack_timeout(channel, topology)
        + _retention(channel, topology)
        + _activemq(channel, topology)
    )


def _activemq(channel: Any, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """ActiveMQ Classic (read over STOMP): a DLQ shared by every queue, against the rule of one
    dead-letter address per channel; and the retry budget, which lives in each JMS client's
    redelivery policy and cannot be checked from the broker."""
    if topology.get("kind") != "activemq-queue":
        return []
    findings = []
    if channel.dlq_address == "ActiveMQ.DLQ":
        findings.append(
            _finding(
                "observed.shared-dlq",
                WARNING,
                "P5",
                f"{channel.address} dead-letters into ActiveMQ.DLQ, which every queue without"
                " an individual dead-letter strategy shares: its dead letters mix with other"
                " queues' and are told apart only by their original destination (ingest takes"
                " this queue's alone), and how many of them wait is unknown.",
                "Give the queue an individualDeadLetterStrategy (queuePrefix DLQ.) in the"
                f" broker's destinationPolicy and declare DLQ.{channel.address} as its DLQ.",
            )
        )
    if channel.retry_max_attempts:
        findings.append(
            _finding(
                "observed.redelivery-client-side",
                WARNING,
                "P6",
                f"The declared retry budget ({channel.retry_max_attempts} attempts) cannot be"
                " checked: ActiveMQ's redelivery policy (maximumRedeliveries, backoff) is set"
                " in each JMS client's connection factory, not on the broker.",
                "Set RedeliveryPolicy.maximumRedeliveries (and the backoff) in the consumers'"
                " connection factory to match the declaration; STOMP consumers count"
                " deliveries themselves.",
            )
        )
    if channel.semantic in SAFE_SEMANTICS:
        findings.append(
            _finding(
                "observed.non-persistent-not-dead-lettered",
                WARNING,
                "P4",
                "ActiveMQ does not dead-letter non-persistent messages by default"
                " (processNonPersistent=false): a non-persistent message that fails is"
                " dropped, but the channel is declared at-least-once.",
                "Have producers send persistently (JMS DeliveryMode.PERSISTENT, STOMP"
                ' persistent:true), or set processNonPersistent="true" on the'
                " dead-letter strategy.",
            )
        )
    return findings


#: The topology fields the comparisons read; all unknown means nothing could be compared.
_CHECKED_FIELDS = (
    "kind",
    "dead_letter_target",
    "delivery_limit",
    "dead_letter_strategy",
    "overflow",
    "ack_policy",
    "max_ack_pending",
    "prefetch",
    "ack_timeout_s",
    "retention_s",
    "retention_count",
)


def _unchecked(channel: Any) -> dict[str, Any]:
    """The address exists, and that is all the broker would say: nothing was compared, and
    the page must not read "matches the declaration"."""
    kind = getattr(getattr(channel, "broker", None), "kind", "")
    if kind == "rabbitmq":
        fix = (
            "Enable the rabbitmq_management plugin and declare its URL (http://host:15672) on"
            " the broker, so the queue's type, dead-lettering, limits and consumers can be read."
        )
    elif kind == "activemq":
        # ActiveMQ takes no management URL here: its statistics come over STOMP.
        fix = (
            "Add <statisticsBrokerPlugin/> to the broker's <plugins> (and XStream/Jettison on"
            " its classpath for STOMP's jms-map-json) and restart it, so the queue's depth and"
            " consumers can be read over STOMP."
        )
    else:
        fix = (
            "Give the poller access to the broker's configuration (management or monitoring"
            " URL) on the broker declaration."
        )
    return _finding(
        "observed.unchecked",
        WARNING,
        "P10",
        f"Only the existence of {channel.address_display} could be read: its dead-letter"
        " routing, retry limit, in-flight bound, ack timeout and retention were not checked"
        " against the declaration.",
        fix,
    )


def _no_dead_letter_exchange(channel: Any, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """A RabbitMQ queue with a declared DLQ but no dead-letter exchange."""
    rabbit = topology.get("kind") in ("classic", "quorum")
    if rabbit and channel.dlq_address and topology.get("dead_letter_target") == "":
        return [
            _finding(
                "observed.no-dead-letter-exchange",
                ERROR,
                "P5",
                f"Queue {channel.address} has no dead-letter exchange, but the DLQ"
                f" {channel.dlq_address} is declared: rejected messages are dropped.",
                "Set x-dead-letter-exchange (by policy) so rejected messages reach the DLQ.",
            )
        ]
    return []


def _retry_budget(channel: Any, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """The broker's delivery limit against the declared retry budget. Classic queues have no
    delivery limit (the consumer enforces the budget): not compared."""
    kind = topology.get("kind")
    limit = topology.get("delivery_limit")
    declared = channel.retry_max_attempts
    if (
        kind not in ("quorum", "jetstream")
        or declared is None
        or limit is None
        or limit == declared
    ):
        return []
    noun = "max_deliver" if kind == "jetstream" else "delivery-limit"
    shown = "unlimited" if limit == -1 else str(limit)
    return [
        _finding(
            "observed.retry-budget-mismatch",
            WARNING,
            "P6",
            f"The broker's {noun} is {shown}; the declared retry budget is {declared}.",
            f"Align {noun} with retry_max_attempts (or correct the declaration).",
        )
    ]


def _dead_lettering_guarantee(channel: Any, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """At-most-once dead-lettering (classic queues, or a quorum queue's strategy) on a channel
    declared at-least-once."""
    kind = topology.get("kind")
    if (
        channel.semantic not in SAFE_SEMANTICS
        or kind not in ("classic", "quorum")
        or not topology.get("dead_letter_target")
    ):
        return []
    if kind == "classic":
        return [
            _finding(
                "observed.at-most-once-dead-lettering",
                WARNING,
                "P4",
                "Classic-queue dead-lettering is at-most-once: a dead letter can be lost"
                " on the way to the DLQ, but the channel is declared at-least-once.",
                "Use a quorum queue with dead-letter-strategy at-least-once and overflow"
                " reject-publish.",
            )
        ]
    if topology.get("dead_letter_strategy") == "at-most-once":
        return [
            _finding(
                "observed.at-most-once-dead-lettering",
                WARNING,
                "P4",
                "The quorum queue dead-letters at-most-once; the channel is declared"
                " at-least-once.",
                "Set dead-letter-strategy at-least-once with overflow reject-publish.",
            )
        ]
    return []


def _loss_settings(channel: Any, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """Settings that drop messages on a channel declared at-least-once: overflow drop-head
    under a length limit, a JetStream consumer without acks."""
    if channel.semantic not in SAFE_SEMANTICS:
        return []
    findings = []
    if topology.get("overflow") == "drop-head" and _limited(topology):
        findings.append(
            _finding(
                "observed.overflow-drop-head",
                ERROR,
                "P4",
                "The length limit drops the oldest messages (overflow drop-head) on a channel"
                " declared at-least-once: a data-loss risk.",
                "Use overflow reject-publish (producers see back-pressure) or remove the limit.",
            )
        )
    if topology.get("ack_policy") == "none":
        findings.append(
            _finding(
                "observed.ack-policy-none",
                ERROR,
                "P4",
                "The JetStream consumer has ack_policy none: delivery is at-most-once, but"
                " the channel is declared at-least-once.",
                "Recreate the consumer with ack_policy explicit.",
            )
        )
    return findings


def _in_flight(channel: Any, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """P6: the broker's bound on unacknowledged messages (JetStream max_ack_pending, RabbitMQ
    consumer prefetch) against the declared one."""
    pending, noun = topology.get("max_ack_pending"), "max_ack_pending"
    if pending is None:
        pending, noun = topology.get("prefetch"), "the consumers' prefetch"
    if not channel.max_in_flight or pending is None:
        return []
    if pending == -1 or pending <= 0:
        return [
            _finding(
                "observed.unbounded-in-flight",
                WARNING,
                "P6",
                f"{noun[0].upper()}{noun[1:]} is unbounded; the declaration bounds in-flight"
                f" messages to {channel.max_in_flight}.",
                f"Set {noun} to {channel.max_in_flight}.",
            )
        ]
    if pending > channel.max_in_flight:
        return [
            _finding(
                "observed.in-flight-above-declared",
                WARNING,
                "P6",
                f"{noun[0].upper()}{noun[1:]} is {pending}, above the declared"
                f" {channel.max_in_flight}.",
                f"Set {noun} to {channel.max_in_flight}.",
            )
        ]
    return []


def _ack_timeout(channel: Any, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """P6: the broker's ack timeout (RabbitMQ consumer timeout, JetStream ack_wait) against
    the declared one."""
    observed_s = topology.get("ack_timeout_s")
    declared = channel.ack_timeout_s
    if not declared or observed_s is None or abs(observed_s - declared) < 1:
        return []
    noun = "ack_wait" if topology.get("kind") == "jetstream" else "consumer timeout"
    effect = (
        "slow but healthy attempts are cut off and redelivered"
        if observed_s < declared
        else "a blocked consumer holds its messages longer than declared"
    )
    return [
        _finding(
            "observed.ack-timeout-mismatch",
            WARNING,
            "P6",
            f"The broker's {noun} is {observed_s:g}s; the declared ack timeout is {declared}s:"
            f" {effect}.",
            f"Set the {noun} to {declared}s, or correct the declaration.",
        )
    ]


def _retention(channel: Any, topology: dict[str, Any]) -> list[dict[str, Any]]:
    """P8: what the broker keeps (message TTL, stream max age, visible trimming, length
    limits) against the declared retention."""
    declared = channel.retention_s
    if not declared:
        return []
    findings = []
    kept = topology.get("retention_s")
    if kept is not None and kept < declared:
        findings.append(
            _finding(
                "observed.retention-shorter",
                WARNING,
                "P8",
                f"The broker keeps messages for {kept:g}s; the declared retention is"
                f" {declared}s: replay and investigation lose the difference.",
                "Raise the broker's message TTL / max age / trimming, or correct the"
                " declared retention.",
            )
        )
    count = topology.get("retention_count")
    if count is not None:
        findings.append(
            _finding(
                "observed.retention-by-count",
                WARNING,
                "P8",
                f"The broker keeps at most {count:,} messages, so under load the declared"
                f" {declared}s retention is not kept.",
                "Size the length limit for the declared window at peak rate, or declare the"
                " retention the limit really gives.",
            )
        )
    return findings
