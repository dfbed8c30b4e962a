"""Freezing a plan: the exact entries of a confirmed selection become the plan's items.

``dlq.plans.actions.do_create_plan`` saves the plan in FREEZING with what the person confirmed (the
selection, the number of entries it then had, and an id bound: the largest id it then
matched). A selection of up to ``DLO_FREEZE_INLINE`` entries is frozen at once, in the
request's transaction; a larger one by a background job (``freeze_plan_task``, or the
``dlq-freeze-plans`` tick of the in-process scheduler under ``make run``):

1. Claim the plan's lease (one freezer at a time; an expired lease is taken over).
2. Per chunk, one short transaction: lock the next ``DLO_FREEZE_CHUNK`` eligible entries of
   the selection after the cursor, in replay order (``dead_lettered_at``, ``id``: a keyset
   walk, never all ids in memory), with ``id`` at most the bound (entries arriving later do
   not join); drop those another plan took meanwhile; insert their items (positions
   continue), reserve them (REPLAYING) and write the chunk's request audit event (the plan
   as its target; the chunk's positions, ends and ids' digest); last, move the plan's cursor
   and count — conditional on the plan still FREEZING under this lease, so a cancel or a
   second freezer makes the chunk roll back whole.
3. When no entry is left: the plan's total becomes what was frozen, a ``frozen`` audit event
   carries the ids' digest, and the plan awaits its approval or goes to the relay.

One request event per chunk, not per entry: an event per entry cost as much as the entry's
reservation (recording ~25 µs and sealing ~45 µs each), so a 1M-entry freeze spent most of
its time, and the sealer minutes after it, on them. What they said is kept: who asked, why,
for which plan, and exactly which entries — the chunk events' digests over the items in plan
order (``chunk_mismatches`` checks them against the items); every entry still gets its own
outcome event from the relay, and its page shows the request of the chunk that holds it.

A crash loses at most the chunk in flight: the next run resumes from the committed cursor
(and ``(plan, entry)`` is unique). No chunk holds a lock another writer waits for: audit
events are inserted unsealed (no audit head lock, ``audit.sealer``), a failure group's open
count is recounted only when a resolved entry is reopened, and the plan row is locked only
from the chunk's last statement to its commit.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from audit.actions import Actor, record
from audit.models import AuditEvent
from dlq.models import (
    RESOLVED,
    DeadLetter,
    EntryState,
    PlanKind,
    PlanStatus,
    ReplayItem,
    ReplayPlan,
    Status,
    refresh_open_counts,
    set_status,
)
from dlq.models.plans import FINISHED, HOLDING_ITEMS, first_replay_id
from dlq.plans import plan_jobs, plan_state
from dlq.plans.preview import PLANNABLE, Selection, ids_digest, plannable_entries
from dlq.triage.filters import EntryFilter

LEASE_S = 60.0  # renewed by every chunk; a crashed freezer's plan is taken over after this
SLICE_S = 300.0  # one background run; the task re-enqueues itself for the rest
TICK_S = 5.0  # one run on the in-process scheduler's thread (``make run``)


class Interrupted(Exception):
    """The plan left FREEZING (cancelled) or another freezer took the lease: the chunk in
    flight rolls back."""


@dataclasses.dataclass
class FreezeResult:
    plan_id: int
    claimed: bool = True
    chunks: int = 0
    frozen: int = 0
    more: bool = False
    status: str = ""


@dataclasses.dataclass(frozen=True)
class FrozenIds:
    """What the plan froze, for its audit event: count, digest and ends, in plan order."""

    count: int
    digest: str
    first_id: int | None
    last_id: int | None

    def as_json(self) -> dict[str, Any]:
        return {
            "entries": self.count,
            "ids_sha256": self.digest,
            "first_id": self.first_id,
            "last_id": self.last_id,
        }


# -- the selection as confirmed --------------------------------------------------------------


def snapshot(kind: str, selection: Selection, entries: QuerySet[DeadLetter], actor: Actor) -> dict:
    """What the background freeze needs to freeze exactly what was confirmed: every id of an
    explicit selection, the filter, and the id bound (the largest eligible id now)."""
    bound = (
        plannable_entries(kind, selection.queryset(entries))
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    return {
        "ids": list(selection.ids),
        "filter": selection.filter.params(),
        "upto_id": bound,
        "ip": actor.ip,
    }


def _selection(plan: ReplayPlan) -> Selection:
    spec = plan.freeze_spec
    return Selection(EntryFilter.from_params(spec.get("filter") or {}), list(spec.get("ids") or []))


def _requester(plan: ReplayPlan) -> Actor:
    return Actor(plan.requested_by_id, plan.requested_by_username, plan.freeze_spec.get("ip"))


# -- one chunk ---------------------------------------------------------------------------------


def _next_rows(
    plan: ReplayPlan, selection: Selection, entries: QuerySet[DeadLetter], size: int
) -> list[tuple[int, dt.datetime, str | None]]:
    """The next ``size`` plannable entries after the cursor, in replay order, with their status
    read under a lock on their state rows (None: an entry whose state changed meanwhile, no
    longer plannable). Whether another plan holds them is ``_held``'s test: as an anti-join
    here it would read every item of the open plans (this one's too, up to the whole
    selection) for every chunk."""
    chosen = plannable_entries(plan.kind, selection.queryset(entries)).filter(
        pk__lte=plan.freeze_spec.get("upto_id") or 0
    )
    if plan.freeze_cursor_id is not None:
        at, last = plan.freeze_cursor_at, plan.freeze_cursor_id
        # The first condition alone bounds the index range; the second finishes the keyset.
        chosen = chosen.filter(dead_lettered_at__gte=at).filter(
            Q(dead_lettered_at__gt=at) | Q(pk__gt=last)
        )
    rows = list(
        chosen.order_by("dead_lettered_at", "id").values_list("id", "dead_lettered_at")[:size]
    )
    if not rows:
        return []
    # The lock is on what a plan changes, the narrow state rows, taken in id order (as every
    # writer of many states takes them) and re-checked on the row: the wide rows stay unlocked.
    states = EntryState.objects.filter(
        pk__any=[r[0] for r in rows], status__in=PLANNABLE[PlanKind(plan.kind)]
    ).order_by("pk")
    if connection.vendor == "postgresql":
        states = states.select_for_update()
    status = dict(states.values_list("pk", "status"))
    return [(pk, at, status.get(pk)) for pk, at in rows]


def _held(plan: ReplayPlan, ids: list[int]) -> set[int]:
    """Entries of ``ids`` another unfinished plan holds. A fresh statement after the rows were
    locked: a plan committed while this one waited for those locks is seen here, though the
    locking query's own snapshot predates it. The items are found by entry and their plans
    checked here: joined with the plans in SQL, the planner walked every open item of every
    open plan (this one's too) by the status index, so each chunk read all the items frozen
    before it (a 1M-entry freeze spent 8.8 s there)."""
    open_plans = set(
        ReplayPlan.objects.exclude(status__in=FINISHED)
        .exclude(pk=plan.pk)
        .values_list("pk", flat=True)
    )
    if not open_plans:
        return set()
    return {entry for entry, holder in _holding_items(ids) if holder in open_plans}


def _holding_items(ids: list[int]) -> list[tuple[int, int]]:
    """(entry, plan) of the PENDING or SENDING items of these entries, found by entry: on
    PostgreSQL one index probe per id (``OFFSET 0`` keeps the planner from flattening the
    probe into a walk of the status index, which it picks when the items' statistics predate
    the chunks just frozen)."""
    if connection.vendor != "postgresql":
        rows = ReplayItem.objects.filter(entry_id__any=ids, status__in=HOLDING_ITEMS)
        return list(rows.values_list("entry_id", "plan_id"))
    table = connection.ops.quote_name(ReplayItem._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.entry_id, i.plan_id FROM unnest(%s::bigint[]) AS t(id) CROSS JOIN LATERAL "
            f"(SELECT entry_id, plan_id, status FROM {table} WHERE entry_id = t.id OFFSET 0) AS i "
            "WHERE i.status = ANY(%s)",
            [ids, list(HOLDING_ITEMS)],
        )
        return [(int(entry), int(plan)) for entry, plan in cursor.fetchall()]


def _insert_items(plan: ReplayPlan, ids: list[int], start: int) -> None:
    """One PENDING item per id, positions ``start``…, each with the replay id of its first
    attempt (``first_replay_id``): the relay's cursor claim writes nothing per item."""
    table = connection.ops.quote_name(ReplayItem._meta.db_table)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (id, plan_id, entry_id, position, status, attempts, "
                "replay_id, publishes, republished, last_error) "
                "SELECT n.id, %s, n.e, %s + n.o::integer - 1, %s, 0, %s || n.id || ':1', 0, "
                "false, '' FROM (SELECT nextval(%s::regclass) AS id, t.e, "
                "t.o FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(e, o)) AS n",
                [plan.pk, start, "pending", f"{plan.pk}:", _item_sequence(), ids],
            )
        return
    ReplayItem.objects.bulk_create(
        [ReplayItem(plan=plan, entry_id=pk, position=start + n) for n, pk in enumerate(ids)],
        batch_size=500,
    )
    ReplayItem.objects.filter(plan=plan, position__gte=start, replay_id="").update(
        replay_id=first_replay_id(plan)
    )


@functools.cache
def _item_sequence() -> str:
    """The items' id sequence (asked once per process, not per inserted row)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_serial_sequence(%s, 'id')",
            [connection.ops.quote_name(ReplayItem._meta.db_table)],
        )
        return str(cursor.fetchone()[0])


def chunk_request(plan: ReplayPlan, ids: list[int], start: int) -> dict[str, Any]:
    """What a chunk's request event says of the chunk: its positions in the plan, its ends
    and the digest of its entry ids in plan order (``dlq.plans.preview.ids_digest``)."""
    return {
        "plan": plan.pk,
        "target": plan.target_display,
        "entries": len(ids),
        "first_position": start,
        "last_position": start + len(ids) - 1,
        "first_id": ids[0],
        "last_id": ids[-1],
        "ids_sha256": ids_digest(ids),
    }


def _audit_request(plan: ReplayPlan, ids: list[int], start: int, actor: Actor) -> None:
    """The chunk's request event (see the module docstring)."""
    _audit(plan, "request", actor, chunk_request(plan, ids, start))


def _audit(plan: ReplayPlan, verb: str, actor: Actor, after: dict[str, Any]) -> None:
    """A ``dlq.<kind>.<verb>`` event of the plan, with the requester's reason."""
    record(
        f"dlq.{plan.kind}.{verb}",
        actor=actor,
        target=plan,
        channel_slug=plan.channel.slug,
        reason=plan.reason,
        after=after,
    )


def _plan_events(plan: ReplayPlan, *verbs: str) -> QuerySet[AuditEvent]:
    """The plan's own ``dlq.<kind>.<verb>`` audit events."""
    return AuditEvent.objects.filter(
        target_type=ReplayPlan._meta.label_lower,
        target_id=str(plan.pk),
        action__in=[f"dlq.{plan.kind}.{verb}" for verb in verbs],
    )


def chunk_mismatches(plan: ReplayPlan) -> list[str] | None:
    """Where the plan's items disagree with its chunks' request events: a missing, extra or
    moved item, or positions no event covers (empty when they agree). None when the plan has
    no chunk events to compare with (a discard plan, or one frozen before they existed)."""
    chunks = sorted(
        (after["first_position"], after["last_position"], after["ids_sha256"])
        for after in _plan_events(plan, "request").values_list("after", flat=True)
        if after is not None and "ids_sha256" in after
    )
    if not chunks:
        return None
    problems, covered = [], 0
    for first, last, digest in chunks:
        ids = plan.items.filter(position__gte=first, position__lte=last).order_by("position")
        if first != covered or ids_digest(ids.values_list("entry_id", flat=True)) != digest:
            problems.append(f"positions {first}-{last}: the items differ from the request")
        covered = last + 1
    if plan.items.filter(position__gte=covered).exists():
        problems.append(f"the items from position {covered} on are in no request")
    return problems


def _advance(
    plan: ReplayPlan, owner: str | None, count: int, at: dt.datetime, last_id: int
) -> None:
    """The chunk's last statement: move the cursor and the count, or raise ``Interrupted``."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "frozen": F("frozen") + count,
        "freeze_cursor_at": at,
        "freeze_cursor_id": last_id,
    }
    mine = Q(pk=plan.pk, status=PlanStatus.FREEZING, frozen=plan.frozen)
    if owner is not None:
        mine &= Q(lease_owner=owner)
        changes["lease_until"] = now + dt.timedelta(seconds=LEASE_S)
    if ReplayPlan.objects.filter(mine).update(**changes) != 1:
        raise Interrupted(f"plan {plan.pk} is no longer freezing under this lease")
    plan.frozen += count
    plan.freeze_cursor_at, plan.freeze_cursor_id = at, last_id


def freeze_chunk(
    plan: ReplayPlan,
    selection: Selection,
    entries: QuerySet[DeadLetter],
    *,
    actor: Actor,
    size: int,
    owner: str | None,
) -> int | None:
    """Step 2, inside the caller's transaction: freeze the next chunk. Returns how many
    entries it froze (0 when others held them all), or None when none is left."""
    rows = _next_rows(plan, selection, entries, size)
    if not rows:
        return None
    last_id, last_at = rows[-1][0], rows[-1][1]
    rows = [r for r in rows if r[2] is not None]
    held = _held(plan, [r[0] for r in rows])
    rows = [r for r in rows if r[0] not in held]
    ids = [r[0] for r in rows]
    if ids:
        _insert_items(plan, ids, plan.frozen)
        if plan.kind == PlanKind.REPLAY:
            set_status(ids, Status.REPLAYING)
            _audit_request(plan, ids, plan.frozen, actor)
    _advance(plan, owner, len(ids), last_at, last_id)
    reopened = [pk for pk, _at, status in rows if status in RESOLVED]
    if plan.kind == PlanKind.REPLAY and reopened:
        # A resolved entry replayed again is open: recount its groups, last, so the group
        # rows (ingest updates them too) stay locked only until the commit that follows.
        refresh_open_counts(reopened)
    return len(ids)


# -- the whole freeze --------------------------------------------------------------------------


def frozen_ids(plan: ReplayPlan) -> FrozenIds:
    """Digest and ends of the plan's entry ids in plan order (streamed, constant memory)."""
    seen: list[int] = []  # [count, first, last]

    def ids() -> Iterator[int]:
        rows = ReplayItem.objects.filter(plan=plan).order_by("position")
        for pk in rows.values_list("entry_id", flat=True).iterator(chunk_size=10_000):
            seen[:] = [seen[0] + 1, seen[1], pk] if seen else [1, pk, pk]
            yield pk

    digest = ids_digest(ids())
    if not seen:
        return FrozenIds(0, digest, None, None)
    return FrozenIds(seen[0], digest, seen[1], seen[2])


def altered_items(plan: ReplayPlan) -> str:
    """Why the plan's items are not what its audit trail committed to (the ids' digest of its
    ``frozen`` event, or of its ``plan`` event when it was frozen in the request), or "". The
    relay checks this before a plan's first batch: what it sends is what was confirmed. The
    reason names the first chunk that differs when the plan has chunk events."""
    audited = dict(_plan_events(plan, "frozen", "plan").values_list("action", "after"))
    digest = (audited.get(f"dlq.{plan.kind}.frozen") or {}).get("ids_sha256") or (
        audited.get(f"dlq.{plan.kind}.plan") or {}
    ).get("ids_sha256")
    redo = "nothing was sent; cancel the plan and plan the replay again"
    if not digest:
        return f"the plan's items cannot be checked (its audit trail has no digest of them): {redo}"
    frozen = frozen_ids(plan)
    if frozen.digest == digest:
        return ""
    where = (chunk_mismatches(plan) or [""])[0]
    return (
        f"the plan's {frozen.count:,} items differ from the entries its audit trail recorded "
        f"when it was frozen{f' ({where})' if where else ''}: {redo}"
    )


def freeze_now(
    plan: ReplayPlan, selection: Selection, entries: QuerySet[DeadLetter], actor: Actor
) -> FrozenIds:
    """A small selection, in the caller's (the request's) transaction: every chunk, then the
    state change. The caller audits the plan with the returned digest."""
    size = max(settings.DLO_FREEZE_CHUNK, 1)
    while freeze_chunk(plan, selection, entries, actor=actor, size=size, owner=None) is not None:
        pass
    frozen = frozen_ids(plan)
    if frozen.count:
        plan_state.close_freeze(plan, None)
    return frozen


def _finish(plan: ReplayPlan, owner: str, actor: Actor) -> None:
    """Step 3 in the background: close the plan, audit what was frozen, start it."""
    frozen = frozen_ids(plan)
    if not plan_state.finish_freeze(plan, owner, actor, frozen.as_json()):
        raise Interrupted(f"plan {plan.pk} is no longer freezing under this lease")
    if plan.status == PlanStatus.QUEUED:
        plan_jobs.launch(plan)


def owner_name() -> str:
    return f"freeze:{socket.gethostname()}:{os.getpid()}"


def _claim(plan_id: int, owner: str) -> bool:
    now = timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner)
    lease = now + dt.timedelta(seconds=LEASE_S)
    claimed = ReplayPlan.objects.filter(free, pk=plan_id, status=PlanStatus.FREEZING).update(
        lease_owner=owner, lease_until=lease
    )
    return claimed == 1


