"""A replay or discard plan's states as the relay moves them, each change audited: running,
waiting for its broker and back, paused, finished, and the canary's verdict."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from audit.actions import Actor, record
from audit.models import Outcome
from audit.sealer import request_checkpoint
from dlq.models import DeadLetter, ItemStatus, PlanStatus, ReplayItem, ReplayPlan
from dlq.replay_models import RUNNABLE

log = logging.getLogger(__name__)


CANARY_INGEST_BATCHES = 5


def _audit(
    plan: ReplayPlan,
    action: str,
    actor: Actor,
    after: dict[str, Any],
    reason: str = "",
    *,
    failed: bool = False,
) -> None:
    """One audited change of ``plan``'s state, inside the caller's transaction."""
    record(action, actor=actor, target=plan, channel_slug=plan.channel.slug, reason=reason[:1000],
           after=after, outcome=Outcome.FAILED if failed else Outcome.SUCCESS)  # fmt: skip


def start_plan(plan: ReplayPlan) -> None:
    if plan.status == PlanStatus.QUEUED:
        ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.QUEUED).update(
            status=PlanStatus.RUNNING, started_at=Coalesce(F("started_at"), timezone.now())
        )
        plan.refresh_from_db()


def enter_waiting(plan: ReplayPlan, reason: str, actor: Actor) -> bool:
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
            after = {"status": PlanStatus.WAITING, "outage": plan.outages}
            _audit(plan, f"dlq.{plan.kind}.broker_unreachable", actor, after, note, failed=True)
    return plan.status == PlanStatus.WAITING


def leave_waiting(plan: ReplayPlan, actor: Actor) -> bool:
    """Step 3 of ``_await_broker``."""
    now = timezone.now()
    with transaction.atomic():
        changed = ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.WAITING).update(
            status=PlanStatus.RUNNING, status_note="", waiting_since=None
        )
        if changed:
            waited = (now - plan.waiting_since).total_seconds() if plan.waiting_since else None
            log.warning("replay plan %s: the broker answers again, resuming", plan.pk)
            after = {"status": PlanStatus.RUNNING, "waited_s": waited, "outage": plan.outages}
            _audit(plan, f"dlq.{plan.kind}.broker_back", actor, after)
        plan.refresh_from_db()
    return bool(changed)


def pause_unconfigured(plan: ReplayPlan, problem: str, actor: Actor) -> None:
    """The relay cannot even connect (e.g. the broker's URL variable is unset on this worker):
    pause the plan with the reason on it instead of failing the task again and again, so the
    page says what to fix and a person resumes it afterwards."""
    pause(plan, f"cannot connect to the broker: {problem}", actor)


def pause(plan: ReplayPlan, note: str, actor: Actor) -> None:
    """Pause a runnable plan with ``note`` on it, audited (outcome "failed")."""
    with transaction.atomic():
        paused = ReplayPlan.objects.filter(pk=plan.pk, status__in=RUNNABLE).update(
            status=PlanStatus.PAUSED, status_note=note[:1000]
        )
        if paused:
            _audit(plan, f"dlq.{plan.kind}.pause", actor, {"status": PlanStatus.PAUSED}, note,
                   failed=True)  # fmt: skip


def finish(plan: ReplayPlan, actor: Actor) -> None:
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
            _audit(
                plan,
                f"dlq.{plan.kind}.finished",
                actor,
                {
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
                failed=bool(plan.failed),
            )
            request_checkpoint()  # a burst ended: anchor it now, not at the next minute


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
    from dlq.actions import do_ingest_channel

    if plan.channel.has_dlq:
        do_ingest_channel(plan.channel_id, max_batches=CANARY_INGEST_BATCHES)
    recurred = canary_recurrences(plan)
    relay = Actor.system("replay-relay")
    with transaction.atomic():
        if recurred:
            changed = ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.RUNNING).update(
                status=PlanStatus.HALTED,
                status_note=f"canary: {recurred} message(s) dead-lettered again",
            )
            if changed:
                halted = {"recurred": recurred, "canary_size": plan.canary_size}
                _audit(plan, "dlq.replay.halted", relay, halted, "canary: the failure recurred",
                       failed=True)  # fmt: skip
            return False
        ReplayPlan.objects.filter(pk=plan.pk).update(canary_passed_at=timezone.now())
        after = {"canary_size": plan.canary_size, "wait_s": plan.canary_wait_s}
        _audit(plan, "dlq.replay.canary_passed", relay, after)
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
