"""The relay: works through frozen replay plans, one plan at a time under a lease.

1. Claim the plan with a conditional UPDATE (no lease, an expired one, or our own).
2. Take a bounded batch of open items in plan order (``FAST_BATCH_SIZE`` without a velocity,
   else ``BATCH_SIZE`` or less at a low velocity; bounded by the canary, and by
   ``relay_items.BATCH_BYTES`` of bodies, at least one item) and commit before
   publishing (``dlq.plans.relay_items``). First attempts are read from the plan's cursor,
   which the commit moves past them: their replay ids were persisted by the freeze, and the
   item rows are not written until their outcome. A retry is marked SENDING with its attempt
   and ``replay_id`` — the SAME id again when the previous attempt's outcome is unknown
   (timeout, connection lost), a new one after a definite refusal (nack, unroutable). A crash
   from here on leaves the batch in flight (below the cursor with no outcome, or SENDING); the
   next run takes it over and republishes it with the same ids, so extra copies are bounded by
   the in-flight window (``IN_FLIGHT``: the relay publishes one batch while it records the one
   before) and carry the id they share.
3. Publish the batch: body bytes, original headers minus the broker's death bookkeeping,
   the idempotency key untouched, ``x-dlq-replay-id`` added; persistent, confirmed, mandatory.
4. In one transaction record each outcome (the item's one write for a confirmed first
   attempt): confirmed → item CONFIRMED, entry REPLAYED; refused
   → retried after a capped exponential backoff with jitter, FAILED (entry FAILED) once the
   attempts are spent or the refusal is permanent. Each terminal outcome is one audit event.
5. Pace to the plan's velocity; renew the lease; stop at pause/cancel/halt (after resolving the
   batch in flight), at the end of the time slice, or when every item is resolved (DONE).

Canary: with ``canary_size`` k, the relay sends the first k items only, waits
``canary_wait_s``, drains the channel's DLQ once (bounded) and halts the plan if any replayed
message of the plan came back (a child entry) or any new entry of the plan's failure groups
arrived since the plan started; otherwise it ramps to the full velocity.

This module is the loop. The steps live in their own modules: the lease and step 2 in
``dlq.plans.relay_items``, step 3's messages and publishers in ``dlq.plans.relay_publish``, step 4
in ``dlq.plans.relay_outcomes``, the canary's verdict in ``dlq.plans.relay_states``, a discard
plan's work in ``dlq.plans.discard``, and the plan's audited state changes (running, waiting,
paused, halted, finished) in ``dlq.plans.plan_state``, the one module that writes a plan's status.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

from audit.actions import Actor
from brokers.base import PublishOutcome
from channels_registry.models import BrokerConfigError
from dlq.models import (
    PlanKind,
    PlanStatus,
    ReplayItem,
    ReplayPlan,
    refresh_group_counts,
    refresh_open_counts,
)
from dlq.models.plans import RUNNABLE
from dlq.plans.discard import run_discard_plan
from dlq.plans.freeze import altered_items
from dlq.plans.plan_state import (
    enter_waiting,
    finish,
    leave_waiting,
    note_waiting,
    pause,
    start_plan,
)
from dlq.plans.relay_items import (
    adopt_in_flight,
    claim_plan,
    group_of,
    in_doubt,
    release_lease,
    renew_lease,
    take_batch,
)
from dlq.plans.relay_outcomes import record_outcomes
from dlq.plans.relay_publish import Publishers, stored_columns
from dlq.plans.relay_states import canary_check, next_due_in, pause_unconfigured

BATCH_SIZE = 500  # items per publish round trip of a plan with a velocity


# Without a velocity, larger batches: fewer round trips and commits per message, and the
# broker's confirms of one batch stream in while it is still being published. Recording 5,000
# cost 15-20 % less per message than 2,000 (docs/performance.md, issue 24's seventh step); the
# bodies a batch holds are bounded by ``relay_items.BATCH_BYTES`` whatever the count.
FAST_BATCH_SIZE = 5000


# The relay publishes one batch while it records the outcomes of the one before (see
# ``_run_replay``): at most this many items are in flight, and a crash repeats at most these.
IN_FLIGHT = 2 * FAST_BATCH_SIZE


# The groups' open counts follow the entries' statuses in one recount per this many entries or
# seconds (and at the end of a run), not per batch.
RECOUNT_EVERY = 10_000


RECOUNT_S = 2.0


SLICE_S = 300.0  # one relay run; the task re-enqueues itself for the rest


# While the broker is unreachable the relay probes it after 1, 2, 4, then every 5 seconds.
PROBE_MIN_S = 1.0


PROBE_MAX_S = 5.0


@dataclasses.dataclass
class RunResult:
    plan_id: int
    claimed: bool = True
    published: int = 0
    confirmed: int = 0
    failed: int = 0
    status: str = ""
    more: bool = False  # work left: run again (now or after ``retry_in``)
    retry_in: float = 0.0


def relay_owner() -> str:
    return f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _crash_point() -> int | None:
    """Fault injection (tests only): ``DLO_TEST_RELAY_CRASH_AFTER=<n>`` ends the process with
    ``os._exit(137)`` right after the n-th published batch, before its outcomes commit."""
    raw = os.environ.get("DLO_TEST_RELAY_CRASH_AFTER", "")
    return int(raw) if raw.isdigit() else None


def run_plan(plan_id: int, *, max_seconds: float = SLICE_S, owner: str | None = None) -> RunResult:
    """Work on one plan for at most ``max_seconds`` (see the module docstring)."""
    owner = owner or relay_owner()
    result = RunResult(plan_id)
    if not claim_plan(plan_id, owner):
        result.claimed = False
        return result
    try:
        plan = ReplayPlan.objects.select_related("channel", "channel__broker").get(pk=plan_id)
        if plan.started_at is None and plan.status in RUNNABLE:
            problem = altered_items(plan)
            if problem:
                pause(plan, problem, Actor.system(f"{plan.kind}-relay"))
                result.status = PlanStatus.PAUSED
                return result
        if plan.kind == PlanKind.DISCARD:
            return run_discard_plan(plan, owner, result, max_seconds)
        return _run_replay(plan, owner, result, max_seconds)
    finally:
        release_lease(plan_id, owner)


@dataclasses.dataclass
class _InFlight:
    """A claimed batch whose publish runs on the publisher thread."""

    items: list[ReplayItem]
    outcomes: Future[list[PublishOutcome]]


def _run_replay(plan: ReplayPlan, owner: str, result: RunResult, max_seconds: float) -> RunResult:
    """Steps 2-5 as a two-stage pipeline: while the broker confirms batch N+1 on the publisher
    thread, this thread commits the outcomes of batch N (the database and the broker round trips
    overlap instead of adding up). The order per turn keeps every guarantee of the serial relay:

    a. wait for the batch in flight to be confirmed (or refused);
    b. claim the next batch (its replay ids are committed before it is handed over);
    c. hand it to the publisher thread;
    d. record the outcomes from (a): an entry becomes REPLAYED only after its confirm.

    So at most two batches are in flight at any time (``IN_FLIGHT``): the one being recorded and
    the one being published. Only this thread touches the database; only the publisher thread
    touches the broker connections (neither pika nor the asyncio clients are thread-safe), and
    it builds the batch's messages too, beside the outcomes this thread records."""
    actor = Actor.system("replay-relay")
    deadline = time.monotonic() + max_seconds
    crash_after = _crash_point()
    try:
        publishers = Publishers(plan)
    except BrokerConfigError as exc:
        pause_unconfigured(plan, str(exc), actor)
        plan.refresh_from_db()
        result.status = plan.status
        return result
    slug = plan.channel.slug  # once: refresh_from_db() below drops the cached channel
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-publish")
    pipe = _Pipeline(plan, actor, slug, result, publishers, pool, crash_after)
    try:
        start_plan(plan)
        adopt_in_flight(plan)  # what a run that is gone left in flight: in doubt, sent first
        while True:
            turn = _turn(pipe, owner, deadline)
            if turn is _Turn.NEXT:
                continue
            if turn is _Turn.TAKEN_OVER:
                pipe.recount()
                return result  # what is in flight stays so, for the new owner to take over
            break
        pipe.recount()
    finally:
        if pipe.flight is not None:  # an error or a lost lease: let the publish end, record nothing
            wait_futures([pipe.flight.outcomes])
        pool.submit(publishers.close).result()
        pool.shutdown()
    plan.refresh_from_db()
    result.status = plan.status
    return result


