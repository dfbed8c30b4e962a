"""Which relay works on a plan and which items it sends next: the plan's lease, and taking a
batch of items (step 2 of ``dlq.plans.relay``), committed before anything is published.

First attempts are taken by a cursor, not written: the freeze gave every item the replay id
of its first attempt (``"<plan>:<item>:1"``), and a claim reads the next items in plan order
from the plan's cursor (``ReplayPlan.claimed_through``) and moves the cursor past them, one
UPDATE of the plan row per batch. The item rows are written once, with their outcome
(``dlq.plans.relay_outcomes``). So an item below the cursor that is still PENDING with no
publish recorded (``publishes`` 0) is in flight, and once its run is gone, in doubt: the next
run takes it over (``adopt_in_flight``: SENDING, its first attempt counted) and republishes
it with the same id, as it does the SENDING items of a crashed retry.

Retries (items that were published before: a refusal's backoff, a lost connection) are taken
by the claim of old: one ``UPDATE … RETURNING`` marks them SENDING with their attempt and
replay id before they are published. The plan row's lock orders a claim against a cancel
(``dlq.plans.actions``), which leaves the items in flight to their outcome."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from django.db import connection, transaction
from django.db.models import CharField, Exists, F, OuterRef, Q, Value
from django.db.models.base import ModelState
from django.db.models.functions import Cast, Concat, Length
from django.utils import timezone

from dlq.models import DeadLetter, ItemStatus, ReplayItem, ReplayPlan
from dlq.models.plans import RUNNABLE, stored_or_first_replay_id
from dlq.plans.relay_publish import STORED_DEATH_HEADERS

# A relay renews its lease every batch; a crashed one is taken over once it expires. The
# environment override is for the fault tests, which restart a killed relay at once.
LEASE_S = float(os.environ.get("DLO_REPLAY_LEASE_S", "60"))


# A batch's messages are held in memory until their outcomes are recorded, and two batches are
# in flight (``dlq.plans.relay.IN_FLIGHT``): a claim stops at this many bytes of bodies, after
# at least one item, so that 5,000 large messages never sit in one worker's memory at once.
BATCH_BYTES = 16 * 1024 * 1024


def claim_plan(plan_id: int, owner: str) -> bool:
    now = timezone.now()
    lease = now + dt.timedelta(seconds=LEASE_S)
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner)
    claimable = Q(status__in=RUNNABLE) | Q(sending=True) | Q(in_flight=True)
    updated = (
        ReplayPlan.objects.filter(free, pk=plan_id)
        .annotate(sending=_sending(), in_flight=_in_flight())
        .filter(claimable)
        .update(lease_owner=owner, lease_until=lease)
    )
    return updated == 1


def _sending() -> Exists:
    """The plan (an outer reference) has SENDING items."""
    return Exists(ReplayItem.objects.filter(plan=OuterRef("pk"), status=ItemStatus.SENDING))


def _in_flight() -> Exists:
    """The plan (an outer reference) has first attempts below its cursor with no outcome."""
    return Exists(
        ReplayItem.objects.filter(
            plan=OuterRef("pk"),
            status=ItemStatus.PENDING,
            position__lt=OuterRef("claimed_through"),
            publishes=0,
        )
    )


def renew_lease(plan_id: int, owner: str) -> bool:
    lease = timezone.now() + dt.timedelta(seconds=LEASE_S)
    return bool(ReplayPlan.objects.filter(pk=plan_id, lease_owner=owner).update(lease_until=lease))


def release_lease(plan_id: int, owner: str) -> None:
    ReplayPlan.objects.filter(pk=plan_id, lease_owner=owner).update(
        lease_owner="", lease_until=None
    )


def orphaned_plans(limit: int = 50) -> list[int]:
    """Plans with work for a relay and no live lease: runnable ones, and stopped ones that
    still have items in doubt (SENDING, or in flight below the cursor)."""
    now = timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    return list(
        ReplayPlan.objects.filter(free)
        .filter(Q(status__in=RUNNABLE) | _sending() | _in_flight())
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )


def adopt_in_flight(plan: ReplayPlan) -> int:
    """Take over the first attempts a run that is gone left in flight (PENDING below the
    cursor, no publish recorded): they become SENDING with that attempt counted and its replay
    id kept, i.e. in doubt, and ``take_batch`` republishes them first. Only for the lease
    holder with nothing of its own in flight (at the start of a run, and when it is idle).
    Returns how many."""
    plan.refresh_from_db(fields=["claimed_through"])
    if not plan.claimed_through:
        return 0
    return ReplayItem.objects.filter(
        plan=plan, status=ItemStatus.PENDING, publishes=0, position__lt=plan.claimed_through
    ).update(
        status=ItemStatus.SENDING,
        attempts=F("attempts") + 1,
        publishes=1,
        replay_id=stored_or_first_replay_id(plan),
    )


def take_batch(
    plan: ReplayPlan,
    limit: int,
    only_in_doubt: bool,
    upto: int | None = None,
    busy: set[int] | frozenset[int] = frozenset(),
    doubt: bool = True,
) -> list[ReplayItem]:
    """Step 2: claim up to ``limit`` items (positions below ``upto`` when given) for an
    attempt, in this order: items in doubt (SENDING, from a run that is gone), retries that
    are due, then first attempts from the cursor. ``busy``: SENDING items of this run whose
    outcome is about to be recorded (not in doubt). ``doubt=False``: do not look for items in
    doubt (the caller knows there are none left: ``in_doubt`` marks the items taken from
    them, and once a look finds none, no new ones appear while the caller holds the lease)."""
    now = timezone.now()
    with transaction.atomic():
        if doubt:
            in_doubt = ReplayItem.objects.filter(plan=plan, status=ItemStatus.SENDING)
            if busy:
                in_doubt = in_doubt.exclude(pk__any=busy)
            items = _within_bytes(list(in_doubt.order_by("position")[:limit]))
            for item in items:
                item.__dict__["_in_doubt"] = True
            if items:
                _claim_items(plan, items)
                return items
        if only_in_doubt:
            return []
        # The plan row's lock first: a cancel in progress finishes before the items are read.
        through = (
            ReplayPlan.objects.select_for_update()
            .filter(pk=plan.pk)
            .values_list("claimed_through", flat=True)
            .get()
        )
        if connection.vendor == "postgresql":
            items = _claim_due(plan, limit, now, upto, through)
        else:
            due = Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
            if upto is not None:
                due &= Q(position__lt=upto)
            items = _within_bytes(list(
                ReplayItem.objects.filter(
                    due, plan=plan, status=ItemStatus.PENDING, publishes__gt=0,
                    position__lt=through,
                ).order_by("position")[:limit]
            ))  # fmt: skip
            if items:
                _claim_items(plan, items)
        return items or _claim_first(plan, limit, upto, through)


def _within_bytes(items: list[ReplayItem]) -> list[ReplayItem]:
    """The first of ``items`` (in plan order) whose entries' bodies fit in ``BATCH_BYTES``, at
    least one: for the claims that read items without their bodies (in doubt; retries on
    every database but PostgreSQL). One query of the bodies' lengths, not the bodies."""
    if len(items) <= 1:
        return items
    sizes = dict(
        DeadLetter.objects.filter(pk__any=[i.entry_id for i in items])
        .annotate(body_bytes=Length("body"))
        .values_list("pk", "body_bytes")
    )
    total = 0
    for n, item in enumerate(items):
        if n and total >= BATCH_BYTES:
            return items[:n]
        total += sizes.get(item.entry_id) or 0
    return items


