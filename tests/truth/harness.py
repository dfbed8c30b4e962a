"""The ground-truth harness: scripted scenarios on the real brokers, polled by the real poller,
and what the board shows compared with what the broker says at the same moment.

A scenario (``SCENARIOS``) names its traffic, an optional fault (a consumer killed, hung...),
the states the board must reach after the fault and how fast, the states it must never show,
and the DLQ flags it must raise. ``run_scenario`` declares a broker and a channel in the
database, starts the traffic (``tests.truth.traffic``), polls with ``do_poll_broker`` (the
poller's own code path, the one the scheduler and ``manage.py poll`` call) every
``interval_s``, and returns an ``Outcome``: the states seen, the detection time, and every
disagreement. At the end the traffic stops and the board's numbers are compared with the
broker's own answer (AMQP passive declare, XINFO/XLEN, JetStream consumer and stream info),
read just before and just after the poll: a board number must lie between the two reads.

Used by ``tests/truth/test_truth.py`` (short windows: ``stall_s`` of a few seconds) and by
``bench/truth.py`` (the defaults).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.test.utils import override_settings

from alerts.evaluate import do_evaluate_alerts
from alerts.models import Alert, AlertState
from channels_registry.actions import do_poll_broker
from channels_registry.health import HealthState
from channels_registry.models import Broker, BrokerKind, Channel, ChannelHealth
from channels_registry.polling import poll_brokers
from tests.truth import replay as r
from tests.truth import traffic as t

S = HealthState
#: States healthy traffic must never show (the issue's target), besides a stale poller.
NOT_HEALTHY = frozenset({S.STOPPED, S.STALLED, S.LAGGING, S.IDLE, S.POISONED, S.UNKNOWN, S.STALE})
#: How long RabbitMQ's management API may take to show a change (its statistics interval).
RABBIT_STATS_S = 5.0


@dataclasses.dataclass(frozen=True)
class Expect:
    """What the board must show. ``final``: states it must reach after the fault (or hold to
    the end without a fault), within ``within_s`` of the fault; ``never``: states it must not
    show after the first two polls; ``flags``: DLQ flags it must raise; ``evidence``: text
    that must appear in the evidence (the reason and the fix for what cannot be seen)."""

    final: frozenset[str]
    within_s: float | None = None
    never: frozenset[str] = frozenset()
    flags: frozenset[str] = frozenset()
    evidence: str = ""
    #: Board fields that must be unknown (None): what the poller cannot see.
    unknown: tuple[str, ...] = ()


@dataclasses.dataclass
class Outcome:
    kind: str
    scenario: str
    expected: str
    observed: list[str] = dataclasses.field(default_factory=list)
    detected_s: float | None = None
    problems: list[str] = dataclasses.field(default_factory=list)
    numbers: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)
    #: The detection target (seconds after the fault), when the scenario has one.
    target_s: float | None = None

    @property
    def agrees(self) -> bool:
        return not self.problems

    @property
    def observed_summary(self) -> str:
        """The states seen, consecutive repeats collapsed: ``ok → stopped``."""
        seen: list[str] = []
        for state in self.observed:
            if not seen or seen[-1] != state:
                seen.append(state)
        return " → ".join(seen)


@dataclasses.dataclass
class Run:
    """One scenario in progress on one broker: the broker objects, the traffic, the channel."""

    kind: str
    app: Any
    traffic: t.Traffic
    channel: Channel
    interval_s: float
    stall_s: float
    consumers: list[t.Worker] = dataclasses.field(default_factory=list)
    #: The poll interval as it really was (a loaded machine stretches every tick): detection
    #: targets count in it, not in the interval asked for.
    tick_s: float = 0.0
    #: A scenario's own state (the replay plan of "replay").
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def health(self) -> ChannelHealth:
        return ChannelHealth.objects.get(channel=self.channel)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    #: Start the steady traffic; the consumers it starts go to ``run.consumers``.
    start: Callable[[Run], None]
    expect: Callable[[Run], Expect]
    #: The fault, applied after ``warmup_polls`` polls; None: the traffic runs unchanged.
    fault: Callable[[Run], None] | None = None
    warmup_polls: int = 3
    #: Without a fault: how long the traffic runs, in stall windows (plus four polls).
    hold_stalls: float = 1.5
    #: Which broker kinds it applies to, and the broker declaration's management URL.
    kinds: tuple[str, ...] = ("rabbitmq", "redis", "nats", "activemq")
    management: Callable[[str], str] | None = None
    slow: bool = True
    #: Work done on the harness's thread in every tick before the poll, given its share of
    #: the interval in seconds (the relay's slices).
    during: Callable[[Run, float], None] | None = None
    #: After every poll, given the board's row and the broker's reads just before and just
    #: after it: the disagreements.
    check: Callable[[Run, ChannelHealth, dict[str, Any], dict[str, Any]], list[str]] | None = None
    #: At the end, traffic still running: the disagreements (the replay finished and received).
    settle: Callable[[Run], list[str]] | None = None


# --- the scenario library ---------------------------------------------------------------------


def _steady(run: Run, mode: str = "ack", rate: float = 20.0) -> None:
    run.app.produce(rate)
    run.consumers.append(run.app.consume(mode))


def _heavy_retries(run: Run) -> None:
    """40 % of the deliveries retried after a short backoff, as the demo's 503 mix: on NATS a
    ``nak`` with a 2 s delay, so the retries come back as redeliveries inside the window."""
    run.app.produce(20.0)
    delay = {"nak_delay_s": 2.0} if run.kind == "nats" else {}
    run.consumers.append(run.app.consume("retry", retry_every=5, retries=2, **delay))


def _slow(run: Run) -> None:
    run.app.produce(30.0)
    run.consumers.append(run.app.consume("slow", delay_s=0.1, prefetch=1))


def _healthy(run: Run) -> Expect:
    return Expect(final=frozenset({S.OK, S.CATCHING_UP}), never=NOT_HEALTHY)


def _kill(run: Run) -> None:
    for consumer in run.consumers:
        consumer.stop()


def _hang(run: Run) -> None:
    _kill(run)
    run.consumers.append(run.app.consume("hang"))


def _burst(run: Run) -> None:
    run.app.burst(run.app.dlq if run.kind != "nats" else run.app.dlq_subject, 25)


def _fault_window(run: Run) -> float:
    """The issue's target: two poll intervals plus the stall window (plus, on RabbitMQ, the
    management API's statistics interval, which delays everything it reports)."""
    extra = RABBIT_STATS_S if run.kind == "rabbitmq" else 0.0
    return 2 * _tick(run) + run.stall_s + extra


