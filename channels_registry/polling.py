"""Polling a broker: one adapter call per broker, samples, health, then a push to the board.

``do_poll_broker`` is the action (re-exported by ``channels_registry.actions``). It is not one
big ``@transaction.atomic``: the broker call happens *between* two short transactions, so no
database transaction (nor SQLite's write lock) is held while waiting on the network.

1. Claim the broker: a conditional UPDATE of the lease (single flight). A poll that finds the
   lease held is an overrun: skipped and counted.
2. Outside any transaction: build the adapter, ``poll`` every enabled channel's addresses (main,
   DLQ, poison) in one call; every so often also ``inspect`` the topology.
3. One transaction: bulk-insert samples, upsert the minute rollups, evaluate health, upsert the
   ``ChannelHealth`` rows, record success/failure with backoff and circuit breaker, release
   the lease; after commit, push the rows that changed to the board's websocket group.

A broker that fails marks every channel STALE (never OK) and writes stale samples (all NULL).

``poll_brokers`` runs step 2 for many brokers at once on a bounded pool of threads (steps 1
and 3 stay on the caller's thread, which is the only one touching the database), so one hung
broker never delays another broker's sample within a round; the scheduler task and
``poll --once`` go through it. The long-running ``poll`` uses ``PollScheduler``: no rounds,
each broker on its own due time, so a hung broker never delays a healthy one's next poll.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
import random
import secrets
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from brokers.activemq import PAGE_SIZE, SHARED_DLQ, shared_dlq_address
from brokers.base import Address, BrokerError, ChannelStats, PollResult, Topology, scrub
from brokers.nats_jetstream import (
    ADVISORY_STREAM,
    DRAIN_SUFFIXES,
    copy_consumer_name,
    drain_consumer_name,
)
from channels_registry import health, observed
from channels_registry.models import (
    Broker,
    BrokerConfigError,
    BrokerKind,
    BrokerPollState,
    Channel,
    ChannelHealth,
    ChannelRollup,
    ChannelSample,
    installation_id,
)

log = logging.getLogger(__name__)

#: The consumer group the dashboard drains Redis DLQ streams with (see brokers/redis_streams).
REDIS_DRAIN_GROUP = "dlo-ingest"
#: Topology is read on every INSPECT_EVERY-th poll, and at least every INSPECT_MAX_AGE.
INSPECT_EVERY = 10
INSPECT_MAX_AGE = dt.timedelta(minutes=5)
#: Consecutive failures after which the circuit opens (scheduled polls skip the broker).
CIRCUIT_AFTER = 3
MAX_BACKOFF_S = 300.0
#: The health window cache keeps at most this many points (and only WINDOW_S of them).
WINDOW_MAX_POINTS = 80
SPARK_MINUTES = 60
#: The ``ChannelStats`` measurements a ``ChannelSample`` stores under the same names.
STATS_FIELDS = (
    "backlog",
    "in_flight",
    "retained",
    "consumers",
    "active_consumers",
    "redelivered",
    "oldest_message_age_s",
    "oldest_unacked_age_s",
    "produced",
    "delivered",
    "acked",
    "dead_lettered",
)
#: The sample's values that the minute rollup and the ``ChannelHealth`` row both keep.
ROLLUP_FIELDS = (
    "backlog",
    "in_flight",
    "consumers",
    "active_consumers",
    "dlq_depth",
    "poison_depth",
)


@dataclasses.dataclass
class PollOutcome:
    broker: str
    status: str  # "ok" | "failed" | "overrun" | "circuit-open" | "disabled"
    channels: int = 0
    duration_s: float = 0.0
    broker_s: float | None = None
    round_trips: int | None = None
    errors: list[str] = dataclasses.field(default_factory=list)
    changed: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class ChannelAddresses:
    main: Address
    dlq: tuple[Address, ...] = ()
    poison: tuple[Address, ...] = ()
    #: RabbitMQ: the declared TTL retry queue (see ``waiting_to_retry``).
    retry: tuple[Address, ...] = ()

    def all(self) -> list[Address]:
        return [self.main, *self.dlq, *self.poison, *self.retry]


def channel_addresses(channel: Channel, kind: str, installation: str = "") -> ChannelAddresses:
    """The addresses sampled for one channel. Redis dead-letter streams are sampled through the
    dashboard's drain group (what is not ingested yet) and as a plain stream (fallback before
    that group exists); a NATS channel capturing advisories through this installation's two
    drain consumers on DLO_ADVISORIES (what is not ingested yet); a NATS copy stream (the DLQ or
    poison stream the consumer republishes into) through this installation's copy durable on it
    (what is not ingested yet: an ack removes nothing from a limits stream) and as a plain stream
    (its total; the fallback before the first ingest creates the durable); RabbitMQ samples the
    DLQ queue itself (ingest removes what it stored); ActiveMQ its DLQ, and on a shared
    ``ActiveMQ.DLQ`` this channel's share of it, which the broker cannot count (unknown)."""
    own = Address(channel.address, channel.address_group)

    def dead(name: str) -> tuple[Address, ...]:
        if not name:
            return ()
        if kind == BrokerKind.REDIS:
            return (Address(name, REDIS_DRAIN_GROUP), Address(name))
        if kind == BrokerKind.NATS:
            return (Address(name, copy_consumer_name(name, own, installation)), Address(name))
        if kind == BrokerKind.ACTIVEMQ:  # a shared ActiveMQ.DLQ: this channel's share only
            return (shared_dlq_address(name, channel.address),)
        return (Address(name),)

    dlq = dead(channel.dlq_address)
    if kind == BrokerKind.NATS and channel.nats_advisory_capture:
        durable = drain_consumer_name(own, installation)
        dlq = (*(Address(ADVISORY_STREAM, durable + s) for s in DRAIN_SUFFIXES), *dlq)
    retry: tuple[Address, ...] = ()
    if kind == BrokerKind.RABBITMQ and channel.retry_address:
        retry = (Address(channel.retry_address),)
    return ChannelAddresses(own, dlq, dead(channel.poison_address), retry)


