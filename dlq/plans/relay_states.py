"""The relay's decisions about a plan's state: when the next item is due, and the canary's
verdict (halt, or pass and ramp up). The state changes themselves, and their audit events, are
``dlq.plans.plan_state``'s."""

from __future__ import annotations

import datetime as dt
import logging
import time

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.actions import Actor, record
from dlq.capture.ingest import do_ingest_channel
from dlq.models import DeadLetter, ItemStatus, ReplayItem, ReplayPlan
from dlq.plans import plan_state

log = logging.getLogger(__name__)


CANARY_INGEST_BATCHES = 5


def pause_unconfigured(plan: ReplayPlan, problem: str, actor: Actor) -> None:
    """The relay cannot even connect (e.g. the broker's URL variable is unset on this worker):
    pause the plan with the reason on it instead of failing the task again and again, so the
    page says what to fix and a person resumes it afterwards."""
    plan_state.pause(plan, f"cannot connect to the broker: {problem}", actor)


def next_due_in(plan: ReplayPlan, upto: int | None = None) -> float | None:
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


def canary_check(plan: ReplayPlan, deadline: float) -> bool:
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
    if plan.channel.has_dlq:
        do_ingest_channel(plan.channel_id, max_batches=CANARY_INGEST_BATCHES)
    recurred = canary_recurrences(plan)
    relay = Actor.system("replay-relay")
    with transaction.atomic():
        if recurred:
            plan_state.halt(plan, recurred, relay)
            return False
        ReplayPlan.objects.filter(pk=plan.pk).update(canary_passed_at=timezone.now())
        after = {"canary_size": plan.canary_size, "wait_s": plan.canary_wait_s}
        record("dlq.replay.canary_passed", actor=relay, target=plan,
               channel_slug=plan.channel.slug, after=after)  # fmt: skip
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