def _tick(run: Run) -> float:
    return max(run.interval_s, run.tick_s)


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])  # closed again when this returns: nothing listens


def _no_management(kind: str) -> str:
    return f"http://127.0.0.1:{_closed_port()}"


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "steady",
        "producer 20/s, one consumer acking everything",
        start=_steady,
        expect=_healthy,
        slow=False,
    ),
    Scenario(
        "retries",
        "producer 20/s; the consumer retries every few messages the broker's way (TTL retry"
        " queue, pending entries claimed later, nak with a 300 s delay)",
        start=lambda run: _steady(run, "retry"),
        expect=_healthy,
    ),
    Scenario(
        "retries-heavy",
        "producer 20/s; the consumer retries 40 % of its deliveries after a short backoff (TTL"
        " retry queue, pending entries claimed after 1 s, nak with a 2 s delay), as the demo's"
        " 503 mix: retries by a consumer making progress, not poison",
        start=_heavy_retries,
        expect=_healthy,
    ),
    Scenario(
        "backlog",
        "producer 30/s, a slow consumer (10/s): the backlog grows",
        start=_slow,
        expect=lambda run: Expect(
            final=frozenset({S.LAGGING}),
            within_s=_fault_window(run) + 4 * _tick(run),
            never=frozenset({S.STOPPED, S.IDLE, S.POISONED}),
        ),
        fault=lambda run: None,
        warmup_polls=0,
    ),
    Scenario(
        "killed",
        "steady traffic, then the consumer is killed while the producer goes on",
        start=lambda run: _steady(run, rate=10.0),
        expect=lambda run: Expect(
            final=frozenset({S.STOPPED}),
            within_s=_fault_window(run),
            never=frozenset({S.IDLE, S.POISONED}),
        ),
        fault=_kill,
    ),
    Scenario(
        "hung",
        "steady traffic, then the consumer hangs holding its unacknowledged messages",
        start=lambda run: _steady(run, rate=10.0),
        expect=lambda run: Expect(
            # RabbitMQ and ActiveMQ count the hung consumer; a Redis or NATS pull consumer that
            # reads nothing cannot be told from a dead one (docs/health.md).
            final=frozenset(
                {S.STALLED} if run.kind in ("rabbitmq", "activemq") else {S.STALLED, S.STOPPED}
            ),
            within_s=_fault_window(run),
            never=frozenset({S.IDLE, S.POISONED}),
        ),
        fault=_hang,
    ),
    Scenario(
        "poison",
        "a consumer that rejects every message straight back (requeue, nak, re-claim)",
        start=lambda run: _steady(run, "poison", rate=2.0),
        expect=lambda run: Expect(
            final=frozenset({S.POISONED}),
            within_s=_fault_window(run) + 4 * _tick(run),
            never=frozenset({S.IDLE}),  # OK until the redeliveries show: the detection time
        ),
        fault=lambda run: None,
        warmup_polls=0,
    ),
    Scenario(
        "dlq-burst",
        "steady traffic, then 25 dead letters land in the DLQ at once",
        start=_steady,
        expect=lambda run: Expect(
            final=frozenset({S.OK, S.CATCHING_UP}),
            within_s=2 * _tick(run) + (RABBIT_STATS_S if run.kind == "rabbitmq" else 0),
            never=NOT_HEALTHY,
            flags=frozenset({"dlq-inflow"}),
        ),
        fault=_burst,
    ),
    Scenario(
        "replay",
        f"steady traffic; {r.DEAD} dead letters captured by the ingest, then a replay plan"
        f" ({r.VELOCITY:g}/s) relayed back to the origin while its consumer drains it",
        start=r.start,
        # Healthy throughout; at every poll the board's DLQ (not yet ingested) equals the
        # broker's and its stored-awaiting-triage equals the stored minus the confirmed.
        expect=_healthy,
        during=r.relay_slice,
        check=r.check,
        settle=r.finish,
        warmup_polls=0,
    ),
    Scenario(
        "no-management",
        "steady traffic; the broker's management URL points at a closed port",
        start=_steady,
        expect=lambda run: (
            Expect(
                # No rates: no claim about traffic, and the page says why and how to fix it.
                final=frozenset({S.UNKNOWN}),
                never=frozenset({S.IDLE, S.OK, S.STALLED, S.STOPPED, S.STALE}),
                evidence="Enable the rabbitmq_management plugin",
                # Over AMQP a queue's unacknowledged messages cannot be read, so neither can
                # the DLQ's total: unknown, not the ready count passed off as the total.
                unknown=("in_flight", "dlq_total", "poison_total"),
            )
            if run.kind == "rabbitmq"
            else _healthy(run)  # NATS: the JetStream API tells what the port would have
        ),
        kinds=("rabbitmq", "nats"),
        management=_no_management,
    ),
)