_Landed = tuple[list[ReplayItem], list[PublishOutcome]]


class _Turn(enum.Enum):
    NEXT = "next"  # go round again
    STOP = "stop"  # end this slice
    TAKEN_OVER = "taken over"  # the lease is lost: end at once


@dataclasses.dataclass
class _Pipeline:
    """The state of ``_run_replay``'s pipeline: the batch in flight and the counters."""

    plan: ReplayPlan
    actor: Actor
    slug: str
    result: RunResult
    publishers: Publishers
    pool: ThreadPoolExecutor
    crash_after: int | None
    batches: int = 0
    flight: _InFlight | None = None
    # Groups (or, where the claim did not read the group, entries) whose entries' status
    # changed since their open counts were last recounted.
    unrecounted: list[int] = dataclasses.field(default_factory=list)
    groups: set[int] = dataclasses.field(default_factory=set)
    recounted_at: float = dataclasses.field(default_factory=time.monotonic)
    # No item of a crashed run is left in doubt: ``take_batch`` need not look again.
    doubt_cleared: bool = False

    def land(self) -> _Landed | None:
        """Step (a): the outcomes of the batch in flight, if any."""
        if self.flight is None:
            return None
        landed, self.flight = self.flight, None
        outcomes = landed.outcomes.result()
        self.batches += 1
        if self.crash_after is not None and self.batches >= self.crash_after:
            os._exit(137)  # fault injection: published, outcomes not committed
        return landed.items, outcomes

    def send(self, items: list[ReplayItem]) -> None:
        """Step (c): hand the claimed batch to the publisher thread, which builds its messages
        (the database is read here, on this thread, only for columns the claim did not
        return)."""
        stored = stored_columns(items)
        self.flight = _InFlight(items, self.pool.submit(self.publishers.send, items, stored))

    def settle(self, landed: _Landed | None) -> None:
        """Step (d)."""
        if landed is not None:
            ok, failed = record_outcomes(self.plan, *landed, self.actor, self.slug)
            self.result.published += len(landed[0])
            self.result.confirmed += ok
            self.result.failed += failed
            for item in landed[0]:
                known, group = group_of(item)
                if not known:
                    self.unrecounted.append(item.entry_id)
                elif group is not None:
                    self.groups.add(group)
            self.recount(force=False)

    def recount(self, force: bool = True) -> None:
        """The open counts of the groups of the entries recorded since the last recount: once
        per ``RECOUNT_S`` or ``RECOUNT_EVERY`` entries, and when the run ends (one recount per
        batch cost more than the batch's own outcome UPDATEs). A recount cannot drift, so a
        crash before it leaves the counts behind only until the next recount of the group."""
        due = len(self.unrecounted) >= RECOUNT_EVERY or (
            time.monotonic() - self.recounted_at >= RECOUNT_S
        )
        if (self.unrecounted or self.groups) and (force or due):
            if self.unrecounted:
                refresh_open_counts(self.unrecounted)
            refresh_group_counts(sorted(self.groups))
            self.unrecounted, self.groups = [], set()
            self.recounted_at = time.monotonic()


