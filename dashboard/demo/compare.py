"""The demo's end-of-run check: the board's numbers as stored beside what the broker says.

For each demo channel: the broker is read through the adapter's own ``poll`` (the code path the
poller uses, turned into the board's numbers by ``polling.sample_from_poll`` and the
dead-letter helpers, so no third way of reading a broker exists), just before and just after
the board's last poll, and once more a moment later to show movement. A board number agrees
when it lies between the reads before and after its poll (the ground-truth harness's rule,
``tests/truth/harness.py``); a number the broker cannot report is *unknown*, never a
mismatch. "Stored, awaiting triage" is the dashboard's own count, compared with the database
at the same moment. On RabbitMQ the management API's statistics (what the board is polled
from) trail the queue by up to their interval, so ready counts and consumers are read live over
AMQP as well (see ``read_broker``), and the comparison polls again while a number differs, for
a bounded time (``compare_until_agreed``). Definitions: ``docs/health.md``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from django.conf import settings
from django.utils import timezone

from brokers import get_adapter
from brokers.base import BrokerError
from channels_registry.models import BrokerKind, Channel, ChannelHealth, installation_id
from channels_registry.polling import (
    channel_addresses,
    dead_letter_total,
    do_poll_broker,
    sample_from_poll,  # the board's own translation of an adapter answer into its numbers
    waiting_to_retry,
)
from dlq.models import count_unresolved

AGREE, DIFFER, UNKNOWN = "agree", "differ", "unknown"
#: (label, ChannelHealth field): the numbers compared, in the order printed.
NUMBERS: tuple[tuple[str, str], ...] = (
    ("backlog", "backlog"),
    ("in flight", "in_flight"),
    ("consumers", "consumers"),
    ("active consumers", "active_consumers"),
    ("DLQ not ingested", "dlq_depth"),
    ("poison not ingested", "poison_depth"),
    ("waiting to retry", "retry_waiting"),
    ("DLQ on broker", "dlq_retained"),
    ("poison on broker", "poison_retained"),
    ("DLQ stored", "dlq_unresolved"),
    ("poison stored", "poison_unresolved"),
)
_STORED = {"dlq_unresolved", "poison_unresolved"}
#: RabbitMQ's management API refreshes its statistics every 5 s: the board and a read right
#: after its poll see the same figures, so the later read waits past one refresh to show what
#: moved since (a consumer that left, messages that expired into the queue).
RABBIT_STATS_S = 5.0


@dataclasses.dataclass
class Row:
    label: str
    board: int | None
    #: The reads before the poll, just after it, and a moment later (None: cannot tell).
    before: int | None
    broker: int | None
    later: int | None
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ChannelComparison:
    channel: str
    broker_kind: str
    state: str
    poll: str
    rows: list[Row]
    error: str = ""
    #: Polls it took to agree, how long that waited, and what differed after the first one.
    polls: int = 1
    waited_s: float = 0.0
    first_differ: list[str] = dataclasses.field(default_factory=list)

    @property
    def agrees(self) -> bool:
        return not self.error and all(r.verdict != DIFFER for r in self.rows)

    def as_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "broker": self.broker_kind,
            "state": self.state,
            "poll": self.poll,
            "agrees": self.agrees,
            "error": self.error,
            "polls": self.polls,
            "waited_s": round(self.waited_s, 1),
            "first_differ": self.first_differ,
            "rows": [r.as_dict() for r in self.rows],
        }


def read_broker(channel: Channel) -> dict[str, int | None]:
    """What the broker says now, in the board's numbers (same adapter, same translation), and
    the database's count of stored entries awaiting triage. RabbitMQ: its management API
    serves statistics up to one interval old, the very figures the board was polled from, so
    what AMQP reports live (ready counts and consumers, by passive declare: what
    ``rabbitmqctl list_queues`` says) replaces them; the rest exists only in those
    statistics. Raises ``BrokerError``."""
    numbers = _read(channel, management=True)
    if channel.broker.kind == BrokerKind.RABBITMQ and channel.broker.management_url:
        live = _read(channel, management=False)
        numbers.update({k: v for k, v in live.items() if v is not None and k not in _STORED})
    return numbers


def _read(channel: Channel, *, management: bool) -> dict[str, int | None]:
    broker = channel.broker
    options = broker.adapter_options()
    if not management:
        options["management_url"] = None  # the adapter then reads over AMQP alone
    adapter = get_adapter(broker.kind, broker.connection_url(), **options)
    adapter.active_idle_s = float(settings.DLO_HEALTH_STALL_S)
    installation = installation_id() if broker.kind == BrokerKind.NATS else ""
    addresses = channel_addresses(channel, broker.kind, installation)
    now = timezone.now()
    result = adapter.poll(sorted(set(addresses.all())))
    sample, _ = sample_from_poll(channel, addresses, result, now)
    numbers: dict[str, int | None] = {
        field: getattr(sample, field)
        for _, field in NUMBERS
        if field not in _STORED and hasattr(sample, field)
    }
    numbers["retry_waiting"], _why = waiting_to_retry(broker.kind, addresses, result.stats)
    numbers["dlq_retained"] = dead_letter_total(addresses.dlq, result.stats)
    numbers["poison_retained"] = dead_letter_total(addresses.poison, result.stats)
    stored = count_unresolved([channel.pk], timezone.now()).get(channel.pk)
    has_dead = bool(channel.has_dlq or channel.poison_address)
    numbers["dlq_unresolved"] = (stored.dlq if stored else 0) if has_dead else None
    numbers["poison_unresolved"] = (stored.poison if stored else 0) if has_dead else None
    return numbers


def verdict(board: int | None, before: int | None, after: int | None) -> str:
    """``board`` against the broker's reads before and after the board's poll: unknown when
    the broker cannot tell; differ when the board shows nothing the broker knows, or a number
    outside the two reads."""
    if before is None or after is None:
        return UNKNOWN
    if board is None:
        return DIFFER
    return AGREE if min(before, after) <= board <= max(before, after) else DIFFER


def compare_until_agreed(
    channel: Channel, *, poll: bool = True, deadline_s: float | None = None
) -> ChannelComparison:
    """``compare_channel`` again (a new poll each time) while a number differs, up to
    ``deadline_s`` (default: three RabbitMQ statistics intervals, 5 s elsewhere): the board may
    trail the broker by one poll, and on RabbitMQ by its statistics interval (docs/health.md).
    What differed after the first poll is kept, so a board that needed the wait says so."""
    started = time.monotonic()
    if deadline_s is None:
        rabbit = channel.broker.kind == BrokerKind.RABBITMQ
        deadline_s = 3 * RABBIT_STATS_S if rabbit else 5.0
    first = result = compare_channel(channel, poll=poll)
    polls = 1
    while poll and not result.agrees and time.monotonic() - started < deadline_s:
        time.sleep(1.0)
        result = compare_channel(channel, poll=poll)
        polls += 1
    result.polls, result.waited_s = polls, time.monotonic() - started
    result.first_differ = [r.label for r in first.rows if r.verdict == DIFFER]
    return result


def compare_channel(
    channel: Channel, *, poll: bool = True, settle_s: float | None = None
) -> ChannelComparison:
    """Steps: 1. read the broker; 2. the board's last poll (``poll=False``: the board as
    another process left it); 3. read the broker again, right after; 4. a moment later
    (``settle_s``; default 1 s, on RabbitMQ one statistics interval more), a third read
    showing movement; 5. compare the stored row with reads 1 and 3."""
    kind = channel.broker.kind
    if settle_s is None:
        settle_s = 1.0 + (RABBIT_STATS_S if kind == BrokerKind.RABBITMQ else 0.0)
    polled = "not polled here"
    try:
        before = read_broker(channel)  # 1.
        if poll:
            polled = do_poll_broker(channel.broker_id, force=True).status  # 2.
        after = read_broker(channel)  # 3.
        time.sleep(settle_s)
        later = read_broker(channel)  # 4.
    except BrokerError as exc:
        health = ChannelHealth.objects.filter(channel=channel).first()
        return ChannelComparison(
            channel.slug, kind, health.state if health else "—", polled, [], str(exc)
        )
    health = ChannelHealth.objects.filter(channel=channel).first()  # 5.
    rows = []
    for label, field in NUMBERS:
        board = getattr(health, field, None) if health else None
        b, a, lt = before.get(field), after.get(field), later.get(field)
        rows.append(Row(label, board, b, a, lt, verdict(board, b, a)))
    return ChannelComparison(channel.slug, kind, health.state if health else "—", polled, rows)


def _cell(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def render(comparisons: list[ChannelComparison]) -> list[str]:
    """The table as printed: one block per channel, one row per number."""
    lines = [
        "Board vs broker (broker read right after the board's last poll; 'later': a second"
        " read after it):",
        f"  {'number':<22}{'board':>10}{'broker':>10}{'later':>10}  verdict",
    ]
    for c in comparisons:
        word = "agree" if c.agrees else "DIFFER"
        if c.polls > 1:
            word += f" after {c.polls} polls ({c.waited_s:.0f} s)"
        lines.append(f"{c.channel} ({c.broker_kind}): board {c.state}, poll {c.poll} — {word}")
        if c.first_differ:
            lines.append(f"  after the first poll these differed: {', '.join(c.first_differ)}")
        if c.error:
            lines.append(f"  broker read failed: {c.error}")
        for r in c.rows:
            mark = r.verdict.upper() if r.verdict == DIFFER else r.verdict
            if r.later != r.broker:
                mark += " (moved since)"
            lines.append(
                f"  {r.label:<22}{_cell(r.board):>10}{_cell(r.broker):>10}{_cell(r.later):>10}"
                f"  {mark}"
            )
    return lines