def scenario(name: str) -> Scenario:
    return next(s for s in SCENARIOS if s.name == name)


# --- running one ------------------------------------------------------------------------------

_APPS: dict[str, Callable[[t.Traffic], Any]] = {
    "rabbitmq": t.Rabbit,
    "redis": t.RedisStreams,
    "nats": t.Nats,
    "activemq": t.ActiveMQ,
}
_URLS = {
    "rabbitmq": t.RABBIT_URL,
    "redis": t.REDIS_URL,
    "nats": t.NATS_URL,
    "activemq": t.ACTIVEMQ_URL,
}
_KINDS = {
    "rabbitmq": BrokerKind.RABBITMQ,
    "redis": BrokerKind.REDIS,
    "nats": BrokerKind.NATS,
    "activemq": BrokerKind.ACTIVEMQ,
}
#: Board field for each number the broker is asked for.
_BOARD = {
    "backlog": "backlog",
    "in_flight": "in_flight",
    "dlq_total": "dlq_retained",
    "dlq_pending": "dlq_depth",
    "poison_total": "poison_retained",
    # Waiting for a retry (the board's "Retrying"): RabbitMQ's TTL retry queue, Redis's
    # pending entries; NATS cannot say (its truth has no such number: unknown on the board).
    "retry_waiting": "retry_waiting",
}


def default_stall_s(kind: str) -> float:
    """Short stall windows for the suite; RabbitMQ's statistics move every 5 s, so its window
    must span more than one of their updates."""
    return 10.0 if kind == "rabbitmq" else 5.0