def waiting_to_retry(
    kind: str, addresses: ChannelAddresses, stats: dict[Address, ChannelStats]
) -> tuple[int | None, str]:
    """How many of the channel's messages wait for a retry, as the channel page's "Waiting to
    retry" counts them (``BrokerAdapter.retries``), taken from this poll's samples so the board
    costs no round trip per row: ``(count, "")``, or ``(None, why)`` where the broker cannot
    say. RabbitMQ: the declared TTL retry queue's messages (sampled with the channel's other
    queues); Redis: the group's pending entries; NATS: unknown — JetStream counts a message
    ``nak``-ed with a delay and one in processing alike, so the ack-pending count only bounds
    it; ActiveMQ: unknown (the retries wait in the client or the broker's scheduler)."""
    main = stats.get(addresses.main)
    if kind == BrokerKind.RABBITMQ:
        if not addresses.retry:
            return None, "no retry queue declared"
        retry = stats.get(addresses.retry[0])
        if retry is None or not retry.exists:
            return None, f"retry queue {addresses.retry[0].name!r} not found"
        if retry.retained is not None:
            return retry.retained, ""
        if retry.backlog is not None:
            return retry.backlog + (retry.in_flight or 0), ""
        return None, "the broker did not report the retry queue's depth"
    if kind == BrokerKind.REDIS:
        if main is not None and main.exists and main.in_flight is not None:
            return main.in_flight, ""
        return None, "the group's pending entries were not read"
    if kind == BrokerKind.ACTIVEMQ:
        return None, (
            "ActiveMQ retries from the client (a JMS RedeliveryPolicy, or a re-send the"
            " broker's scheduler holds): no queue statistic counts them"
        )
    bound = ""
    if main is not None and main.exists and main.in_flight is not None:
        bound = f"; at most {main.in_flight:,} (awaiting ack)"
    return None, "NATS counts a nak'ed message and one in processing alike" + bound


def dead_letter_depth(
    addresses: Sequence[Address], stats: dict[Address, ChannelStats]
) -> tuple[int | None, float | None]:
    """(depth, oldest age) of a dead-letter address; the first address that exists wins. NATS
    advisory capture is two drain consumers: their waiting advisories add up."""
    captured = [a for a in addresses if a.name == ADVISORY_STREAM and a.group]
    if captured:
        samples = [stats.get(a) for a in captured]
        if all(s is not None and s.exists and s.backlog is not None for s in samples):
            known = [s for s in samples if s is not None]
            return sum((s.backlog or 0) + (s.in_flight or 0) for s in known), None
        addresses = [a for a in addresses if a not in captured]
    for address in addresses:
        sample = stats.get(address)
        if sample is None or not sample.exists:
            continue
        if address.group:
            if sample.backlog is None or sample.in_flight is None:
                continue
            return sample.backlog + sample.in_flight, sample.oldest_message_age_s
        depth = sample.retained
        if depth is None and sample.backlog is not None:
            depth = sample.backlog + (sample.in_flight or 0)
        return depth, sample.oldest_message_age_s
    return None, None


def dead_letter_total(
    addresses: Sequence[Address], stats: dict[Address, ChannelStats]
) -> int | None:
    """Dead letters on the broker in total, ingested or not: the declared DLQ / poison
    queue's messages, the stream's XLEN or message count. None where the broker keeps no
    dead-letter address of its own (NATS advisory capture alone) or did not say."""
    for address in addresses:
        if address.group or address.name == ADVISORY_STREAM:
            continue
        sample = stats.get(address)
        if sample is None or not sample.exists:
            continue
        if sample.retained is not None:
            return sample.retained
        if sample.backlog is not None and sample.in_flight is not None:
            return sample.backlog + sample.in_flight
        return None
    return None


