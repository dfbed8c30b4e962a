"""The ten messaging principles (P1–P10) in the product's own words, and why each finding matters.

Findings carry a principle code ("P4"); pages show its name, link to the glossary page and give
the one-paragraph reason of the finding (``why``), falling back to the principle's own paragraph
for a code without a specific one.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Principle:
    code: str
    name: str
    summary: str
    product: str


PRINCIPLES: dict[str, Principle] = {
    p.code: p
    for p in [
        Principle(
            "P1",
            "Messages are contracts",
            "A message has an explicit, versioned schema that producer and consumer agree on "
            "before they exchange anything. Without one the consumer parses by guesswork, and a "
            "change of shape breaks it silently.",
            "A channel declares its schema name and version and may register the JSON Schema; "
            "an entry whose body does not parse or validate is poison.",
        ),
        Principle(
            "P2",
            "Ordering is a property, not an assumption",
            "Whether messages arrive in order (none, per key, per FIFO group, global) is a "
            "guarantee the broker and the consumer topology must actually provide. Competing "
            "consumers on one subscription hand neighbouring messages to different workers, so "
            "any order the code relies on is lost unless something partitions the keys.",
            "A channel declares its ordering and how it is kept; replay warns when it would "
            "break it, and more than one active consumer on a per-key channel without a "
            "partitioning mechanism is a finding.",
        ),
        Principle(
            "P3",
            "Consumers are idempotent",
            "Redelivery is normal under at-least-once delivery, so processing a message twice "
            "must have the effect of processing it once: a per-message idempotency key checked "
            "in a bounded, shared dedup store, or processing that is idempotent by itself.",
            "A channel declares where the idempotency key lives; replay keeps it; entries "
            "without one are flagged.",
        ),
        Principle(
            "P4",
            "Delivery semantics are explicit",
            "At-most-once, at-least-once or exactly-once (at-least-once plus idempotency) is a "
            "choice made per channel and written down. An unstated semantic means every "
            "component guesses, and the guesses disagree at the first failure.",
            "Every channel declares its semantic; replay is guarded by it and the broker's "
            "configuration is compared with it.",
        ),
        Principle(
            "P5",
            "Dead-letter handling is defined",
            "A message that cannot be processed goes somewhere observable: a poison queue at "
            "once when no retry can help, a dead-letter queue after the retry budget. Dead "
            "letters carry their reason and can be inspected, replayed or discarded with an "
            "audit trail.",
            "A channel declares its DLQ, poison queue and strategy; the dashboard ingests, "
            "groups, replays and discards their entries.",
        ),
        Principle(
            "P6",
            "Backpressure is bounded",
            "Every queue of work has a bound: a retry budget (count and/or time), exponential "
            "backoff with jitter and a cap, a dedup store with a TTL longer than the longest "
            "redelivery window, a bounded number of unacknowledged messages per consumer and an "
            "ack timeout. Unbounded anything becomes an outage under load.",
            "Retry budget, backoff, dedup TTL, prefetch and ack timeout are declared and "
            "compared with what the broker enforces.",
        ),
        Principle(
            "P7",
            "Partitioning is intentional",
            "The partition or ordering key decides which messages stay in order and how work "
            "spreads. It is a design decision with a reason (ordering scope, hot keys, "
            "cardinality), not the default of a client library.",
            "A channel names its ordering key and why it was chosen.",
        ),
        Principle(
            "P8",
            "Replay and retention are configured",
            "The broker keeps messages for a declared window so that they can be replayed; a "
            "broker used as a pipe cannot be. Replay from the DLQ is a first-class, audited "
            "action.",
            "A channel declares its retention; the broker's limits (message TTL, maximum "
            "length or age) are compared with it; replays are planned, audited and tracked.",
        ),
        Principle(
            "P9",
            "Schemas evolve compatibly",
            "A new version of a message schema stays readable by the consumers of the old one "
            "(or the other way round, as declared); a breaking change is a new version and a "
            "migration, never a silent edit. Messages keep the version they were sent with.",
            "Registered schema versions are checked against the declared compatibility mode; "
            "replay warns when entries fail today's schema.",
        ),
        Principle(
            "P10",
            "Messaging is observable",
            "Lag, depth, dead-letter and poison depth, throughput and consumer health are "
            "measured, charted and alerted. A backlog nobody sees and a DLQ without an alert "
            "are defects, not quiet days.",
            "Every channel is polled; dead-letter and poison queues get default alert rules; "
            "addresses missing on the broker are findings.",
        ),
    ]
}

#: One paragraph per finding code saying why it matters (the principle's summary otherwise).
WHY: dict[str, str] = {
    "semantic-unstated": "Producers, consumers and this dashboard each need to know whether a "
    "message may be lost or duplicated. Without a declared semantic nothing can be checked, "
    "and replay cannot know whether a second delivery is safe.",
    "no-idempotency-key": "At-least-once delivery redelivers after every crash before the "
    "ack, and every replay is another delivery. Without a key the consumer cannot tell a "
    "redelivery from a new message, so side effects happen twice.",
    "dedup-unbounded": "A dedup store that never forgets grows with every message until it "
    "exhausts memory or disk; the bound must still outlive every redelivery.",
    "dedup-ttl-short": "A redelivery can arrive as late as the whole retry schedule plus one "
    "ack timeout after the first attempt. If the dedup mark has expired by then, the late "
    "copy looks new and is processed a second time.",
    "dedup-per-producer": "A key shared by every message of one producer makes distinct "
    "messages look like duplicates of each other: real work is silently dropped.",
    "retry-unbounded": "A message that can never succeed is retried forever, blocking or "
    "slowing everything behind it; a budget turns it into a dead letter someone can act on.",
    "retry-ttl-missing": "The TTL-with-backoff strategy promises to give up after a retry "
    "window. With no window declared it never gives up, and nothing can check the dedup TTL "
    "against it.",
    "retry-count-missing": "The retry-count strategy promises to dead-letter after N attempts. "
    "With no N declared the broker or consumer has no limit to enforce.",
    "retry-no-backoff": "Retrying at full speed hits a failing downstream exactly when it is "
    "least able to cope, and spends the retry budget in seconds.",
    "backoff-uncapped": "Without a cap, exponential delays quickly exceed any sensible retry "
    "window and hold messages longer than anyone expects.",
    "backoff-no-jitter": "Consumers that failed together retry together; jitter spreads the "
    "retries so the downstream is not hit by synchronised waves.",
    "no-dlq": "When the retry budget runs out the message must go somewhere observable; "
    "otherwise it is dropped or loops forever.",
    "dlq-no-alert": "Dead letters accumulate silently unless their depth pages someone. A DLQ "
    "without an alert is a graveyard, not a safety net.",
    "poison-no-alert": "Poison messages will never succeed on their own and usually mean a "
    "producer or schema bug. Without an alert they pile up unseen.",
    "poison-no-address": "Parse and schema failures cannot be retried into success. Without a "
    "poison queue they are retried until the budget runs out, delaying everything behind them.",
    "poison-retried": "Parse and schema failures cannot be retried into success. Without a "
    "poison queue they are retried until the budget runs out, delaying everything behind them.",
    "mark-not-transactional": "The dedup mark and the processing commit separately: a crash "
    "between the two leaves the work done but unmarked, and the redelivery does it again.",
    "ordering-unstated": "Consumers written against an order the broker does not promise "
    "break under the first redelivery or second consumer.",
    "fifo-not-provided": "The broker cannot deliver FIFO groups, so the promised order is "
    "broken whenever two consumers or a redelivery interleave.",
    "global-order-competing": "Several consumers taking messages from one queue process them "
    "concurrently, so a global order cannot hold.",
    "shared-sub-breaks-order": "Competing consumers on one subscription receive neighbouring "
    "messages of the same key and process them concurrently, so per-key order is lost. Keys "
    "must be pinned to one consumer at a time (consistent-hash exchange, single active "
    "consumer, one consumer per key range, per-subject consumers).",
    "ordering-no-key": "Per-key ordering is meaningless until the key is named; partitioning "
    "and replay both need it.",
    "partition-no-rationale": "A partition key decides hot spots and ordering scope; without "
    "the reason written down, nobody can tell whether it is still right.",
    "shared-sub-local-dedup": "With competing consumers, a redelivery can land on another "
    "consumer than the first attempt; a dedup store per consumer does not see it.",
    "no-retention": "A broker that deletes on ack cannot be replayed from and gives no window "
    "for investigation.",
    "no-schema-version": "Without a schema and version, a malformed message cannot be told "
    "from a new shape, and replaying old messages into a newer consumer is blind.",
    "no-lag-alert": "A consumer that falls behind is invisible until users notice; lag and "
    "backlog thresholds turn it into a page.",
    "unbounded-in-flight": "Without a prefetch bound one consumer can take the whole queue "
    "into memory and starve the others, and a crash redelivers all of it.",
    "pending-past-budget": "A message delivered more often than the retry budget allows is "
    "being retried forever: with Redis Streams nothing moves it unless a reaper claims it and "
    "dead-letters it, so it sits in the pending list while the channel looks healthy.",
    "dead-letter-missing": "Dead-lettering into an address that does not exist drops the "
    "message (RabbitMQ routes it nowhere) or fails the reaper; the failure the DLQ was meant "
    "to keep is lost without a trace.",
    "competing-consumers": "Several consumers are taking messages from one subscription while "
    "the channel relies on per-key order; nothing pins a key to one consumer, so messages of "
    "one key are processed concurrently and out of order.",
    "ack-timeout-mismatch": "The broker redelivers (or cuts off) on its own timeout, not the "
    "declared one; the dedup window and the retry window were computed from the declared one.",
    "retention-shorter": "Messages disappear from the broker before the declared retention "
    "ends, so a replay or investigation inside the declared window finds nothing.",
    "retention-by-count": "A length limit keeps a number of messages, not a time window: at "
    "peak traffic the real window shrinks below the declared retention.",
    "ack-policy-none": "A consumer that never acknowledges is at-most-once by construction: "
    "whatever it was handed when it crashed is gone, whatever the declaration promises.",
    "address-missing": "The broker has no such queue, stream or consumer, so nothing about "
    "this channel is measured: its health would read as unknown while messages go elsewhere "
    "or nowhere.",
    "unchecked": "Only the address's existence could be read, so none of the broker's "
    "dead-lettering, limits or timeouts was compared with the declaration: a page saying it "
    "matches would be a claim nobody checked.",
    "at-most-once-dead-lettering": "The broker's dead-lettering itself can lose the message "
    "(classic queues, or quorum queues without at-least-once dead-lettering), so a channel "
    "declared at-least-once can lose exactly the messages that failed.",
    "shared-dlq": "One dead-letter queue shared by many queues mixes their failures: a drain "
    "takes every channel's letters, depth and inflow alerts cannot say whose they are, and a "
    "flood from one queue buries another's.",
    "dlq-shared-by-channels": "Each channel's dead letters must be its own: a DLQ that several "
    "channels declare is drained by each of them, so one channel's failures land in another's "
    "triage (or, on ActiveMQ's shared DLQ, drained per origin, its depth per channel is "
    "unknown and one queue's flood delays every other's).",
    "redelivery-client-side": "Where the retry budget lives in each client (a JMS "
    "RedeliveryPolicy), the broker cannot show it: every consumer must be configured alike, "
    "or some retry forever and some give up at once.",
    "non-persistent-not-dead-lettered": "A message the broker does not dead-letter when it "
    "fails is simply gone: the at-least-once promise breaks exactly for the messages that "
    "failed.",
    "in-flight-above-declared": "The broker lets each consumer hold more unacknowledged "
    "messages than declared: a slow or crashed consumer delays and then redelivers more than "
    "the contract allows for.",
    "no-dead-letter-exchange": "A rejected message with no dead-letter exchange is simply "
    "dropped; the declared DLQ never receives anything and the failure leaves no trace.",
    "overflow-drop-head": "When the queue is full the broker silently deletes its oldest "
    "messages, which an at-least-once channel promised never to lose.",
    "retry-budget-mismatch": "The broker's own delivery limit decides when a message is "
    "dead-lettered; if it differs from the declared budget, the dedup window and the retry "
    "window were computed from the wrong number.",
    "ack-timeout-unstated": "Without a declared ack (processing) timeout nothing says when an "
    "unacknowledged message counts as stuck, and the broker's own timeout cannot be checked.",
    "retry-window-below-ack-timeout": "The retry window ends before one attempt is even "
    "allowed to time out, so a single slow attempt spends the whole budget.",
}


def describe(finding: dict[str, Any]) -> dict[str, Any]:
    """The finding with its principle's name, its why and the glossary anchor filled in.

    Works on stored findings from before these fields existed (they are looked up by code)."""
    principle = PRINCIPLES.get(str(finding.get("principle", "")))
    code = str(finding.get("code", ""))
    why = WHY.get(code) or WHY.get(code.removeprefix("observed.")) or ""
    return {
        **finding,
        "principle_name": principle.name if principle else "",
        "why": finding.get("why") or why or (principle.summary if principle else ""),
    }


#: The defaults the seeds recommend, offered as a preset on a blank channel form:
#: (field, label, value, why this value).
SEED_DEFAULTS: list[tuple[str, str, Any, str]] = [
    (
        "semantic",
        "Delivery semantic",
        "at-least-once",
        "No message is lost; duplicates are absorbed by the idempotency key. The safe default "
        "for anything with side effects.",
    ),
    (
        "dedup_ttl_s",
        "Dedup TTL",
        86400,
        "24 hours: far longer than any redelivery this retry schedule allows, yet bounded, so "
        "the dedup store cannot grow forever.",
    ),
    (
        "retry_max_attempts",
        "Retry attempts",
        3,
        "Three retries absorb a blip without hammering a downstream that is really down.",
    ),
    (
        "backoff_base_s",
        "Backoff base",
        1.0,
        "The first retry waits one second, so a momentary failure recovers quickly.",
    ),
    (
        "backoff_factor",
        "Backoff factor",
        2.0,
        "Each retry waits twice as long as the one before (1 s, 2 s, 4 s …).",
    ),
    (
        "backoff_cap_s",
        "Backoff cap",
        60.0,
        "No single wait exceeds a minute, however many retries there are.",
    ),
    (
        "backoff_jitter",
        "Jitter",
        True,
        "Randomises each wait so that consumers which failed together do not retry together.",
    ),
    (
        "ack_timeout_s",
        "Ack timeout",
        30,
        "An attempt unacknowledged after 30 seconds counts as stuck and is redelivered; set "
        "the broker's consumer timeout / ack_wait / claim idle time to match.",
    ),
    (
        "retry_ttl_s",
        "Retry window",
        1800,
        "After 30 minutes of retrying, a transient failure is no longer transient: the message "
        "goes to the DLQ for a person to look at.",
    ),
    (
        "dlq_strategies",
        "Dead-letter strategy",
        ["ttl-with-backoff", "poison-queue", "dlq-alert"],
        "Transient failures retry with backoff then dead-letter; unparseable or schema-invalid "
        "messages go to the poison queue at once; both alert.",
    ),
    (
        "alert_dlq_depth",
        "DLQ depth alert",
        0,
        "0 pages on the first dead letter: a DLQ without an alert is a silent defect.",
    ),
]


def seed_initial() -> dict[str, Any]:
    """Initial form values for the seeds' preset."""
    return {name: value for name, _label, value, _why in SEED_DEFAULTS}