@contextmanager
def _declared(kind: str, sc: Scenario, app: Any, interval_s: float) -> Iterator[Channel]:
    env = f"DLO_BROKER_TRUTH_{uuid.uuid4().hex[:8].upper()}_URL"
    os.environ[env] = _URLS[kind]
    management = ""
    if sc.management is not None:
        management = sc.management(kind)
    elif kind == "rabbitmq":
        management = "http://127.0.0.1:15672"
    broker = Broker.objects.create(
        name=f"truth-{kind}-{uuid.uuid4().hex[:6]}",
        kind=_KINDS[kind],
        url_env=env,
        management_url=management,
        poll_interval_s=max(1, round(interval_s)),
    )
    name = {"rabbitmq": "queue", "redis": "stream", "nats": "stream", "activemq": "queue"}[kind]
    address = getattr(app, name)
    group = {"redis": t.GROUP, "nats": getattr(app, "consumer", "")}.get(kind, "")
    channel = Channel(
        broker=broker,
        name=f"Truth {sc.name}",
        slug=f"truth-{uuid.uuid4().hex[:10]}",
        address=address,
        address_group=group,
        owner_team="truth",
        semantic="at-least-once",
        idempotency_source="header",
        idempotency_key="Idempotency-Key",
        dedup_ttl_s=86400,
        retry_max_attempts=5,
        backoff_base_s=1.0,
        dlq_strategies=["ttl-with-backoff", "poison-queue", "dlq-alert"],
        dlq_address=app.dlq,
        poison_address=app.poison,
        retry_address=getattr(app, "retry", "") if kind == "rabbitmq" else "",
        alert_dlq_depth=1000,
        # The issue saw "lag 21 min ≥ 30 s" fire on a healthy NATS consumer.
        alert_lag_seconds=30,
        alert_lag_messages=10_000,
    )
    channel.save()
    try:
        yield channel
    finally:
        os.environ.pop(env, None)
        r.forget(channel.pk)
        Channel.objects.filter(pk=channel.pk).delete()
        broker.delete()


def run_scenario(
    kind: str, sc: Scenario, *, interval_s: float = 1.0, stall_s: float | None = None
) -> Outcome:
    """Run ``sc`` on one broker kind."""
    return run_scenarios(sc, (kind,), interval_s=interval_s, stall_s=stall_s)[0]


def run_scenarios(
    sc: Scenario,
    kinds: tuple[str, ...] | None = None,
    *,
    interval_s: float = 1.0,
    stall_s: float | None = None,
    hold_s: float | None = None,
    alerts: bool = False,
) -> list[Outcome]:
    """Run ``sc`` on several broker kinds at once (see the module docstring): one poll tick
    polls every broker through ``poll_brokers``, as the scheduler does. Bounded loops only.
    ``hold_s``: how long a scenario without a fault holds its traffic (a soak); ``alerts``:
    evaluate the alert rules after every tick, and any alert that fires is a disagreement
    (for healthy scenarios)."""
    kinds = tuple(k for k in (kinds or sc.kinds) if k in sc.kinds)
    stall = max(default_stall_s(k) for k in kinds) if stall_s is None else stall_s
    with contextlib.ExitStack() as stack:
        runs: list[Run] = []
        for kind in kinds:
            traffic = t.Traffic()
            stack.callback(traffic.cleanup)
            app = _APPS[kind](traffic)
            channel = stack.enter_context(_declared(kind, sc, app, interval_s))
            runs.append(Run(kind, app, traffic, channel, interval_s, stall))
        stack.enter_context(
            override_settings(DLO_HEALTH_STALL_S=stall, DLO_HEALTH_WINDOW_S=max(60, 10 * stall))
        )
        return _run(runs, sc, hold_s=hold_s, alerts=alerts)


@dataclasses.dataclass
class _Track:
    """What one broker's run has shown so far."""

    run: Run
    expect: Expect
    outcome: Outcome
    quiet_polls: int
    polls: int = 0
    done: bool = False
    health: ChannelHealth | None = None