def missing_dead_letters(
    addresses: ChannelAddresses, stats: dict[Address, ChannelStats]
) -> list[str]:
    """Declared DLQ / poison addresses that the broker says do not exist (every form of the
    address sampled, so a Redis stream without the drain group yet is not "missing")."""
    missing = []
    for declared in (addresses.dlq, addresses.poison):
        # NATS drain consumers appear with the first ingest: their absence is not a missing DLQ.
        group = [a for a in declared if a.name != ADVISORY_STREAM]
        samples = [stats.get(a) for a in group]
        if group and all(s is not None and not s.exists for s in samples):
            missing.append(group[0].name)
    return missing


def _lease_length() -> dt.timedelta:
    return dt.timedelta(seconds=max(60.0, 6 * float(settings.DLO_BROKER_TIMEOUT_S)))


def _claim(broker: Broker, now: dt.datetime, *, force: bool) -> tuple[str | None, str]:
    """Claim the broker's lease; returns (token, "") or (None, reason skipped)."""
    state, _ = BrokerPollState.objects.get_or_create(broker=broker)
    if not force and state.circuit_open_until and state.circuit_open_until > now:
        return None, "circuit-open"
    token = secrets.token_hex(8)
    claimed = (
        BrokerPollState.objects.filter(pk=broker.pk)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lte=now))
        .update(lease_until=now + _lease_length(), lease_token=token, last_started_at=now)
    )
    if not claimed:
        BrokerPollState.objects.filter(pk=broker.pk).update(overruns=F("overruns") + 1)
        return None, "overrun"
    return token, ""


def _inspect_due(state: BrokerPollState, now: dt.datetime) -> bool:
    return (
        state.last_inspect_at is None
        or now - state.last_inspect_at >= INSPECT_MAX_AGE
        or state.polls % INSPECT_EVERY == 0
    )


@dataclasses.dataclass
class _Poll:
    """One broker's poll in progress: claimed (step 1), called (step 2), then stored (step 3)."""

    broker: Broker
    state: BrokerPollState
    token: str
    channels: list[Channel]
    addresses: dict[int, ChannelAddresses]
    now: dt.datetime
    started: float
    installation: str = ""  # read in step 1: step 2 runs on a thread, without the database
    result: PollResult | None = None
    topology: dict[Address, Topology] | None = None
    error: str = ""
    errors: list[str] = dataclasses.field(default_factory=list)


def _begin(broker_id: int, *, force: bool) -> _Poll | PollOutcome:
    """Step 1 (database): claim the lease and read the channels; an outcome if skipped."""
    broker = Broker.objects.get(pk=broker_id)
    if not broker.enabled:
        return PollOutcome(broker.name, "disabled")
    started = time.monotonic()
    now = timezone.now()
    token, skipped = _claim(broker, now, force=force)
    if token is None:
        return PollOutcome(broker.name, skipped)
    state = BrokerPollState.objects.get(pk=broker.pk)
    channels = list(broker.channels.filter(enabled=True).order_by("pk"))
    installation = installation_id() if broker.kind == BrokerKind.NATS else ""
    addresses = {c.pk: channel_addresses(c, broker.kind, installation) for c in channels}
    return _Poll(broker, state, token, channels, addresses, now, started, installation)


def _call_broker(poll: _Poll) -> _Poll:
    """Step 2 (network only, no database: safe on a worker thread): poll, maybe inspect."""
    broker = poll.broker
    url = ""
    try:
        url = broker.connection_url()
        adapter = broker.adapter(poll.installation)
        wanted = sorted({a for ca in poll.addresses.values() for a in ca.all()})
        poll.result = adapter.poll(wanted) if wanted else PollResult({}, 0, 0.0)
        poll.errors.extend(poll.result.errors)
        if poll.channels and _inspect_due(poll.state, poll.now):
            try:
                poll.topology = adapter.inspect(sorted({ca.main for ca in poll.addresses.values()}))
            except BrokerError as exc:
                poll.errors.append(f"inspect: {exc}")
    except (BrokerConfigError, BrokerError) as exc:
        poll.error = str(exc)
    except Exception as exc:  # an adapter bug must not leave channels looking healthy
        trace = "".join(traceback.format_exception(exc))
        log.error("poll of broker %s failed unexpectedly: %s", broker.name, scrub(trace, url))
        poll.error = f"{type(exc).__name__}: {exc}"
    # Stored on the health rows, shown on the board, sent in alerts: never the URL's secrets.
    poll.error = scrub(poll.error, url) if poll.error else poll.error
    poll.errors = [scrub(error, url) for error in poll.errors]
    return poll


