"""Which relay works on a plan and which items it sends next: the plan's lease, and taking a
batch of items (step 2 of ``dlq.plans.relay``): marked SENDING with their attempt and replay id,
committed before anything is published."""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any

from django.db import connection, transaction
from django.db.models import CharField, Exists, F, OuterRef, Q, Value
from django.db.models.base import ModelState
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from dlq.models import DeadLetter, ItemStatus, ReplayItem, ReplayPlan
from dlq.models.plans import RUNNABLE

# A relay renews its lease every batch; a crashed one is taken over once it expires. The
# environment override is for the fault tests, which restart a killed relay at once.
LEASE_S = float(os.environ.get("DLO_REPLAY_LEASE_S", "60"))


def claim_plan(plan_id: int, owner: str) -> bool:
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


def renew_lease(plan_id: int, owner: str) -> bool:
    lease = timezone.now() + dt.timedelta(seconds=LEASE_S)
    return bool(ReplayPlan.objects.filter(pk=plan_id, lease_owner=owner).update(lease_until=lease))


def release_lease(plan_id: int, owner: str) -> None:
    ReplayPlan.objects.filter(pk=plan_id, lease_owner=owner).update(
        lease_owner="", lease_until=None
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


def take_batch(
    plan: ReplayPlan,
    limit: int,
    only_in_doubt: bool,
    upto: int | None = None,
    busy: set[int] | frozenset[int] = frozenset(),
    doubt: bool = True,
) -> list[ReplayItem]:
    """Step 2: claim up to ``limit`` items (positions below ``upto`` when given) for an
    attempt and persist their replay ids. ``busy``: SENDING items of this run whose outcome
    is about to be recorded (not in doubt). ``doubt=False``: do not look for items a crashed
    run left in doubt (the caller knows there are none left: ``in_doubt`` marks the items
    taken from them, and once a look finds none, no new ones appear while the caller holds the
    lease)."""
    now = timezone.now()
    with transaction.atomic():
        items: list[ReplayItem] = []
        if doubt:
            # In-doubt items of a crashed run first: they were (maybe) published already.
            in_doubt = ReplayItem.objects.filter(plan=plan, status=ItemStatus.SENDING)
            if busy:
                in_doubt = in_doubt.exclude(pk__any=busy)
            items = list(in_doubt.order_by("position")[:limit])
            for item in items:
                item.__dict__["_in_doubt"] = True
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
                  d.body, d.headers, d.properties, d.group_id
    """


def _claim_due(
    plan: ReplayPlan, limit: int, now: dt.datetime, upto: int | None
) -> list[ReplayItem]:
    """``take_batch`` on PostgreSQL for due PENDING items: one ``UPDATE … RETURNING``
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


def _claimed_item(plan: ReplayPlan, row: tuple[Any, ...], alias: str) -> ReplayItem:
    """A ReplayItem for a claimed row without the cost of ``Model.__init__`` (thousands per
    batch), every concrete field set, plus the entry's columns the message needs."""
    item = ReplayItem.__new__(ReplayItem)
    pk, entry_id, position, attempts, replay_id, publishes, republished = row[:7]
    body, headers, properties, group_id = row[10:14]
    item.__dict__.update(
        id=pk, plan_id=plan.pk, entry_id=entry_id, position=position,
        status=ItemStatus.SENDING, attempts=attempts, replay_id=replay_id,
        publishes=publishes, republished=republished, last_error="",
        next_attempt_at=None, finished_at=None, _state=ModelState(),
        _columns=(body, _json(headers), _json(properties)), _group=group_id,
    )  # fmt: skip
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
