"""The relay: works through frozen replay plans, one plan at a time under a lease.

1. Claim the plan with a conditional UPDATE (no lease, an expired one, or our own).
2. Take a bounded batch of open items in plan order (``FAST_BATCH_SIZE`` without a velocity,
   else ``BATCH_SIZE`` or less at a low velocity; bounded by the canary). In one transaction
   (on PostgreSQL one ``UPDATE … RETURNING`` that also returns the messages' columns) mark
   them SENDING, bump ``attempts`` and persist their ``replay_id`` — the SAME id again when
   the previous attempt's outcome is unknown (timeout, connection lost), a new one after a
   definite refusal (nack, unroutable) — then commit. A crash from here on leaves the items
   SENDING; the next run republishes them with the same id, so extra copies are bounded by the
   in-flight window (``IN_FLIGHT``: the relay publishes one batch while it records the one
   before) and carry the id they share.
3. Publish the batch: body bytes, original headers minus the broker's death bookkeeping,
   the idempotency key untouched, ``x-dlq-replay-id`` added; persistent, confirmed, mandatory.
4. In one transaction record each outcome: confirmed → item CONFIRMED, entry REPLAYED; refused
   → retried after a capped exponential backoff with jitter, FAILED (entry FAILED) once the
   attempts are spent or the refusal is permanent. Each terminal outcome is one audit event.
5. Pace to the plan's velocity; renew the lease; stop at pause/cancel/halt (after resolving the
   batch in flight), at the end of the time slice, or when every item is resolved (DONE).

Canary: with ``canary_size`` k, the relay sends the first k items only, waits
``canary_wait_s``, drains the channel's DLQ once (bounded) and halts the plan if any replayed
message of the plan came back (a child entry) or any new entry of the plan's failure groups
arrived since the plan started; otherwise it ramps to the full velocity.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from django.db import connection, transaction
from django.db.models import CharField, Exists, F, OuterRef, Q, Value
from django.db.models.base import ModelState
from django.db.models.functions import Cast, Coalesce, Concat
from django.utils import timezone

from audit.actions import Actor, EventSpec, record, record_many
from audit.batch import record_uniform
from audit.sealer import request_checkpoint
from brokers.base import Address, BrokerError, OutgoingMessage, Publisher, PublishOutcome
from channels_registry.models import (
    BrokerConfigError,
    BrokerKind,
)
from dlq.freeze import altered_items
from dlq.models import (
    DeadLetter,
    ItemStatus,
    PlanKind,
    PlanStatus,
    ReplayItem,
    ReplayPlan,
    Status,
    refresh_open_counts,
)
from dlq.replay_models import RUNNABLE, parse_replay_id

log = logging.getLogger(__name__)

REPLAY_ID_HEADER = "x-dlq-replay-id"
BATCH_SIZE = 500  # items per publish round trip of a plan with a velocity
# Without a velocity, larger batches: fewer round trips and commits per message, and the
# broker's confirms of one batch stream in while it is still being published.
FAST_BATCH_SIZE = 2000
# The relay publishes one batch while it records the outcomes of the one before (see
# ``_run_replay``): at most this many items are SENDING, and a crash repeats at most these.
IN_FLIGHT = 2 * FAST_BATCH_SIZE
# The groups' open counts follow the entries' statuses in one recount per this many entries or
# seconds (and at the end of a run), not per batch.
RECOUNT_EVERY = 10_000
RECOUNT_S = 2.0
# A relay renews its lease every batch; a crashed one is taken over once it expires. The
# environment override is for the fault tests, which restart a killed relay at once.
LEASE_S = float(os.environ.get("DLO_REPLAY_LEASE_S", "60"))
SLICE_S = 300.0  # one relay run; the task re-enqueues itself for the rest
# While the broker is unreachable the relay probes it after 1, 2, 4, then every 5 seconds.
PROBE_MIN_S = 1.0
PROBE_MAX_S = 5.0
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
MAX_ATTEMPTS = 5
CANARY_INGEST_BATCHES = 5
# Headers the broker adds when it dead-letters a message: they describe the old death, and a
# replay that carried them would look dead already (and forged ones must change nothing).
DEATH_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")
DEATH_HEADERS = {"x-death", REPLAY_ID_HEADER}


# -- the outgoing message ------------------------------------------------------------------


def _header_value(value: Any) -> Any:
    """Stored JSON-safe header values back to what the broker had: ``{"$bytes": hex}`` → bytes."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"} and isinstance(value["$bytes"], str):
            try:
                return bytes.fromhex(value["$bytes"])
            except ValueError:
                return value
        return {k: _header_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_header_value(v) for v in value]
    return value