def _finish(poll: _Poll) -> PollOutcome:
    """Step 3 (database): store samples and health, release the lease."""
    try:
        outcome = _store(
            poll.broker,
            poll.state,
            poll.token,
            poll.channels,
            poll.addresses,
            poll.result,
            poll.topology,
            poll.error,
            polled_at=poll.now,
        )
    except BaseException:
        BrokerPollState.objects.filter(pk=poll.broker.pk, lease_token=poll.token).update(
            lease_until=None
        )
        raise
    outcome.errors = ([poll.error] if poll.error else []) + poll.errors
    outcome.duration_s = time.monotonic() - poll.started
    outcome.broker_s = poll.result.duration_s if poll.result is not None else None
    return outcome


def do_poll_broker(broker_id: int, *, force: bool = False) -> PollOutcome:
    """Poll one broker (see the module docstring). ``force`` ignores an open circuit (used by
    ``manage.py poll --once``); it never ignores another poll's lease."""
    begun = _begin(broker_id, force=force)
    if isinstance(begun, PollOutcome):
        return begun
    return _finish(_call_broker(begun))


def poll_brokers(
    broker_ids: Sequence[int],
    *,
    force: bool = False,
    on_outcome: Callable[[PollOutcome], None] | None = None,
) -> list[PollOutcome]:
    """Poll several brokers concurrently, so a sick broker never delays a healthy one.

    1. Claim every broker and read its channels (this thread).
    2. Run the broker calls on a bounded pool (``DLO_POLL_CONCURRENCY`` threads), brokers that
       failed last time last, so hung ones cannot take every thread ahead of healthy ones.
       The threads touch the network only, never the database.
    3. Store each broker's result in this thread *as soon as its call returns*: a healthy
       broker's sample is committed while a hung one is still waiting out its timeout.
    Returns the outcomes in the order of ``broker_ids``; ``on_outcome`` sees each as stored.
    """
    outcomes: dict[int, PollOutcome] = {}

    def done(broker_id: int, outcome: PollOutcome) -> None:
        outcomes[broker_id] = outcome
        if on_outcome is not None:
            on_outcome(outcome)

    begun: dict[int, _Poll] = {}
    for broker_id in broker_ids:
        started = _begin(broker_id, force=force)
        if isinstance(started, PollOutcome):
            done(broker_id, started)
        else:
            begun[broker_id] = started
    order = sorted(begun, key=lambda b: (begun[b].state.consecutive_failures, b))
    workers = max(1, min(len(order), int(settings.DLO_POLL_CONCURRENCY)))
    if len(order) <= 1:
        for broker_id in order:
            done(broker_id, _finish(_call_broker(begun[broker_id])))
    else:
        with concurrent.futures.ThreadPoolExecutor(workers, "dlo-poll") as pool:
            futures = {pool.submit(_call_broker, begun[b]): b for b in order}
            for future in concurrent.futures.as_completed(futures):
                done(futures[future], _finish(future.result()))
    return [outcomes[b] for b in broker_ids if b in outcomes]


class PollScheduler:
    """The long-running ``poll``: every broker on its own due time (``next_due_at``).

    ``poll_brokers`` polls a *round* and returns when its slowest broker does, so a hung
    broker held every other broker's next round for its whole timeout. Here each ``step``:

    1. stores every broker call that has returned (this thread; the database is touched only
       here), reporting each outcome;
    2. claims and starts every broker that is due and not still running, on a bounded pool
       (``DLO_POLL_CONCURRENCY`` threads; a hung broker keeps one thread until its timeout);
    3. waits at most ``tick_s`` for the next call to return.

    A broker still running when it falls due again is not started twice (its lease would
    refuse it anyway): it is polled again after it returns and falls due.
    """

    def __init__(self, *, name: str | None = None, tick_s: float = 1.0) -> None:
        self.name = name
        self.tick_s = tick_s
        workers = max(1, int(settings.DLO_POLL_CONCURRENCY))
        self.pool = concurrent.futures.ThreadPoolExecutor(workers, "dlo-poll")
        self.running: dict[concurrent.futures.Future[_Poll], int] = {}

    def step(self, on_outcome: Callable[[PollOutcome], None] | None = None) -> float:
        """One pass (class docstring); returns the wait before the next (0: it waited)."""
        report = on_outcome or (lambda _outcome: None)
        # 1. Store what returned.
        for future in [f for f in self.running if f.done()]:
            del self.running[future]
            report(_finish(future.result()))
        # 2. Start what is due and not running.
        busy = set(self.running.values())
        for broker_id in due_brokers(timezone.now(), name=self.name, skip=busy):
            started = _begin(broker_id, force=False)
            if isinstance(started, PollOutcome):
                report(started)
            else:
                self.running[self.pool.submit(_call_broker, started)] = broker_id
        # 3. Wait for the next call to return (or the next tick).
        if self.running:
            concurrent.futures.wait(
                list(self.running), timeout=self.tick_s, return_when="FIRST_COMPLETED"
            )
            return 0.0
        return self.tick_s

    def close(self) -> None:
        """Stop starting calls; calls in flight end within their timeout, unstored (their
        leases expire; the next poller polls those brokers)."""
        self.pool.shutdown(wait=False, cancel_futures=True)