def _bytes_before(body: str, order: str) -> str:
    """SQL: the bytes of the bodies before this row in plan order (a running sum), for the
    claims that read the bodies themselves; a row is taken while it is below ``BATCH_BYTES``.
    ``octet_length`` reads a stored body's size without reading the body."""
    length = "octet_length" if connection.vendor == "postgresql" else "length"  # SQLite: bytes
    size = f"COALESCE({length}({body}), 0)"
    return f"SUM({size}) OVER (ORDER BY {order} ROWS UNBOUNDED PRECEDING) - {size}"


def _claim_items(plan: ReplayPlan, items: list[ReplayItem]) -> None:
    """``take_batch`` for model instances (in-doubt items; every database but PostgreSQL)."""
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
    """One statement for due retries (PENDING items published before, all below the cursor):
    pick them in plan order, mark them SENDING with their attempt and replay id (kept when the
    last outcome was in doubt, else "<plan>:<item>:<attempt>"), and return them with the
    columns of their entries that the message needs. ``i.status`` is checked again on the row
    itself, so an item a concurrent cancel took is skipped, not revived."""
    q = connection.ops.quote_name
    item, entry = q(ReplayItem._meta.db_table), q(DeadLetter._meta.db_table)
    position = q("position")
    return f"""
        WITH ranked AS (
            SELECT i.id, i.publishes AS old_publishes, i.republished AS old_republished,
                   i.replay_id <> '' AS kept,
                   {_bytes_before("d.body", f"i.{position}")} AS bytes_before
            FROM {item} AS i JOIN {entry} AS d ON d.id = i.entry_id
            WHERE i.plan_id = %(plan)s AND i.status = 'pending' AND i.{position} < %(through)s
              AND i.publishes > 0
              AND (i.next_attempt_at IS NULL OR i.next_attempt_at <= %(now)s)
              {f"AND i.{position} < %(upto)s" if upto else ""}
            ORDER BY i.{position}
            LIMIT %(limit)s
        ),
        picked AS (SELECT * FROM ranked WHERE bytes_before < %(bytes)s)
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
                  d.body, {_sent_headers("d")}, d.properties, d.group_id
    """