def replay_headers(headers: dict[str, Any], replay_id: str) -> dict[str, Any]:
    """Original headers minus the death bookkeeping, plus ``x-dlq-replay-id``. Everything
    else (the idempotency key first of all) is kept exactly."""
    kept = {}
    for k, v in (headers or {}).items():
        low = k.lower()
        if low in DEATH_HEADERS or low.startswith(DEATH_HEADER_PREFIXES):
            continue
        kept[k] = _header_value(v) if isinstance(v, dict | list) else v
    kept[REPLAY_ID_HEADER] = replay_id
    return kept


def outgoing(
    body: bytes | memoryview | None,
    headers: dict[str, Any] | None,
    properties: dict[str, Any] | None,
    item: ReplayItem,
) -> OutgoingMessage:
    """The message for one attempt of ``item``, from its entry's stored columns."""
    return OutgoingMessage(
        key=str(item.pk),
        body=bytes(body or b""),
        headers=replay_headers(headers or {}, item.replay_id),
        properties={
            k: v for k, v in (properties or {}).items() if k not in ("headers", "delivery_mode")
        },
    )


# -- the relay -------------------------------------------------------------------------------


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


def backoff(attempt: int) -> float:
    """Capped exponential backoff with full jitter: 1 s, 2 s, 4 s … ≤ 60 s."""
    return random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1))


def _definite_refusal(outcome: PublishOutcome) -> bool:
    """The broker said no (nothing was enqueued): the next attempt may take a new replay id.
    Anything else unconfirmed (timeout, connection lost) is in doubt: same id again."""
    return outcome.refused or outcome.permanent


def _claim_plan(plan_id: int, owner: str) -> bool:
    now = timezone.now()
    lease = now + dt.timedelta(seconds=LEASE_S)
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner)
    open_items = Exists(ReplayItem.objects.filter(plan=OuterRef("pk"), status=ItemStatus.SENDING))
    claimable = Q(status__in=RUNNABLE) | Q(open_items)
    updated = (
        ReplayPlan.objects.filter(free, pk=plan_id)
        .annotate(open_items=open_items)
        .filter(claimable)
        .update(lease_owner=owner, lease_until=lease)
    )
    return updated == 1


def _renew(plan_id: int, owner: str) -> bool:
    lease = timezone.now() + dt.timedelta(seconds=LEASE_S)
    return bool(ReplayPlan.objects.filter(pk=plan_id, lease_owner=owner).update(lease_until=lease))


def _release(plan_id: int, owner: str) -> None:
    ReplayPlan.objects.filter(pk=plan_id, lease_owner=owner).update(
        lease_owner="", lease_until=None
    )


def _take_batch(
    plan: ReplayPlan,
    limit: int,
    only_in_doubt: bool,
    upto: int | None = None,
    busy: set[int] | frozenset[int] = frozenset(),
) -> list[ReplayItem]:
    """Step 2: claim up to ``limit`` items (positions below ``upto`` when given) for an
    attempt and persist their replay ids. ``busy``: SENDING items of this run whose outcome
    is about to be recorded (not in doubt)."""
    now = timezone.now()
    with transaction.atomic():
        # In-doubt items of a crashed run first: they were (maybe) published already.
        in_doubt = ReplayItem.objects.filter(plan=plan, status=ItemStatus.SENDING)
        if busy:
            in_doubt = in_doubt.exclude(pk__any=busy)
        items = list(in_doubt.order_by("position")[:limit])
        if not items and not only_in_doubt:
            if connection.vendor == "postgresql":
                return _claim_due(plan, limit, now, upto)
            due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
            if upto is not None:
                due &= Q(position__lt=upto)
            items = list(
                ReplayItem.objects.filter(due, plan=plan, status=ItemStatus.PENDING).order_by(
                    "position"
                )[:limit]
            )
        if not items:
            return []
        _claim_items(plan, items)
    return items


def _claim_items(plan: ReplayPlan, items: list[ReplayItem]) -> None:
    """``_take_batch`` for model instances (in-doubt items; every database but PostgreSQL)."""
    fresh = [i for i in items if i.status == ItemStatus.PENDING]
    # Published again with the id it had: the earlier copy may be stored (relay crash,
    # lost connection, no confirm), so the target may now hold two.
    again = [i for i in items if i.status == ItemStatus.SENDING or i.replay_id]
    _count_sends(plan, len(items), sum(1 for i in items if i.publishes == 0),
                 sum(1 for i in again if not i.republished))  # fmt: skip
    crashed = [i.pk for i in items if i.status == ItemStatus.SENDING]
    if crashed:
        ReplayItem.objects.filter(pk__any=crashed).update(
            publishes=F("publishes") + 1, republished=True
        )
    # Two UPDATEs, not a per-row CASE: items whose last outcome was in doubt keep their
    # replay id; the others get "<plan>:<item>:<attempt>" computed by the database.
    keep = [i.pk for i in fresh if i.replay_id]
    new = [i.pk for i in fresh if not i.replay_id]
    bump = {
        "status": ItemStatus.SENDING,
        "attempts": F("attempts") + 1,
        "publishes": F("publishes") + 1,
    }
    if keep:
        ReplayItem.objects.filter(pk__any=keep).update(**bump, republished=True)
    if new:
        replay_id = Concat(
            Value(f"{plan.pk}:"),
            Cast("id", CharField()),
            Value(":"),
            Cast(F("attempts") + 1, CharField()),
            output_field=CharField(),
        )
        ReplayItem.objects.filter(pk__any=new).update(**bump, replay_id=replay_id)
    for item in fresh:
        item.attempts += 1
        item.status = ItemStatus.SENDING
        item.replay_id = item.replay_id or f"{plan.pk}:{item.pk}:{item.attempts}"
    for item in items:
        item.publishes += 1
    for item in again:
        item.republished = True