@transaction.atomic
def _store(
    broker: Broker,
    state: BrokerPollState,
    token: str,
    channels: list[Channel],
    addresses: dict[int, ChannelAddresses],
    result: PollResult | None,
    topology: dict[Address, Topology] | None,
    error: str,
    *,
    polled_at: dt.datetime | None = None,
) -> PollOutcome:
    """Steps: 1. each channel's sample, rollup and health row (assessed, or stale when the broker
    failed); 2. write them in bulk; 3. copy the board's summaries to the channels; 4. record the
    broker's poll state; 5. push the rows whose display changed, after commit."""
    now = timezone.now()
    # Entries ingested after the broker was read were still in its DLQ depth: not twice.
    unresolved = _unresolved(channels, polled_at or now)
    minute = now.replace(second=0, microsecond=0)
    existing = {h.pk: h for h in ChannelHealth.objects.filter(channel__in=channels)}
    samples: list[ChannelSample] = []
    rollups: list[ChannelRollup] = []
    rows: list[ChannelHealth] = []
    changed: list[int] = []
    failures = 0 if result is not None else state.consecutive_failures + 1
    # 1. One sample, rollup and health row per channel.
    for channel in channels:
        row = existing.get(channel.pk) or ChannelHealth(channel=channel)
        before = _display_key(row)
        stored = unresolved.get(channel.pk)
        has_dead = bool(channel.has_dlq or channel.poison_address)
        row.dlq_unresolved = (stored.dlq if stored else 0) if has_dead else None
        row.poison_unresolved = (stored.poison if stored else 0) if has_dead else None
        if result is None:
            samples.append(ChannelSample(channel=channel, taken_at=now, stale=True, error=error))
            rollups.append(ChannelRollup(channel=channel, minute=minute, stale=True))
            _apply(
                row,
                health.stale(
                    f"{broker.name} did not answer: {error}"
                    + (f" ({failures} failures in a row)" if failures > 1 else "")
                ),
                now,
            )
        else:
            sample, rollup = _store_sample(
                broker, channel, row, addresses[channel.pk], result, topology, stored, now
            )
            samples.append(sample)
            rollups.append(rollup)
        # The board's keys (see ChannelHealth.refresh_board_keys), without a query per row.
        row.sort_name = channel.name.lower()[:200]
        row.stale_at = now + dt.timedelta(seconds=stale_after_s(broker))
        rows.append(row)
        if _display_key(row) != before:
            changed.append(channel.pk)
    _write_rows(samples, rollups, rows)  # 2.
    _copy_board_summaries(channels, rows)  # 3.
    _record_state(broker, state, token, now, result, topology is not None, error, failures)  # 4.
    # 5. Live updates: the changed rows, and the sample time of every row of a broker that
    # answered (the page shows its age from it; the rows are not pushed again for it).
    push = _board_push
    if (changed or result is not None) and push is not None:
        ids = list(changed)
        sampled = (broker.pk, broker.name, now) if result is not None else None
        transaction.on_commit(lambda: push(ids, sampled), robust=True)
    return PollOutcome(
        broker.name,
        "ok" if result is not None else "failed",
        channels=len(channels),
        round_trips=result.round_trips if result is not None else None,
        changed=changed,
    )


def shared_dlq_evidence(queue: str, whole: int | None) -> list[str]:
    """What a channel draining its letters out of ActiveMQ's shared DLQ cannot see: its own
    depth there (ActiveMQ counts the queue as a whole) and, once the whole DLQ holds a page or
    more, its letters behind other queues' (a selector sees the paged-in messages alone)."""
    said = [
        f"DLQ depth unknown: {SHARED_DLQ} is shared by every queue without a dead-letter"
        " queue of its own, and ActiveMQ counts it as a whole; ingest takes this queue's"
        " letters alone. Give the queue an individualDeadLetterStrategy (queuePrefix DLQ.)"
        f" and declare DLQ.{queue} to see its depth."
    ]
    if whole is not None and whole >= PAGE_SIZE:
        said.append(
            f"{SHARED_DLQ} holds {whole:,} dead letters: ActiveMQ pages {PAGE_SIZE} of a queue"
            " in for dispatch (maxPageSize) and a selector sees only those, so this queue's"
            f" letters behind {PAGE_SIZE} of other queues' wait unseen until those are"
            " drained. A dead-letter queue of its own avoids it."
        )
    return said


