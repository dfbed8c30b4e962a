"""Declared vs observed: what the broker actually has configured, compared with the declaration.

``compare`` is pure: it takes a channel (its declared fields) and the adapter's ``Topology`` as a
dict (``dataclasses.asdict``, as stored on ``ChannelHealth.observed``) and returns findings in
the same shape as the declaration checks (code, severity, principle, message, fix).
"""

from __future__ import annotations

from typing import Any

from channels_registry.checks import ERROR, WARNING, Finding
from channels_registry.models import Semantic

SAFE_SEMANTICS = {Semantic.AT_LEAST_ONCE, Semantic.EXACTLY_ONCE}


def _finding(code: str, severity: str, principle: str, message: str, fix: str) -> dict[str, str]:
    return Finding(code, severity, principle, message, fix).as_dict()


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


def compare(channel: Any, topology: dict[str, Any] | None) -> list[dict[str, str]]:
    """Findings for one channel; empty when the broker agrees with the declaration (or when
    nothing was observed yet)."""
    if not topology:
        return []
    findings: list[dict[str, str]] = []
    kind = topology.get("kind")
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
    rabbit = kind in ("classic", "quorum")
    at_least_once = channel.semantic in SAFE_SEMANTICS
    target = topology.get("dead_letter_target")
    if rabbit and channel.dlq_address and target == "":
        findings.append(
            _finding(
                "observed.no-dead-letter-exchange",
                ERROR,
                "P5",
                f"Queue {channel.address} has no dead-letter exchange, but the DLQ"
                f" {channel.dlq_address} is declared: rejected messages are dropped.",
                "Set x-dead-letter-exchange (by policy) so rejected messages reach the DLQ.",
            )
        )
    limit = topology.get("delivery_limit")
    declared = channel.retry_max_attempts
    # Classic queues have no delivery limit (the consumer enforces the budget): not compared.
    if (
        kind in ("quorum", "jetstream")
        and declared is not None
        and limit is not None
        and limit != declared
    ):
        noun = "max_deliver" if kind == "jetstream" else "delivery-limit"
        shown = "unlimited" if limit == -1 else str(limit)
        findings.append(
            _finding(
                "observed.retry-budget-mismatch",
                WARNING,
                "P6",
                f"The broker's {noun} is {shown}; the declared retry budget is {declared}.",
                f"Align {noun} with retry_max_attempts (or correct the declaration).",
            )
        )
    if at_least_once and rabbit and target:
        strategy = topology.get("dead_letter_strategy")
        if kind == "classic":
            findings.append(
                _finding(
                    "observed.at-most-once-dead-lettering",
                    WARNING,
                    "P4",
                    "Classic-queue dead-lettering is at-most-once: a dead letter can be lost"
                    " on the way to the DLQ, but the channel is declared at-least-once.",
                    "Use a quorum queue with dead-letter-strategy at-least-once and overflow"
                    " reject-publish.",
                )
            )
        elif strategy == "at-most-once":
            findings.append(
                _finding(
                    "observed.at-most-once-dead-lettering",
                    WARNING,
                    "P4",
                    "The quorum queue dead-letters at-most-once; the channel is declared"
                    " at-least-once.",
                    "Set dead-letter-strategy at-least-once with overflow reject-publish.",
                )
            )
    if at_least_once and topology.get("overflow") == "drop-head" and _limited(topology):
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
    if at_least_once and topology.get("ack_policy") == "none":
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
    pending = topology.get("max_ack_pending")
    if channel.max_in_flight and pending is not None:
        if pending == -1 or pending <= 0:
            findings.append(
                _finding(
                    "observed.unbounded-in-flight",
                    WARNING,
                    "P6",
                    f"max_ack_pending is unbounded; the declaration bounds in-flight messages"
                    f" to {channel.max_in_flight}.",
                    f"Set max_ack_pending to {channel.max_in_flight}.",
                )
            )
        elif pending > channel.max_in_flight:
            findings.append(
                _finding(
                    "observed.in-flight-above-declared",
                    WARNING,
                    "P6",
                    f"max_ack_pending is {pending}, above the declared {channel.max_in_flight}.",
                    f"Set max_ack_pending to {channel.max_in_flight}.",
                )
            )
    return findings