def _claim_sql(upto: bool) -> str:
    """One statement for the common case (due PENDING items): pick them in plan order, mark
    them SENDING with their attempt and replay id (kept when the last outcome was in doubt,
    else "<plan>:<item>:<attempt>"), and return them with the columns of their entries that
    the message needs. ``i.status`` is checked again on the row itself, so an item a
    concurrent cancel took is skipped, not revived."""
    q = connection.ops.quote_name
    item, entry = q(ReplayItem._meta.db_table), q(DeadLetter._meta.db_table)
    position = q("position")
    return f"""
        WITH picked AS (
            SELECT id, publishes AS old_publishes, republished AS old_republished,
                   replay_id <> '' AS kept
            FROM {item}
            WHERE plan_id = %(plan)s AND status = 'pending'
              AND (next_attempt_at IS NULL OR next_attempt_at <= %(now)s)
              {f"AND {position} < %(upto)s" if upto else ""}
            ORDER BY {position}
            LIMIT %(limit)s
        )
        UPDATE {item} AS i SET
            status = 'sending',
            attempts = i.attempts + 1,
            publishes = i.publishes + 1,
            republished = i.republished OR p.kept,
            replay_id = CASE WHEN p.kept THEN i.replay_id
                        ELSE %(prefix)s || i.id || ':' || (i.attempts + 1) END
        FROM picked AS p, {entry} AS d
        WHERE i.id = p.id AND i.status = 'pending' AND d.id = i.entry_id
        RETURNING i.id, i.entry_id, i.{position}, i.attempts, i.replay_id, i.publishes,
                  i.republished, p.old_publishes, p.old_republished, p.kept,
                  d.body, d.headers, d.properties
    """


def _claim_due(
    plan: ReplayPlan, limit: int, now: dt.datetime, upto: int | None
) -> list[ReplayItem]:
    """``_take_batch`` on PostgreSQL for due PENDING items: one ``UPDATE … RETURNING``
    (``_claim_sql``) and the plan's counters, inside the caller's transaction."""
    params: dict[str, Any] = {
        "plan": plan.pk,
        "now": now,
        "upto": upto,
        "limit": limit,
        "prefix": f"{plan.pk}:",
    }
    with connection.cursor() as cursor:
        cursor.execute(_claim_sql(upto is not None), params)
        rows = sorted(cursor.fetchall(), key=lambda r: r[2])
    if not rows:
        return []
    first = sum(1 for r in rows if r[7] == 0)
    doubled = sum(1 for r in rows if r[9] and not r[8])
    _count_sends(plan, len(rows), first, doubled)
    alias = connection.alias  # once: each lookup goes through a thread-local
    return [_claimed_item(plan, row, alias) for row in rows]


_ITEM_FIELDS = [f.attname for f in ReplayItem._meta.concrete_fields]


def _claimed_item(plan: ReplayPlan, row: tuple[Any, ...], alias: str) -> ReplayItem:
    """A ReplayItem for a claimed row without the cost of ``Model.__init__`` (thousands per
    batch), every concrete field set, plus the entry's columns the message needs."""
    item = ReplayItem.__new__(ReplayItem)
    pk, entry_id, position, attempts, replay_id, publishes, republished = row[:7]
    body, headers, properties = row[10:13]
    item.__dict__.update(
        id=pk, plan_id=plan.pk, entry_id=entry_id, position=position,
        status=ItemStatus.SENDING, attempts=attempts, replay_id=replay_id,
        publishes=publishes, republished=republished, last_error="",
        next_attempt_at=None, finished_at=None, _state=ModelState(),
        _columns=(body, _json(headers), _json(properties)),
    )  # fmt: skip
    item._state.adding, item._state.db = False, alias
    return item


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _count_sends(plan: ReplayPlan, sent: int, first: int, doubled: int) -> None:
    """Counters that tell the truth (inside the claim's transaction): every publish, distinct
    entries published (``first``), and distinct entries that may have gone out twice."""
    ReplayPlan.objects.filter(pk=plan.pk).update(
        sent=F("sent") + sent,
        sent_entries=F("sent_entries") + first,
        maybe_twice=F("maybe_twice") + doubled,
    )