def _shared_total(stats: ChannelStats | None) -> int | None:
    return stats.shared_total if stats is not None else None


def _store_sample(
    broker: Broker,
    channel: Channel,
    row: ChannelHealth,
    addresses: ChannelAddresses,
    result: PollResult,
    topology: dict[Address, Topology] | None,
    stored: health.Unresolved | None,
    now: dt.datetime,
) -> tuple[ChannelSample, ChannelRollup]:
    """A channel the broker answered for: its sample and rollup, and ``row`` assessed on the
    window it keeps plus the new point, with what the topology and the sample show."""
    now_s = now.timestamp()
    minute = now.replace(second=0, microsecond=0)
    sample, point = sample_from_poll(channel, addresses, result, now)
    kept = {name: getattr(sample, name) for name in ROLLUP_FIELDS}
    rollup = ChannelRollup(channel=channel, minute=minute, **kept)
    window = [health.Point.from_list(v) for v in row.window or []]
    window_s = float(settings.DLO_HEALTH_WINDOW_S)
    window = [p for p in window if p.t >= now_s - window_s] + [point]
    window = window[-WINDOW_MAX_POINTS:]
    assessment = health.evaluate(
        window,
        health.Thresholds.from_channel(channel),
        previous=row.state,
        now=now_s,
        stale_after_s=stale_after_s(broker),
        unresolved=stored,
        stall_s=float(settings.DLO_HEALTH_STALL_S),
        window_s=window_s,
    )
    missing = result.stats.get(addresses.main)
    if missing is not None and not missing.exists and missing.missing:
        # Say what exactly is missing (a group, a consumer), not "the address does not exist".
        text = missing.missing[0].upper() + missing.missing[1:] + "."
        assessment.evidence = [text if "does not exist" in e else e for e in assessment.evidence]
    # What the broker could not tell at all (no management API...) stands beside the state.
    assessment.evidence.extend(result.limits)
    shared = [a for a in (*addresses.dlq, *addresses.poison) if a.group and a.name == SHARED_DLQ]
    if broker.kind == BrokerKind.ACTIVEMQ and shared:
        whole = next(
            (t for a in shared if (t := _shared_total(result.stats.get(a))) is not None), None
        )
        assessment.evidence.extend(shared_dlq_evidence(channel.address, whole))
    row.window = [p.as_list() for p in window]
    for name, value in kept.items():
        setattr(row, name, value)
    row.dlq_retained = dead_letter_total(addresses.dlq, result.stats)
    row.poison_retained = dead_letter_total(addresses.poison, result.stats)
    row.retry_waiting, row.retry_unknown = waiting_to_retry(broker.kind, addresses, result.stats)
    row.oldest_age_s = sample.oldest_message_age_s
    row.last_sample_at = now
    row.spark = _spark(row.spark or [], minute, sample.backlog)
    _apply(row, assessment, now)
    topology_findings = None
    if topology is not None:
        found = topology.get(addresses.main)
        if found is not None:
            row.observed = _topology_dict(found)
            topology_findings = observed.compare(channel, row.observed)
            row.observed_at = now
    row.observed_findings = observed.merge(
        row.observed_findings,
        topology_findings,
        observed.compare_sample(
            channel,
            missing_dead_letter=missing_dead_letters(addresses, result.stats),
            active_consumers=(
                sample.consumers if sample.active_consumers is None else sample.active_consumers
            ),
            max_deliveries=point.max_deliveries,
        ),
    )
    return sample, rollup


def _write_rows(
    samples: list[ChannelSample], rollups: list[ChannelRollup], rows: list[ChannelHealth]
) -> None:
    ChannelSample.objects.bulk_create(samples, batch_size=500)
    ChannelRollup.objects.bulk_create(
        rollups,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["channel", "minute"],
        update_fields=["stale", *ROLLUP_FIELDS],
    )
    ChannelHealth.objects.bulk_create(
        rows,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["channel"],
        update_fields=[f.name for f in ChannelHealth._meta.concrete_fields if not f.primary_key],
    )


def _copy_board_summaries(channels: list[Channel], rows: list[ChannelHealth]) -> None:
    """The board counts states on the channel table: copy what changed (rarely much)."""
    summaries = []
    for channel, row in zip(channels, rows, strict=True):
        state_flags = row.board_summary()
        if channel.awaiting_health or (channel.board_state, channel.board_flags) != state_flags:
            channel.awaiting_health = False
            channel.board_state, channel.board_flags = state_flags
            summaries.append(channel)
    Channel.objects.bulk_update(
        summaries, ["awaiting_health", "board_state", "board_flags"], batch_size=500
    )


#: Counts stored, unresolved dead letters per channel (``{channel id: Unresolved}``) for the
#: channels given, entries ingested up to the time given: the dlq app registers it at start-up
#: (lower floors do not import upper ones). Without it, nothing is counted.
UnresolvedCounter = Callable[[list[int], dt.datetime], dict[int, health.Unresolved]]
_unresolved_counter: UnresolvedCounter | None = None