def _sent_headers(alias: str) -> str:
    """The entry's stored headers as the claim returns them: on PostgreSQL without the
    brokers' death bookkeeping (``STORED_DEATH_HEADERS``), which the message drops anyway."""
    if connection.vendor != "postgresql":
        return f"{alias}.headers"
    names = ", ".join(f"'{name}'" for name in STORED_DEATH_HEADERS)  # constants, no quotes
    return f"{alias}.headers - ARRAY[{names}]::text[]"


def _claim_due(
    plan: ReplayPlan, limit: int, now: dt.datetime, upto: int | None, through: int
) -> list[ReplayItem]:
    """``take_batch`` on PostgreSQL for due retries: one ``UPDATE … RETURNING``
    (``_claim_sql``) and the plan's counters, inside the caller's transaction."""
    if not through:
        return []  # nothing was taken from the cursor yet, so nothing was published
    params: dict[str, Any] = {
        "plan": plan.pk,
        "through": through,
        "now": now,
        "upto": upto,
        "limit": limit,
        "bytes": BATCH_BYTES,
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


def _first_sql(upto: bool) -> str:
    """The next first attempts from the cursor, in plan order, with their entries' columns
    that the message needs (a read: the claim writes no item)."""
    q = connection.ops.quote_name
    item, entry = q(ReplayItem._meta.db_table), q(DeadLetter._meta.db_table)
    position = q("position")
    return f"""
        SELECT id, entry_id, {position}, replay_id, body, headers, properties, group_id
        FROM (
            SELECT i.id, i.entry_id, i.{position}, i.replay_id, d.body,
                   {_sent_headers("d")} AS headers, d.properties, d.group_id,
                   {_bytes_before("d.body", f"i.{position}")} AS bytes_before
            FROM {item} AS i JOIN {entry} AS d ON d.id = i.entry_id
            WHERE i.plan_id = %s AND i.status = 'pending' AND i.publishes = 0
              AND i.{position} >= %s {f"AND i.{position} < %s" if upto else ""}
            ORDER BY i.{position}
            LIMIT %s
        ) AS batch
        WHERE bytes_before < %s
        ORDER BY {position}
    """


def _claim_first(plan: ReplayPlan, limit: int, upto: int | None, through: int) -> list[ReplayItem]:
    """``take_batch`` for first attempts (inside its transaction, the plan row locked): read
    the next items from the cursor and move the cursor past them, with the plan's counters in
    the same UPDATE. Nothing is written to the items: their replay ids are the freeze's
    (``"<plan>:<item>:1"``; computed the same way for an item frozen before the freeze wrote
    them), and they stay PENDING until their outcome is recorded."""
    params: list[Any] = [plan.pk, through] + ([upto] if upto is not None else [])
    params += [limit, BATCH_BYTES]
    with connection.cursor() as c:
        c.execute(_first_sql(upto is not None), params)
        rows = c.fetchall()
    if not rows:
        return []
    ReplayPlan.objects.filter(pk=plan.pk).update(
        claimed_through=max(r[2] for r in rows) + 1,
        sent=F("sent") + len(rows),
        sent_entries=F("sent_entries") + len(rows),
    )
    alias = connection.alias  # once: each lookup goes through a thread-local
    prefix = f"{plan.pk}:"
    return [
        _item(plan, alias, pk, entry_id, position, 1, replay_id or f"{prefix}{pk}:1", 1, False,
              body, headers, properties, group_id, fresh=True, derived=not replay_id)
        for pk, entry_id, position, replay_id, body, headers, properties, group_id in rows
    ]  # fmt: skip


def first_attempt(item: ReplayItem) -> bool:
    """Taken from the cursor (``_claim_first``): the item row still says PENDING, no publish."""
    return "_first" in item.__dict__


def id_unstored(item: ReplayItem) -> bool:
    """A first attempt whose replay id the row does not hold yet (frozen before the freeze
    wrote them): its outcome stores it."""
    return "_id_derived" in item.__dict__


def _claimed_item(plan: ReplayPlan, row: tuple[Any, ...], alias: str) -> ReplayItem:
    """A ReplayItem for a claimed row without the cost of ``Model.__init__`` (thousands per
    batch), every concrete field set, plus the entry's columns the message needs."""
    return _item(plan, alias, *row[:7], *row[10:14])


def _item(
    plan: ReplayPlan, alias: str, pk: int, entry_id: int, position: int, attempts: int,
    replay_id: str, publishes: int, republished: bool, body: Any, headers: Any,
    properties: Any, group_id: int | None, fresh: bool = False, derived: bool = False,
) -> ReplayItem:  # fmt: skip
    """A claimed ReplayItem as it stands once this attempt is published (SENDING), every
    concrete field set, plus its entry's columns for the message (its JSON still as the
    query returned it: ``outgoing_batch`` decodes it on the publisher thread)."""
    item = ReplayItem.__new__(ReplayItem)
    item.__dict__.update(
        id=pk, plan_id=plan.pk, entry_id=entry_id, position=position,
        status=ItemStatus.SENDING, attempts=attempts, replay_id=replay_id,
        publishes=publishes, republished=republished, last_error="",
        next_attempt_at=None, finished_at=None, outcome_event_id=None, _state=ModelState(),
        _columns=(body, headers, properties), _group=group_id,
    )  # fmt: skip
    if fresh:
        item.__dict__["_first"] = True
    if derived:  # frozen before the freeze wrote replay ids: the outcome stores it
        item.__dict__["_id_derived"] = True
    item._state.adding, item._state.db = False, alias
    return item


def in_doubt(item: ReplayItem) -> bool:
    """Taken by ``take_batch`` from the items a crashed run left in doubt."""
    return "_in_doubt" in item.__dict__


def group_of(item: ReplayItem) -> tuple[bool, int | None]:
    """(known, group id) of a claimed item's entry: known when the claim returned it."""
    if "_group" in item.__dict__:
        return True, item.__dict__["_group"]
    return False, None


def _count_sends(plan: ReplayPlan, sent: int, first: int, doubled: int) -> None:
    """Counters that tell the truth (inside the claim's transaction): every publish, distinct
    entries published (``first``), and distinct entries that may have gone out twice."""
    ReplayPlan.objects.filter(pk=plan.pk).update(
        sent=F("sent") + sent,
        sent_entries=F("sent_entries") + first,
        maybe_twice=F("maybe_twice") + doubled,
    )
