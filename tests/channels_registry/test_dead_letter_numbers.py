"""The three dead-letter numbers (docs/health.md, "Dead-letter numbers"), each defined once and
computed the same way on every broker: pure functions over adapter samples, no network."""

from __future__ import annotations

import datetime as dt

from brokers.base import Address, ChannelStats, PollResult
from brokers.nats_jetstream import ADVISORY_STREAM
from channels_registry.models import Channel
from channels_registry.polling import (
    REDIS_DRAIN_GROUP,
    ChannelAddresses,
    dead_letter_depth,
    dead_letter_total,
    sample_from_poll,
)


def test_redis_not_yet_ingested_is_the_drain_group_and_the_total_is_xlen() -> None:
    """The issue: "DLQ 8" was the ingest group's unread count while XLEN said 204. Both are
    right, as two numbers: 8 not yet ingested, 204 on the broker in total."""
    group, stream = Address("orders.dlq", REDIS_DRAIN_GROUP), Address("orders.dlq")
    stats = {
        group: ChannelStats(group, backlog=5, in_flight=3, retained=204),
        stream: ChannelStats(stream, retained=204),
    }
    assert dead_letter_depth((group, stream), stats)[0] == 8
    assert dead_letter_total((group, stream), stats) == 204


def test_nats_advisory_capture_counts_advisories_waiting_and_the_stream_as_the_total() -> None:
    md, term = Address(ADVISORY_STREAM, "dlo_x_md"), Address(ADVISORY_STREAM, "dlo_x_term")
    declared = Address("ORDERS_DLQ")
    stats = {
        md: ChannelStats(md, backlog=0, in_flight=0),
        term: ChannelStats(term, backlog=2, in_flight=1),
        declared: ChannelStats(declared, retained=952),
    }
    assert dead_letter_depth((md, term, declared), stats)[0] == 3
    assert dead_letter_total((md, term, declared), stats) == 952
    assert dead_letter_total((md, term), stats) is None  # no DLQ of its own: unknown


def test_nats_advisory_capture_never_counts_the_poison_streams_copies_as_not_ingested() -> None:
    """The issue: "Poison 557 +292 stored" while the stream held 557, all already ingested
    through their advisories. Not yet ingested is unknown; the stream is the total."""
    main = Address("ORDERS", "workers")
    md, term = Address(ADVISORY_STREAM, "dlo_x_md"), Address(ADVISORY_STREAM, "dlo_x_term")
    poison = Address("ORDERS_POISON")
    stats = {
        main: ChannelStats(main, backlog=0, in_flight=0, delivered=10, produced=10),
        md: ChannelStats(md, backlog=0, in_flight=0),
        term: ChannelStats(term, backlog=0, in_flight=0),
        poison: ChannelStats(poison, retained=557),
    }
    addresses = ChannelAddresses(main, (md, term), (poison,))
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    sample, point = sample_from_poll(Channel(), addresses, PollResult(stats, 1, 0.0), now)
    assert sample.poison_depth is None and point.poison_depth is None
    assert sample.dlq_depth == 0
    assert dead_letter_total(addresses.poison, stats) == 557


def test_rabbitmq_dlq_queue_is_both_not_yet_ingested_and_the_total() -> None:
    dlq = Address("orders.dlq")
    stats = {dlq: ChannelStats(dlq, backlog=4, in_flight=1, retained=5)}
    assert dead_letter_depth((dlq,), stats)[0] == 5
    assert dead_letter_total((dlq,), stats) == 5
    over_amqp = {dlq: ChannelStats(dlq, backlog=4)}  # ready count only: the total is unknown
    assert dead_letter_total((dlq,), over_amqp) is None


def test_activemq_dlq_is_both_not_yet_ingested_and_the_total_and_absent_is_none() -> None:
    """ActiveMQ's statistics: ``size`` counts every message not yet acknowledged, in flight
    included. A DLQ.<queue> the broker does not have yet holds none (ActiveMQ creates it with
    its first dead letter): 0 on both numbers, never unknown."""
    from brokers.activemq import _absent, _sample

    dlq = Address("DLQ.orders")
    stats = {dlq: _sample(dlq, {"size": 5, "inflightCount": 1, "dispatchCount": 1}, 0.0)}
    assert dead_letter_depth((dlq,), stats)[0] == 5
    assert dead_letter_total((dlq,), stats) == 5
    absent = {dlq: _absent(dlq, 0.0)}
    assert dead_letter_depth((dlq,), absent)[0] == 0
    assert dead_letter_total((dlq,), absent) == 0