def register_unresolved_counter(counter: UnresolvedCounter) -> None:
    global _unresolved_counter
    _unresolved_counter = counter


#: Tells the live board what a poll changed, after its commit: the ids of the channels whose
#: row looks different, and (broker id, name, sample time) when the broker answered. The
#: dashboard registers it at start-up (``DashboardConfig.ready()``); without it, nothing is
#: pushed.
BoardPush = Callable[[list[int], "tuple[int, str, dt.datetime] | None"], object]
_board_push: BoardPush | None = None


def register_board_push(push: BoardPush | None) -> None:
    global _board_push
    _board_push = push


def _unresolved(channels: list[Channel], before: dt.datetime) -> dict[int, health.Unresolved]:
    ids = [c.pk for c in channels if c.dlq_address or c.poison_address]
    if not ids or _unresolved_counter is None:
        return {}
    return _unresolved_counter(ids, before)


def stale_after_s(broker: Broker) -> float:
    """A sample older than this is stale: three missed polls, and never under a minute."""
    return broker.stale_after_s


def _record_state(
    broker: Broker,
    state: BrokerPollState,
    token: str,
    now: dt.datetime,
    result: PollResult | None,
    inspected: bool,
    error: str,
    failures: int,
) -> None:
    interval = float(broker.poll_interval_s)
    updates: dict[str, Any] = {"lease_until": None, "polls": F("polls") + 1}
    if result is not None:
        updates.update(
            consecutive_failures=0,
            circuit_open_until=None,
            last_success_at=now,
            last_duration_ms=round(result.duration_s * 1000),
            last_round_trips=result.round_trips,
            next_due_at=now + dt.timedelta(seconds=interval * random.uniform(0.9, 1.1)),
        )
        if inspected:
            updates["last_inspect_at"] = now
    else:
        # Exponential backoff with jitter; after CIRCUIT_AFTER failures the circuit opens until
        # the next attempt, which is then a single trial (half-open).
        delay = min(MAX_BACKOFF_S, interval * 2 ** (failures - 1)) * random.uniform(0.8, 1.2)
        updates.update(
            consecutive_failures=failures,
            last_error=error[:2000],
            last_error_at=now,
            next_due_at=now + dt.timedelta(seconds=delay),
            circuit_open_until=(
                now + dt.timedelta(seconds=delay) if failures >= CIRCUIT_AFTER else None
            ),
        )
    BrokerPollState.objects.filter(pk=broker.pk, lease_token=token).update(**updates)


def _apply(row: ChannelHealth, assessment: health.Assessment, now: dt.datetime) -> None:
    if row.state != assessment.state or row.state_since is None:
        row.state_since = now
    row.state = assessment.state
    row.dlq_flags = [str(f) for f in assessment.dlq_flags]
    row.evidence = assessment.evidence + _ingest_evidence(row)
    row.severity = assessment.severity
    row.lag_s = assessment.lag_s
    row.drain_rate = assessment.drain_rate
    row.eta_s = assessment.eta_s
    row.updated_at = now


def _ingest_evidence(row: ChannelHealth) -> list[str]:
    """What the last ingest run of the channel reported that a poll cannot see."""
    if not row.ingest_stalled:
        return []
    when = row.ingest_checked_at.strftime("%H:%M:%S UTC") if row.ingest_checked_at else "?"
    return [
        f"The broker says {row.ingest_stalled:,} dead letters are waiting, but the last ingest"
        f" ({when}) fetched none: a crashed ingester holds them until its ack wait ends, or"
        " the drain is stuck."
    ]


def _display_key(row: ChannelHealth) -> tuple[Any, ...]:
    """What the board row shows, minus the clock: a change here is pushed to the board."""
    return (
        row.state,
        tuple(row.dlq_flags or ()),
        row.backlog,
        row.in_flight,
        row.consumers,
        row.active_consumers,
        None if row.lag_s is None else round(row.lag_s),
        row.dlq_depth,
        row.poison_depth,
        row.dlq_unresolved,
        row.poison_unresolved,
        row.retry_waiting,
        row.retry_unknown,
        None if row.eta_s is None else round(row.eta_s / 10),
        _spark_meaning(row.spark),
    )


def _spark_meaning(spark: list[list[Any]] | None) -> tuple[Any, Any] | None:
    """What the board's sparkline states (its label: the hour's maximum and the backlog now);
    a point added each minute with the same values redraws it without changing that, and
    must not push every row of the board once a minute (issue 29)."""
    known = [p[1] for p in spark or () if p[1] is not None]
    return (max(known), known[-1]) if known else None