def _release(plan_id: int, owner: str) -> None:
    ReplayPlan.objects.filter(pk=plan_id, lease_owner=owner).update(
        lease_owner="", lease_until=None
    )


def run_freeze(
    plan_id: int,
    *,
    max_seconds: float = SLICE_S,
    max_chunks: int | None = None,
    owner: str | None = None,
) -> FreezeResult:
    """Steps 1-3 for at most ``max_seconds`` or ``max_chunks`` (``more``: work is left)."""
    owner = owner or owner_name()
    result = FreezeResult(plan_id)
    if not _claim(plan_id, owner):
        result.claimed = False
        return result
    deadline = time.monotonic() + max_seconds
    try:
        plan = ReplayPlan.objects.select_related("channel").get(pk=plan_id)
        selection, actor = _selection(plan), _requester(plan)
        size = max(settings.DLO_FREEZE_CHUNK, 1)
        while True:
            if time.monotonic() >= deadline or result.chunks == max_chunks:
                result.more = True
                break
            with transaction.atomic():
                count = freeze_chunk(
                    plan, selection, DeadLetter.objects.all(), actor=actor, size=size, owner=owner
                )
                if count is None:
                    _finish(plan, owner, actor)
                    break
            result.chunks += 1
            result.frozen += count
    except Interrupted:
        pass
    finally:
        _release(plan_id, owner)
    result.status = ReplayPlan.objects.filter(pk=plan_id).values_list("status", flat=True)[0]
    return result


def orphaned_freezes(*, grace_s: float, limit: int = 50) -> list[int]:
    """FREEZING plans no freezer holds: never claimed for ``grace_s`` (their task was lost),
    or whose lease expired (their freezer died)."""
    now = timezone.now()
    unclaimed = Q(lease_until__isnull=True, created_at__lte=now - dt.timedelta(seconds=grace_s))
    plans = ReplayPlan.objects.filter(unclaimed | Q(lease_until__lt=now))
    ids = plans.filter(status=PlanStatus.FREEZING).order_by("id").values_list("id", flat=True)
    return list(ids[:limit])


def freeze_to_end(plan_id: int, *, wait_s: float = 0.5) -> ReplayPlan:
    """Freeze in this process until the plan is frozen (or cancelled), for the commands that
    act in the foreground; when another freezer holds the plan, wait for it."""
    while True:
        result = run_freeze(plan_id, max_seconds=SLICE_S)
        if result.status != PlanStatus.FREEZING:
            return ReplayPlan.objects.get(pk=plan_id)
        if not result.claimed:
            time.sleep(wait_s)