@dataclasses.dataclass
class _Outcomes:
    """One batch's outcomes, sorted for ``_record_outcomes``."""

    ok: list[ReplayItem] = dataclasses.field(default_factory=list)
    failed: list[tuple[ReplayItem, str]] = dataclasses.field(default_factory=list)
    retry: list[ReplayItem] = dataclasses.field(default_factory=list)


def _sort_outcomes(
    plan: ReplayPlan, items: list[ReplayItem], outcomes: list[PublishOutcome], now: dt.datetime
) -> _Outcomes:
    """Confirmed, failed for good, or to be retried (the items updated to their next state)."""
    by_key = {o.key: o for o in outcomes}
    sorted_ = _Outcomes()
    for item in items:
        outcome = by_key.get(str(item.pk)) or PublishOutcome(str(item.pk), False, "no outcome")
        if outcome.confirmed:
            sorted_.ok.append(item)
            continue
        item.last_error = outcome.reason[:2000] or "not confirmed"
        if outcome.connection_lost:
            # Not the message's fault: the attempt is given back, the replay id kept (the
            # copy may be stored), and the plan waits for the broker (see ``_await_broker``).
            item.attempts = max(item.attempts - 1, 0)
            item.status = ItemStatus.PENDING
            item.next_attempt_at = None
            sorted_.retry.append(item)
            continue
        if outcome.permanent or item.attempts >= plan.max_attempts:
            sorted_.failed.append((item, item.last_error))
            continue
        if _definite_refusal(outcome):
            item.replay_id = ""  # nothing was enqueued: the next attempt gets its own id
        item.status = ItemStatus.PENDING
        item.next_attempt_at = now + dt.timedelta(seconds=backoff(item.attempts))
        sorted_.retry.append(item)
    return sorted_


def _record_outcomes(
    plan: ReplayPlan,
    items: list[ReplayItem],
    outcomes: list[PublishOutcome],
    actor: Actor,
    slug: str | None = None,
) -> tuple[int, int]:
    """Step 4: one transaction for the batch's outcomes. Returns (confirmed, failed). The
    groups' open counts are not recounted here (see ``_Pipeline.recount``)."""
    now = timezone.now()
    batch = _sort_outcomes(plan, items, outcomes, now)
    slug = plan.channel.slug if slug is None else slug
    with transaction.atomic():
        n_ok = _record_confirmed(plan, batch.ok, now, actor, slug)
        _record_failed(plan, batch.failed, now, actor, slug)
        if batch.retry:
            ReplayItem.objects.bulk_update(
                batch.retry, ["status", "next_attempt_at", "last_error", "replay_id", "attempts"]
            )
        ReplayPlan.objects.filter(pk=plan.pk).update(
            confirmed=F("confirmed") + n_ok, failed=F("failed") + len(batch.failed)
        )
    return n_ok, len(batch.failed)


def _outcome_event(plan: ReplayPlan, action: str, slug: str, **extra: Any) -> EventSpec:
    """The shared part of a batch's per-entry outcome events (``record_uniform``)."""
    after = {"plan": plan.pk, "item": 0, "replay_id": "", "attempts": 0,
             "target": plan.target_display}  # fmt: skip
    return EventSpec(action, "dlq.deadletter", 0, "", slug, after=after, **extra)


_PER_ENTRY = ("item", "replay_id", "attempts")


def _record_confirmed(
    plan: ReplayPlan, ok: list[ReplayItem], now: dt.datetime, actor: Actor, slug: str
) -> int:
    """Confirmed items: item CONFIRMED, entry REPLAYED, one event each (set-based)."""
    if not ok:
        return 0
    # Only items still SENDING (a concurrent cancel never touches those, see actions).
    n_ok = ReplayItem.objects.filter(pk__any=[i.pk for i in ok], status=ItemStatus.SENDING).update(
        status=ItemStatus.CONFIRMED, finished_at=now, last_error=""
    )
    DeadLetter.objects.filter(pk__any=[i.entry_id for i in ok]).update(status=Status.REPLAYED)
    record_uniform(
        _outcome_event(plan, "dlq.replay.replayed", slug),
        _PER_ENTRY,
        [(i.entry_id, f"dead letter #{i.entry_id}", i.pk, i.replay_id, i.attempts) for i in ok],
        actor=actor,
    )
    return n_ok