def _spark(spark: list[list[Any]], minute: dt.datetime, backlog: int | None) -> list[list[Any]]:
    """The last hour of backlog, one point per minute (the minute's last value)."""
    key = int(minute.timestamp())
    kept = [p for p in spark if p[0] > key - SPARK_MINUTES * 60 and p[0] != key]
    return [*kept, [key, backlog]]


def sample_from_poll(
    channel: Channel,
    addresses: ChannelAddresses,
    result: PollResult,
    now: dt.datetime,
) -> tuple[ChannelSample, health.Point]:
    stats = result.stats.get(addresses.main)
    dlq_depth, dlq_age = dead_letter_depth(addresses.dlq, result.stats)
    poison_depth, _ = dead_letter_depth(addresses.poison, result.stats)
    if any(a.name == ADVISORY_STREAM for a in addresses.dlq) and addresses.poison:
        # NATS advisory capture ingests every death through its advisory, poison included;
        # the declared poison stream holds copies of deaths counted there (or stored), so how
        # many of them are not yet ingested is unknown: never counted twice.
        poison_depth = None
    s = stats if stats is not None and stats.exists else None
    sample = ChannelSample(
        channel=channel,
        taken_at=now,
        exists=None if stats is None else stats.exists,
        error=stats.missing[:500] if stats else "address missing from the broker's answer",
        **{name: getattr(s, name) if s else None for name in STATS_FIELDS},
        dlq_depth=dlq_depth,
        dlq_oldest_age_s=dlq_age,
        poison_depth=poison_depth,
    )
    point = health.Point(
        t=now.timestamp(),
        backlog=sample.backlog,
        in_flight=sample.in_flight,
        consumers=sample.consumers,
        active_consumers=sample.active_consumers,
        redelivered=sample.redelivered,
        oldest_age_s=sample.oldest_message_age_s,
        produced=sample.produced,
        delivered=sample.delivered,
        acked=sample.acked,
        dead_lettered=sample.dead_lettered,
        dlq_depth=dlq_depth,
        dlq_age_s=dlq_age,
        poison_depth=poison_depth,
        exists=stats is None or stats.exists,
        unacked_age_s=sample.oldest_unacked_age_s,
        max_deliveries=s.max_deliveries if s else None,
    )
    return sample, point


def _topology_dict(topology: Topology) -> dict[str, Any]:
    data = dataclasses.asdict(topology)
    data["address"] = str(topology.address)
    return data


def due_brokers(
    now: dt.datetime, *, name: str | None = None, skip: set[int] | frozenset[int] = frozenset()
) -> list[int]:
    """Brokers whose next poll is due (only the one called ``name``, if given; never those in
    ``skip``, still running), claimed for scheduling by a conditional UPDATE of
    ``next_due_at`` so that two schedulers do not enqueue the same broker twice."""
    due: list[int] = []
    brokers = Broker.objects.filter(enabled=True).exclude(pk__in=skip)
    if name:
        brokers = brokers.filter(name=name)
    for broker in brokers.only("pk", "poll_interval_s"):
        state, _ = BrokerPollState.objects.get_or_create(broker=broker)
        if state.next_due_at is not None and state.next_due_at > now:
            continue
        if state.circuit_open_until is not None and state.circuit_open_until > now:
            continue
        # Provisional: the poll itself sets the real next_due_at when it finishes.
        provisional = now + dt.timedelta(seconds=broker.poll_interval_s)
        claimed = BrokerPollState.objects.filter(
            pk=broker.pk, next_due_at=state.next_due_at
        ).update(next_due_at=provisional)
        if claimed:
            due.append(broker.pk)
    return due


def prune_samples(
    *,
    raw_hours: int | None = None,
    rollup_days: int | None = None,
    batch: int = 5000,
    max_batches: int = 20,
) -> tuple[int, int]:
    """Delete raw samples older than ``raw_hours`` and rollups older than ``rollup_days``, in
    bounded batches (at most ``batch * max_batches`` rows of each per call), each batch its own
    short transaction so that pruning never holds a long lock."""
    raw_hours = raw_hours or settings.DLO_SAMPLE_RETENTION_HOURS
    rollup_days = rollup_days or settings.DLO_ROLLUP_RETENTION_DAYS
    now = timezone.now()
    deleted: list[int] = []
    model: Any
    for model, field, cutoff in (
        (ChannelSample, "taken_at", now - dt.timedelta(hours=raw_hours)),
        (ChannelRollup, "minute", now - dt.timedelta(days=rollup_days)),
    ):
        total = 0
        for _ in range(max_batches):
            ids = list(
                model.objects.filter(**{f"{field}__lt": cutoff})
                .order_by(field)
                .values_list("pk", flat=True)[:batch]
            )
            if not ids:
                break
            total += model.objects.filter(pk__in=ids).delete()[0]
        deleted.append(total)
    return deleted[0], deleted[1]