def _turn(pipe: _Pipeline, owner: str, deadline: float) -> _Turn:
    """One turn of ``_run_replay``: renew the lease, then steps (a) to (d)."""
    plan, result = pipe.plan, pipe.result
    plan.refresh_from_db()
    if not renew_lease(plan.pk, owner):
        result.status = plan.status
        return _Turn.TAKEN_OVER
    runnable = plan.status in RUNNABLE
    # During the canary only the first ``canary_size`` items (by position) go out.
    canary = runnable and bool(plan.canary_size) and plan.canary_passed_at is None
    upto = plan.canary_size if canary else None
    started = time.monotonic()
    landed = pipe.land()
    lost = _lost_reason(landed)
    if lost or plan.status == PlanStatus.WAITING:
        pipe.settle(landed)  # the lost ones go back to PENDING, their attempt given back
        reason = lost or plan.status_note
        if _await_broker(plan, pipe.publishers, pipe.pool, reason, owner, deadline):
            return _Turn.NEXT
        plan.refresh_from_db()
        result.more = plan.status == PlanStatus.WAITING
        result.retry_in = PROBE_MAX_S
        return _Turn.STOP
    busy = {i.pk for i in landed[0]} if landed else set()  # in flight, but not in doubt
    look = not pipe.doubt_cleared
    items = take_batch(plan, _batch_limit(plan), not runnable, upto, busy, doubt=look)
    if look and not any(in_doubt(i) for i in items):
        pipe.doubt_cleared = True  # none left; none appear while this run holds the lease
    if items:
        pipe.send(items)
    pipe.settle(landed)
    if not items:
        if landed is not None:
            return _Turn.NEXT  # the outcomes just recorded may have made items due again
        return _idle(pipe, runnable, canary, upto, deadline)
    if plan.velocity:
        spare = len(items) / plan.velocity - (time.monotonic() - started)
        if spare > 0:
            time.sleep(spare)
    if time.monotonic() > deadline:
        landed = pipe.land()
        pipe.settle(landed)
        if lost := _lost_reason(landed):
            enter_waiting(plan, lost, pipe.actor)
        result.more = True
        return _Turn.STOP
    return _Turn.NEXT