def _record_failed(
    plan: ReplayPlan,
    failed: list[tuple[ReplayItem, str]],
    now: dt.datetime,
    actor: Actor,
    slug: str,
) -> None:
    """Items failed for good: item and entry FAILED with the reason, one event each."""
    for item, reason in failed:
        ReplayItem.objects.filter(pk=item.pk, status=ItemStatus.SENDING).update(
            status=ItemStatus.FAILED, finished_at=now, last_error=reason
        )
    if failed:
        DeadLetter.objects.filter(pk__any=[i.entry_id for i, _ in failed]).update(
            status=Status.FAILED
        )
    specs = [
        dataclasses.replace(
            _outcome_event(plan, "dlq.replay.failed", slug, reason=reason, outcome="failed"),
            target_id=i.entry_id,
            target_repr=f"dead letter #{i.entry_id}",
            after={
                "plan": plan.pk,
                "item": i.pk,
                "replay_id": i.replay_id,
                "attempts": i.attempts,
                "target": plan.target_display,
            },
        )  # fmt: skip
        for i, reason in failed
    ]
    record_many(specs, actor=actor)


class _Publishers:
    """Open publishers per target address, reopened after a connection loss. NATS messages go
    to the subject their stream stored them under (broker metadata, never a header)."""

    def __init__(self, plan: ReplayPlan) -> None:
        from dlq.ingest import adapter_for

        self.plan = plan
        self.adapter = adapter_for(plan.channel)
        self.nats = plan.channel.broker.kind == BrokerKind.NATS
        self.open: dict[Address, Publisher] = {}

    def target_for(self, properties: dict[str, Any] | None) -> Address:
        """Where one entry goes, from its stored broker properties."""
        base = Address(self.plan.target_name, self.plan.target_group)
        if self.nats:
            subject = (properties or {}).get("subject")
            stream = (properties or {}).get("stream")
            if isinstance(subject, str) and subject and stream == self.plan.target_name:
                return Address(subject)
        return base

    def publish(self, batch: list[tuple[Address, OutgoingMessage]]) -> list[PublishOutcome]:
        """Publish per target. A session the adapter reports lost (``connection_lost`` on an
        outcome, or any ``BrokerError`` from opening or publishing: the session is unusable)
        is closed and reopened next time; the targets after it are not tried in this batch."""
        groups: dict[Address, list[OutgoingMessage]] = {}
        for target, message in batch:
            groups.setdefault(target, []).append(message)
        outcomes: list[PublishOutcome] = []
        lost = ""
        for target, messages in groups.items():
            if lost:
                outcomes.extend(PublishOutcome.lost(m.key, f"not sent: {lost}") for m in messages)
                continue
            try:
                publisher = self.open.get(target)
                if publisher is None:
                    publisher = self.open[target] = self.adapter.open_publisher(target)
                result = publisher.publish(messages)
            except BrokerError as exc:
                result = [PublishOutcome.lost(m.key, f"broker error: {exc}") for m in messages]
            first_lost = next((o for o in result if o.connection_lost), None)
            if first_lost is not None:
                lost = first_lost.reason
                self.drop(target)
            outcomes.extend(result)
        return outcomes

    def probe(self) -> str | None:
        """Open (and close) a publisher to the plan's target: None when the broker answers,
        else why not."""
        try:
            publisher = self.adapter.open_publisher(
                Address(self.plan.target_name, self.plan.target_group)
            )
        except BrokerError as exc:
            return str(exc)
        except Exception as exc:  # an adapter bug must not end the wait in a traceback loop
            return f"{type(exc).__name__}: {exc}"
        try:
            publisher.close()
        except Exception:  # the broker answered; a failing close changes nothing
            log.debug("closing the probe publisher failed", exc_info=True)
        return None

    def drop(self, target: Address) -> None:
        publisher = self.open.pop(target, None)
        if publisher is not None:
            try:
                publisher.close()
            except Exception:  # closing a broken session must not hide the outcome
                log.debug("closing publisher failed", exc_info=True)

    def close(self) -> None:
        for target in list(self.open):
            self.drop(target)


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
    if not _claim_plan(plan_id, owner):
        result.claimed = False
        return result
    try:
        plan = ReplayPlan.objects.select_related("channel", "channel__broker").get(pk=plan_id)
        if plan.started_at is None and plan.status in RUNNABLE:
            problem = altered_items(plan)
            if problem:
                _pause(plan, problem, Actor.system(f"{plan.kind}-relay"))
                result.status = PlanStatus.PAUSED
                return result
        if plan.kind == PlanKind.DISCARD:
            from dlq.actions import run_discard_plan

            return run_discard_plan(plan, owner, result, max_seconds)
        return _run_replay(plan, owner, result, max_seconds)
    finally:
        _release(plan_id, owner)