def _poll_tick(
    runs: list[Run], tracks: list[_Track], sc: Scenario, ticks: list[float], *, alerts: bool
) -> None:
    """One poll tick: the scenario's work between polls (a relay slice), the rest of the
    interval, the poll of every broker (the scheduler's ``poll_brokers``), then each broker's
    state recorded and judged, the scenario's own checks and, with ``alerts``, the alerts."""
    interval = runs[0].interval_s
    began = time.monotonic()
    if sc.during is not None:
        for run in runs:
            sc.during(run, interval / len(runs))
    time.sleep(max(0.0, interval - (time.monotonic() - began)))
    before = [run.app.truth() for run in runs] if sc.check is not None else []
    outcomes = poll_brokers([run.channel.broker_id for run in runs], force=True)
    ticks.append(time.monotonic())
    if alerts:
        _alerts_fired(runs, tracks)
    for run in runs:
        run.tick_s = (ticks[-1] - ticks[0]) / (len(ticks) - 1) if len(ticks) > 1 else 0.0
    for n, (track, polled) in enumerate(zip(tracks, outcomes, strict=True)):
        if track.done:
            continue
        if polled.status != "ok":
            track.outcome.problems.append(f"poll {polled.status}: {polled.errors}")
        h = track.run.health()
        track.health = h
        track.polls += 1
        track.outcome.observed.append(h.state)
        if sc.check is not None:
            after = track.run.app.truth()
            for problem in sc.check(track.run, h, before[n], after):
                track.outcome.problems.append(f"poll {track.polls}: {problem}")
        # The first polls may only be excused for saying UNKNOWN; any other claim counts.
        excused = track.polls <= track.quiet_polls and h.state == S.UNKNOWN
        if track.polls > 2 and not excused and h.state in track.expect.never:
            track.outcome.problems.append(
                f"poll {track.polls}: {h.state} ({'; '.join(h.evidence[:2])})"
            )


def _alerts_fired(runs: list[Run], tracks: list[_Track]) -> None:
    """Evaluate the alert rules; every alert firing on a scenario's channel is a problem."""
    do_evaluate_alerts()
    for alert in Alert.objects.filter(
        channel__in=[run.channel for run in runs], state=AlertState.FIRING
    ).select_related("channel"):
        track = next(tr for tr in tracks if tr.run.channel.pk == alert.channel_id)
        problem = f"alert fired: {alert.summary}"
        if problem not in track.outcome.problems:
            track.outcome.problems.append(problem)


def _run(
    runs: list[Run], sc: Scenario, *, hold_s: float | None = None, alerts: bool = False
) -> list[Outcome]:
    """Steps: 1. start the traffic; 2. warm-up polls; 3. the fault, then poll until every
    broker shows its expected state (or its deadline passes), or, without a fault, hold the
    traffic for the stall window and more; 4. stop the traffic and compare the numbers."""
    tracks = []
    for run in runs:
        sc.start(run)
        expect = sc.expect(run)
        # The first polls may say UNKNOWN (no history yet; RabbitMQ lists a new queue's
        # statistics after up to one statistics interval): judged from the poll after them.
        # Likewise for the first stall window: too short a history to call anything idle.
        stats_s = RABBIT_STATS_S if run.kind == "rabbitmq" else 0.0
        quiet = 2 + round((stats_s + run.stall_s) / run.interval_s)
        outcome = Outcome(run.kind, sc.name, " | ".join(sorted(expect.final)))
        outcome.target_s = expect.within_s
        tracks.append(_Track(run, expect, outcome, quiet))
    interval = runs[0].interval_s
    ticks: list[float] = []

    def tick() -> None:
        _poll_tick(runs, tracks, sc, ticks, alerts=alerts)

    # 2. Warm-up under the steady traffic, then (bounded) until the board has a reading to
    #    compare the fault with: a burst into a DLQ whose depth was never read before it is
    #    no inflow for anyone, and a loaded machine (RabbitMQ lists a new queue's statistics
    #    late) may take more than the usual warm-up to give one.
    for _ in range(sc.warmup_polls):
        tick()
    for _ in range(max(tr.quiet_polls for tr in tracks)):
        if sc.fault is None or all(_has_baseline(tr) for tr in tracks):
            break
        tick()
    # 3. The fault, then the detection (or the hold).
    started = time.monotonic()
    if sc.fault is not None:
        for track in tracks:
            sc.fault(track.run)
        # Detection counts from the fault done (a killed consumer's thread joined, the hung
        # one started), as an operator's clock would from the moment the consumer died.
        started = time.monotonic()
        # Bounded: the target with room for a loaded machine, then the verdict says how late.
        deadline = started + 2 * max((tr.expect.within_s or 0) for tr in tracks) + 3 * interval
        while time.monotonic() < deadline and not all(tr.done for tr in tracks):
            tick()
            for track in tracks:
                h = track.health
                if (
                    not track.done
                    and h is not None
                    and h.state in track.expect.final
                    and track.expect.flags <= set(h.dlq_flags)
                ):
                    track.outcome.detected_s = time.monotonic() - started
                    track.done = True
    else:
        quiet = max(tr.quiet_polls for tr in tracks)
        end = started + sc.hold_stalls * runs[0].stall_s + (quiet + 2) * interval
        if hold_s is not None:
            end = started + hold_s
        while time.monotonic() < end:
            tick()
            for track in tracks:
                h = track.health
                if (
                    h is not None
                    and track.polls > 2
                    and h.state not in track.expect.final
                    and not (track.polls <= track.quiet_polls and h.state == S.UNKNOWN)
                ):
                    track.outcome.problems.append(
                        f"poll {track.polls}: {h.state} ({h.evidence[:1]})"
                    )
    for track in tracks:
        track.expect = sc.expect(track.run)  # the targets in the ticks as they really were
        track.outcome.target_s = track.expect.within_s
        _verdict(track, has_fault=sc.fault is not None)
    if sc.settle is not None:
        for track in tracks:
            track.outcome.problems.extend(sc.settle(track.run))
    # 4. The numbers, traffic stopped.
    for track in tracks:
        for worker in track.run.traffic.workers:
            worker.stop()
    for track in tracks:
        _compare_numbers(track.run, track.outcome, track.expect)
    return [track.outcome for track in tracks]