def _idle(
    pipe: _Pipeline, runnable: bool, canary: bool, upto: int | None, deadline: float
) -> _Turn:
    """Nothing to send and nothing in flight: stop, wait for the next due item, check the
    canary, or finish the plan."""
    plan, result = pipe.plan, pipe.result
    if adopt_in_flight(plan):
        # Nothing of this run is in flight: these are a run's that lost its lease meanwhile.
        pipe.doubt_cleared = False
        return _Turn.NEXT
    if not runnable:
        return _Turn.STOP  # paused / cancelled / halted, and nothing in doubt
    wait = next_due_in(plan, upto)
    if wait is None:
        if canary:
            if canary_check(plan, deadline):
                return _Turn.NEXT
            plan.refresh_from_db()
            result.more = plan.status == PlanStatus.RUNNING
            result.retry_in = 1.0
            return _Turn.STOP
        finish(plan, pipe.actor)
        return _Turn.STOP
    if time.monotonic() + wait > deadline:
        result.more, result.retry_in = True, wait
        return _Turn.STOP
    time.sleep(min(wait, 5.0))
    return _Turn.NEXT


def _lost_reason(landed: tuple[list[ReplayItem], list[PublishOutcome]] | None) -> str:
    """Why the broker connection was lost while publishing this batch, else ""."""
    outcomes = landed[1] if landed else []
    return next((o.reason for o in outcomes if o.connection_lost), "")


def _await_broker(
    plan: ReplayPlan,
    publishers: Publishers,
    pool: ThreadPoolExecutor,
    reason: str,
    owner: str,
    deadline: float,
) -> bool:
    """The broker does not answer. An unreachable broker is not a failure of the messages:

    1. mark the plan WAITING with the reason (one audit event per outage, outcome "failed");
    2. probe on the publisher thread (open a publisher) after 1, 2, 4, 5, 5 … seconds,
       renewing the lease, while the plan is still WAITING and the slice lasts;
    3. when the broker answers: RUNNING again, audited with how long it waited; True.

    False when the slice ends (the plan stays WAITING; the next run probes on), the lease is
    lost, or a person paused or cancelled the plan meanwhile."""
    actor = Actor.system("replay-relay")
    if not enter_waiting(plan, reason, actor):
        return False
    delay = PROBE_MIN_S
    while time.monotonic() + delay <= deadline:
        time.sleep(delay)
        plan.refresh_from_db()
        if plan.status != PlanStatus.WAITING or not renew_lease(plan.pk, owner):
            return False
        problem = pool.submit(publishers.probe).result()
        if problem is None:
            return leave_waiting(plan, actor)
        note = f"broker unreachable: {problem}"[:1000]
        if note != plan.status_note:
            note_waiting(plan, note)
        delay = min(delay * 2, PROBE_MAX_S)
    return False


def _batch_limit(plan: ReplayPlan) -> int:
    """Bounded: ``FAST_BATCH_SIZE`` without a velocity; with one, ``BATCH_SIZE`` or about one
    second of messages at a low velocity."""
    if plan.velocity:
        return max(1, min(BATCH_SIZE, int(plan.velocity)))
    return FAST_BATCH_SIZE