def _start(plan: ReplayPlan) -> None:
    if plan.status == PlanStatus.QUEUED:
        ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.QUEUED).update(
            status=PlanStatus.RUNNING, started_at=Coalesce(F("started_at"), timezone.now())
        )
        plan.refresh_from_db()


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

    So at most two batches are SENDING at any time (``IN_FLIGHT``): the one being recorded and
    the one being published. Only this thread touches the database; only the publisher thread
    touches the broker connections (neither pika nor the asyncio clients are thread-safe)."""
    actor = Actor.system("replay-relay")
    deadline = time.monotonic() + max_seconds
    crash_after = _crash_point()
    try:
        publishers = _Publishers(plan)
    except BrokerConfigError as exc:
        _pause_unconfigured(plan, str(exc), actor)
        plan.refresh_from_db()
        result.status = plan.status
        return result
    slug = plan.channel.slug  # once: refresh_from_db() below drops the cached channel
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-publish")
    pipe = _Pipeline(plan, actor, slug, result, publishers, pool, crash_after)
    try:
        _start(plan)
        while True:
            turn = _turn(pipe, owner, deadline)
            if turn is _Turn.NEXT:
                continue
            if turn is _Turn.TAKEN_OVER:
                pipe.recount()
                return result  # what is in flight stays SENDING for the new owner
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
    publishers: _Publishers
    pool: ThreadPoolExecutor
    crash_after: int | None
    batches: int = 0
    flight: _InFlight | None = None
    # Entries whose status changed since their groups' open counts were last recounted.
    unrecounted: list[int] = dataclasses.field(default_factory=list)
    recounted_at: float = dataclasses.field(default_factory=time.monotonic)

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
        """Step (c): hand the claimed batch to the publisher thread."""
        batch = _outgoing_batch(self.publishers, items)
        self.flight = _InFlight(items, self.pool.submit(self.publishers.publish, batch))

    def settle(self, landed: _Landed | None) -> None:
        """Step (d)."""
        if landed is not None:
            ok, failed = _record_outcomes(self.plan, *landed, self.actor, self.slug)
            self.result.published += len(landed[0])
            self.result.confirmed += ok
            self.result.failed += failed
            self.unrecounted.extend(i.entry_id for i in landed[0])
            self.recount(force=False)

    def recount(self, force: bool = True) -> None:
        """The open counts of the groups of the entries recorded since the last recount: once
        per ``RECOUNT_S`` or ``RECOUNT_EVERY`` entries, and when the run ends (one recount per
        batch cost more than the batch's own outcome UPDATEs). A recount cannot drift, so a
        crash before it leaves the counts behind only until the next recount of the group."""
        due = len(self.unrecounted) >= RECOUNT_EVERY or (
            time.monotonic() - self.recounted_at >= RECOUNT_S
        )
        if self.unrecounted and (force or due):
            refresh_open_counts(self.unrecounted)
            self.unrecounted = []
            self.recounted_at = time.monotonic()


def _turn(pipe: _Pipeline, owner: str, deadline: float) -> _Turn:
    """One turn of ``_run_replay``: renew the lease, then steps (a) to (d)."""
    plan, result = pipe.plan, pipe.result
    plan.refresh_from_db()
    if not _renew(plan.pk, owner):
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
    busy = {i.pk for i in landed[0]} if landed else set()  # SENDING, but not in doubt
    items = _take_batch(plan, _batch_limit(plan), not runnable, upto, busy)
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
            _enter_waiting(plan, lost, pipe.actor)
        result.more = True
        return _Turn.STOP
    return _Turn.NEXT


def _idle(
    pipe: _Pipeline, runnable: bool, canary: bool, upto: int | None, deadline: float
) -> _Turn:
    """Nothing to send and nothing in flight: stop, wait for the next due item, check the
    canary, or finish the plan."""
    plan, result = pipe.plan, pipe.result
    if not runnable:
        return _Turn.STOP  # paused / cancelled / halted, and nothing in doubt
    wait = _next_due_in(plan, upto)
    if wait is None:
        if canary:
            if _canary_check(plan, deadline):
                return _Turn.NEXT
            plan.refresh_from_db()
            result.more = plan.status == PlanStatus.RUNNING
            result.retry_in = 1.0
            return _Turn.STOP
        _finish(plan, pipe.actor)
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
    publishers: _Publishers,
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
    if not _enter_waiting(plan, reason, actor):
        return False
    delay = PROBE_MIN_S
    while time.monotonic() + delay <= deadline:
        time.sleep(delay)
        plan.refresh_from_db()
        if plan.status != PlanStatus.WAITING or not _renew(plan.pk, owner):
            return False
        problem = pool.submit(publishers.probe).result()
        if problem is None:
            return _leave_waiting(plan, actor)
        note = f"broker unreachable: {problem}"[:1000]
        if note != plan.status_note:
            ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.WAITING).update(
                status_note=note
            )
        delay = min(delay * 2, PROBE_MAX_S)
    return False


def _enter_waiting(plan: ReplayPlan, reason: str, actor: Actor) -> bool:
    """Step 1 of ``_await_broker``; True when the plan is (now or already) WAITING."""
    note = reason if reason.startswith("broker unreachable") else f"broker unreachable: {reason}"
    with transaction.atomic():
        changed = ReplayPlan.objects.filter(
            pk=plan.pk, status__in=[PlanStatus.QUEUED, PlanStatus.RUNNING]
        ).update(
            status=PlanStatus.WAITING,
            status_note=note[:1000],
            waiting_since=timezone.now(),
            outages=F("outages") + 1,
        )
        plan.refresh_from_db()
        if changed:
            log.warning("replay plan %s waits for its broker: %s", plan.pk, note)
            record(
                f"dlq.{plan.kind}.broker_unreachable",
                actor=actor,
                target=plan,
                channel_slug=plan.channel.slug,
                reason=note[:1000],
                after={"status": PlanStatus.WAITING, "outage": plan.outages},
                outcome="failed",
            )
    return plan.status == PlanStatus.WAITING


def _leave_waiting(plan: ReplayPlan, actor: Actor) -> bool:
    """Step 3 of ``_await_broker``."""
    now = timezone.now()
    with transaction.atomic():
        changed = ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.WAITING).update(
            status=PlanStatus.RUNNING, status_note="", waiting_since=None
        )
        if changed:
            waited = (now - plan.waiting_since).total_seconds() if plan.waiting_since else None
            log.warning("replay plan %s: the broker answers again, resuming", plan.pk)
            record(
                f"dlq.{plan.kind}.broker_back",
                actor=actor,
                target=plan,
                channel_slug=plan.channel.slug,
                after={"status": PlanStatus.RUNNING, "waited_s": waited, "outage": plan.outages},
            )
        plan.refresh_from_db()
    return bool(changed)


def _pause_unconfigured(plan: ReplayPlan, problem: str, actor: Actor) -> None:
    """The relay cannot even connect (e.g. the broker's URL variable is unset on this worker):
    pause the plan with the reason on it instead of failing the task again and again, so the
    page says what to fix and a person resumes it afterwards."""
    _pause(plan, f"cannot connect to the broker: {problem}", actor)


def _pause(plan: ReplayPlan, note: str, actor: Actor) -> None:
    """Pause a runnable plan with ``note`` on it, audited (outcome "failed")."""
    with transaction.atomic():
        paused = ReplayPlan.objects.filter(pk=plan.pk, status__in=RUNNABLE).update(
            status=PlanStatus.PAUSED, status_note=note[:1000]
        )
        if paused:
            record(
                f"dlq.{plan.kind}.pause",
                actor=actor,
                target=plan,
                channel_slug=plan.channel.slug,
                reason=note[:1000],
                after={"status": PlanStatus.PAUSED},
                outcome="failed",
            )


def _outgoing_batch(
    publishers: _Publishers, items: list[ReplayItem]
) -> list[tuple[Address, OutgoingMessage]]:
    """Step 3's messages, bodies read once per attempt: returned by the claim itself
    (``_claim_due``), else one query per batch (no model instances: the columns the message
    needs)."""
    missing = [i.entry_id for i in items if "_columns" not in i.__dict__]
    rows = (
        DeadLetter.objects.filter(pk__any=missing).values_list(
            "id", "body", "headers", "properties"
        )
        if missing
        else []
    )
    columns = {pk: (body, headers, properties) for pk, body, headers, properties in rows}
    columns.update((i.entry_id, i.__dict__["_columns"]) for i in items if "_columns" in i.__dict__)
    return [(publishers.target_for(columns[i.entry_id][2]), outgoing(*columns[i.entry_id], i))
            for i in items]  # fmt: skip


def _batch_limit(plan: ReplayPlan) -> int:
    """Bounded: ``FAST_BATCH_SIZE`` without a velocity; with one, ``BATCH_SIZE`` or about one
    second of messages at a low velocity."""
    if plan.velocity:
        return max(1, min(BATCH_SIZE, int(plan.velocity)))
    return FAST_BATCH_SIZE


def _next_due_in(plan: ReplayPlan, upto: int | None = None) -> float | None:
    """Seconds until the next pending item is due; None when nothing is open."""
    pending = ReplayItem.objects.filter(plan=plan, status__in=[ItemStatus.PENDING])
    if upto is not None:
        pending = pending.filter(position__lt=upto)
    first = pending.order_by("next_attempt_at").values_list("next_attempt_at", flat=True).first()
    if first is None and not pending.exists():
        return None
    if first is None:
        return 0.0
    return max((first - timezone.now()).total_seconds(), 0.0)


def _finish(plan: ReplayPlan, actor: Actor) -> None:
    """Every item resolved: DONE, or DONE_WITH_FAILURES (audit outcome "failed") when any
    entry failed for good."""
    with transaction.atomic():
        plan.refresh_from_db()
        status = PlanStatus.DONE_WITH_FAILURES if plan.failed else PlanStatus.DONE
        done = ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.RUNNING).update(
            status=status,
            finished_at=timezone.now(),
            status_note=f"{plan.failed} of {plan.total} failed" if plan.failed else "",
        )
        if done:
            plan.refresh_from_db()
            record(
                f"dlq.{plan.kind}.finished",
                actor=actor,
                target=plan,
                channel_slug=plan.channel.slug,
                after={
                    "status": status,
                    "total": plan.total,
                    "confirmed": plan.confirmed,
                    "failed": plan.failed,
                    "discarded": plan.discarded,
                    "skipped": plan.skipped,
                    "publishes": plan.sent,
                    "entries_published": plan.sent_entries,
                    "maybe_twice": plan.maybe_twice,
                    "outages": plan.outages,
                },
                outcome="failed" if plan.failed else "success",
            )
            request_checkpoint()  # a burst ended: anchor it now, not at the next minute


def _canary_check(plan: ReplayPlan, deadline: float) -> bool:
    """Wait out the canary interval, then halt the plan if the failure came back. Returns True
    when the plan may ramp up (the canary passed), False when it halted or must wait more."""
    due = (plan.started_at or timezone.now()) + dt.timedelta(seconds=plan.canary_wait_s)
    last = (
        ReplayItem.objects.filter(plan=plan, finished_at__isnull=False)
        .order_by("-finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )
    if last is not None:
        due = max(due, last + dt.timedelta(seconds=plan.canary_wait_s))
    wait = (due - timezone.now()).total_seconds()
    if wait > 0:
        if time.monotonic() + wait > deadline:
            return False
        time.sleep(wait)
    from dlq.actions import do_ingest_channel

    if plan.channel.has_dlq:
        do_ingest_channel(plan.channel_id, max_batches=CANARY_INGEST_BATCHES)
    recurred = canary_recurrences(plan)
    with transaction.atomic():
        if recurred:
            changed = ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.RUNNING).update(
                status=PlanStatus.HALTED,
                status_note=f"canary: {recurred} message(s) dead-lettered again",
            )
            if changed:
                record(
                    "dlq.replay.halted",
                    actor=Actor.system("replay-relay"),
                    target=plan,
                    channel_slug=plan.channel.slug,
                    reason="canary: the failure recurred",
                    after={"recurred": recurred, "canary_size": plan.canary_size},
                    outcome="failed",
                )
            return False
        ReplayPlan.objects.filter(pk=plan.pk).update(canary_passed_at=timezone.now())
        record(
            "dlq.replay.canary_passed",
            actor=Actor.system("replay-relay"),
            target=plan,
            channel_slug=plan.channel.slug,
            after={"canary_size": plan.canary_size, "wait_s": plan.canary_wait_s},
        )
    return True


def canary_recurrences(plan: ReplayPlan) -> int:
    """Entries that came back since the plan started: children of its entries, or new entries
    in the failure groups its entries belong to."""
    started = plan.started_at or plan.created_at
    entry_ids = ReplayItem.objects.filter(plan=plan).values("entry_id")
    groups = DeadLetter.objects.filter(pk__in=entry_ids, group__isnull=False).values("group_id")
    return (
        DeadLetter.objects.filter(Q(parent_id__in=entry_ids) | Q(group_id__in=groups))
        .filter(ingested_at__gte=started)
        .exclude(pk__in=entry_ids)
        .count()
    )


def orphaned_plans(limit: int = 50) -> list[int]:
    """Plans with work for a relay and no live lease: runnable ones, and stopped ones that
    still have items in doubt (SENDING)."""
    now = timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    in_doubt = Exists(ReplayItem.objects.filter(plan=OuterRef("pk"), status=ItemStatus.SENDING))
    return list(
        ReplayPlan.objects.filter(free)
        .filter(Q(status__in=RUNNABLE) | in_doubt)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )


def link_replayed_parents(entries: Iterable[DeadLetter]) -> None:
    """Lineage at ingest: an entry carrying an ``x-dlq-replay-id`` of one of our plans is a
    replay that dead-lettered again. Point it at the entry it was replayed from and count the
    generation (one query per batch). Unknown or forged ids are ignored."""
    wanted: dict[int, list[tuple[DeadLetter, int]]] = {}  # item id -> (entry, plan id)
    for entry in entries:
        value = next(
            (v for k, v in (entry.headers or {}).items() if k.lower() == REPLAY_ID_HEADER), None
        )
        parsed = parse_replay_id(value)
        if parsed is not None:
            wanted.setdefault(parsed[1], []).append((entry, parsed[0]))
    if not wanted:
        return
    rows = ReplayItem.objects.filter(pk__in=list(wanted)).values_list(
        "pk", "plan_id", "entry_id", "entry__generation", "entry__channel_id"
    )
    for item_id, plan_id, parent_id, generation, channel_id in rows:
        for entry, claimed_plan in wanted[item_id]:
            if channel_id == entry.channel_id and claimed_plan == plan_id:
                entry.parent_id = parent_id
                entry.generation = generation + 1