def _has_baseline(track: _Track) -> bool:
    """The board has read what the fault will change: a state (where UNKNOWN is not what the
    scenario expects) and, for a DLQ flag, the DLQ's depth."""
    h = track.health
    if h is None:
        return False
    if h.state == S.UNKNOWN and S.UNKNOWN not in track.expect.final:
        return False
    return not track.expect.flags or h.dlq_depth is not None


def _verdict(track: _Track, *, has_fault: bool) -> None:
    outcome, expect, health = track.outcome, track.expect, track.health
    if health is None:
        outcome.problems.append("never polled")
        return
    if has_fault and outcome.detected_s is None:
        outcome.problems.append(
            f"never reached {outcome.expected}"
            + (f" with {sorted(expect.flags)}" if expect.flags else "")
            + f" (last: {health.state}, flags {health.dlq_flags}, {health.evidence[:2]})"
        )
    elif (
        outcome.detected_s is not None
        and expect.within_s is not None
        and outcome.detected_s > expect.within_s
    ):
        outcome.problems.append(
            f"detected after {outcome.detected_s:.1f} s, target {expect.within_s:.1f} s"
        )
    if expect.evidence and not any(expect.evidence in e for e in health.evidence):
        outcome.problems.append(f"evidence lacks {expect.evidence!r}: {health.evidence}")
    for name in expect.unknown:
        shown = getattr(health, _BOARD[name], None)
        if shown is not None:
            outcome.problems.append(f"{name} shows {shown}, not unknown")
    errors = track.run.traffic.errors()
    if errors:
        outcome.problems.append(f"traffic failed: {errors}")


def _compare_numbers(run: Run, outcome: Outcome, expect: Expect) -> None:
    """Poll until every number the broker reports lies between its reads just before and just
    after the poll; RabbitMQ's management statistics may lag by their interval."""
    settle_s = RABBIT_STATS_S + 3 * run.interval_s if run.kind == "rabbitmq" else run.interval_s
    deadline = time.monotonic() + settle_s
    disagree: dict[str, tuple[Any, Any]] = {}
    while True:
        before = run.app.truth()
        time.sleep(run.interval_s)
        do_poll_broker(run.channel.broker_id, force=True)
        health = run.health()
        after = run.app.truth()
        disagree = {}
        for name, field in _BOARD.items():
            if name not in before or name in expect.unknown:
                continue
            shown = getattr(health, field, None)  # (a board without the field: unknown)
            low, high = sorted((before[name], after[name]), key=lambda v: -1 if v is None else v)
            outcome.numbers[name] = (shown, after[name])
            if shown is None or low is None or not low <= shown <= high:
                disagree[name] = (shown, after[name])
        if "retry_waiting" not in before and health.retry_waiting is not None:
            # A broker that cannot say how many wait for a retry (NATS): unknown, with why.
            disagree["retry_waiting"] = (health.retry_waiting, None)
        if not disagree or time.monotonic() >= deadline:
            break
    for name, (shown, broker) in disagree.items():
        outcome.problems.append(f"{name}: board {shown}, broker {broker}")
