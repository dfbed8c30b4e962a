"""A discard plan's work: its entries become DISCARDED in bounded batches, one audit record per
batch (``dlq.discard.outcomes``, like a replay batch's: every entry of the batch, discarded or
skipped, with the state it had); entries that changed state since the plan froze them are
skipped. The plan's own state changes go through ``dlq.plans.plan_state``."""

from __future__ import annotations

import time
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from audit.actions import Actor, record
from dlq.models import (
    EntryState,
    ItemStatus,
    PlanStatus,
    ReplayItem,
    ReplayPlan,
    Status,
    refresh_open_counts,
    set_status,
)
from dlq.models.plans import DISCARD_FIELDS, DISCARD_OUTCOME_ACTION
from dlq.plans import plan_state

DISCARD_INLINE = 1_000  # larger discards run in the worker, in batches
DISCARD_BATCH = 1_000


def discard_items(plan: ReplayPlan, items: list[ReplayItem]) -> int:
    """Discard these items' entries (state change, one audit record for the batch). Entries
    that changed state since the plan froze them (being replayed, already discarded) are
    skipped, and the record says so with the state they had."""

    if not items:
        return 0
    now = timezone.now()
    ids = [i.entry_id for i in items]
    states = dict(EntryState.objects.filter(pk__any=ids).values_list("pk", "status"))
    before = {
        pk: state
        for pk, state in states.items()
        if state not in (Status.DISCARDED, Status.REPLAYING)
    }
    set_status(list(before), Status.DISCARDED)
    refresh_open_counts(list(before))
    done = [i for i in items if i.entry_id in before]
    skipped = [i for i in items if i.entry_id not in before]
    rows = [(i.pk, [i.entry_id, i.pk, "discarded", before[i.entry_id]]) for i in done]
    rows += [(i.pk, [i.entry_id, i.pk, "skipped", states.get(i.entry_id, "")]) for i in skipped]
    messages = [row for _, row in sorted(rows, key=lambda r: r[0])]  # item order
    event = record(
        DISCARD_OUTCOME_ACTION,
        actor=Actor(plan.requested_by_id, plan.requested_by_username),
        target_type=ReplayPlan._meta.label_lower,
        target_id=plan.pk,
        target_repr=str(plan),
        channel_slug=plan.channel.slug,
        reason=plan.reason,
        after={
            "plan": plan.pk,
            "approved_by": plan.approved_by_username or None,
            "discarded": len(done),
            "skipped": len(skipped),
            "fields": list(DISCARD_FIELDS),
            "messages": messages,
        },
    )
    ReplayItem.objects.filter(pk__in=[i.pk for i in done]).update(
        status=ItemStatus.DISCARDED, finished_at=now, outcome_event=event.pk
    )
    ReplayItem.objects.filter(pk__in=[i.pk for i in skipped]).update(
        status=ItemStatus.SKIPPED, finished_at=now, outcome_event=event.pk
    )
    ReplayPlan.objects.filter(pk=plan.pk).update(
        discarded=F("discarded") + len(done), skipped=F("skipped") + len(skipped)
    )
    return len(done)


def discard_now(plan: ReplayPlan) -> None:
    """A small queued discard, in the caller's transaction: started, every item, finished."""
    plan_state.start_plan(plan)
    discard_items(plan, list(plan.items.filter(status=ItemStatus.PENDING)))
    plan_state.finish_discard(plan)


def run_discard_plan(plan: ReplayPlan, owner: str, result: Any, max_seconds: float) -> Any:
    """The relay's part for an approved discard plan: bounded batches, one transaction each."""

    deadline = time.monotonic() + max_seconds
    plan_state.start_plan(plan)
    while time.monotonic() < deadline:
        with transaction.atomic():
            plan.refresh_from_db()
            if plan.status != PlanStatus.RUNNING:
                break
            items = list(
                plan.items.filter(status=ItemStatus.PENDING).order_by("position")[:DISCARD_BATCH]
            )
            if not items:
                plan_state.finish_discard(plan)
                break
            discard_items(plan, items)
    else:
        result.more = True
    plan.refresh_from_db()
    result.status = plan.status
    return result
