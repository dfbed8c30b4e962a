"""The one owner of a replay or discard plan's status: every transition, and its audit event.

No other module writes ``ReplayPlan.status`` (``tests/dlq/plans/test_plan_state.py`` checks the
source): the plan is created FREEZING (``dlq.plans.actions``), and from there

- ``close_freeze`` / ``finish_freeze``: FREEZING → AWAITING_APPROVAL, QUEUED, or CANCELLED when
  nothing could be frozen;
- ``approve``: AWAITING_APPROVAL → QUEUED (a second person);
- ``start_plan``: QUEUED → RUNNING (the relay, or a small discard done at once);
- ``enter_waiting`` / ``leave_waiting`` (``note_waiting`` on the way): RUNNING ⇄ WAITING while
  the broker does not answer;
- ``pause`` (the relay, with the reason) and ``pause_by`` (a person): runnable → PAUSED;
- ``resume``: PAUSED or HALTED → QUEUED;
- ``halt``: RUNNING → HALTED (the canary's failure came back);
- ``finish`` (a replay) and ``finish_discard``: RUNNING → DONE or DONE_WITH_FAILURES;
- ``cancel``: any unfinished state → CANCELLED.

Each writes its audit event through ``_audit``, in the caller's transaction. This module sits
below everything that moves plans (actions, freeze, the relay, discards): it imports only the
models and ``audit``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from audit.actions import Actor, record
from audit.models import Outcome
from audit.sealer import request_checkpoint
from dlq.models import PlanStatus, ReplayPlan
from dlq.models.plans import RUNNABLE

log = logging.getLogger(__name__)


def _audit(
    plan: ReplayPlan,
    action: str,
    actor: Actor,
    after: dict[str, Any],
    reason: str = "",
    *,
    failed: bool = False,
) -> None:
    """The audit event of one change of ``plan``'s state (``dlq.<kind>.<verb>`` unless
    ``action`` is already a full name), inside the caller's transaction."""
    name = action if action.startswith("dlq.") else f"dlq.{plan.kind}.{action}"
    record(name, actor=actor, target=plan, channel_slug=plan.channel.slug, reason=reason,
           after=after, outcome=Outcome.FAILED if failed else Outcome.SUCCESS)  # fmt: skip


def _person(plan: ReplayPlan, verb: str, actor: Actor, reason: str, **after: Any) -> None:
    """A person's action on the plan: its new status first in ``after``."""
    _audit(plan, verb, actor, {"status": plan.status, **after}, reason)


# -- freezing ------------------------------------------------------------------------------------


def close_freeze(plan: ReplayPlan, owner: str | None) -> bool:
    """FREEZING → awaiting approval or queued (cancelled when nothing could be frozen), the
    total what was frozen, the freezer's lease released. Audited by the caller's own event
    (the plan's, when frozen in the request) or by ``finish_freeze``."""
    note = ""
    if plan.frozen == 0:
        status, note = PlanStatus.CANCELLED, "None of the selected entries could be frozen."
    else:
        status = PlanStatus.AWAITING_APPROVAL if plan.needs_approval else PlanStatus.QUEUED
        if plan.frozen != plan.total:
            gone = plan.total - plan.frozen
            note = (
                f"{plan.total:,} entries were selected; {abs(gone):,} "
                f"{'changed state or were taken by another plan' if gone > 0 else 'more matched'}"
                " before they were frozen."
            )
    mine = Q(pk=plan.pk, status=PlanStatus.FREEZING)
    if owner is not None:
        mine &= Q(lease_owner=owner)
    now = timezone.now()
    closed = ReplayPlan.objects.filter(mine).update(
        status=status,
        total=plan.frozen,
        frozen_at=now,
        status_note=note,
        lease_owner="",
        lease_until=None,
        **({"finished_at": now} if status == PlanStatus.CANCELLED else {}),
    )
    plan.refresh_from_db()
    return closed == 1


def finish_freeze(plan: ReplayPlan, owner: str, actor: Actor, facts: dict[str, Any]) -> bool:
    """A background freeze's end: ``close_freeze``, audited ``dlq.<kind>.frozen`` with the
    requester's reason. False when the plan is no longer freezing under ``owner``."""
    selected = plan.total
    if not close_freeze(plan, owner):
        return False
    after = {"status": plan.status, "selected": selected, **facts}
    _audit(plan, "frozen", actor, after, plan.reason)
    return True


# -- a person's decisions --------------------------------------------------------------------------


def approve(plan: ReplayPlan, actor: Actor, reason: str) -> None:
    """AWAITING_APPROVAL → QUEUED by ``actor`` (the caller checked who may)."""
    ReplayPlan.objects.filter(pk=plan.pk).update(
        status=PlanStatus.QUEUED,
        approved_by_id=actor.user_id,
        approved_by_username=actor.username,
        approved_at=timezone.now(),
    )
    plan.refresh_from_db()
    _person(plan, "approve", actor, reason, requested_by=plan.requested_by_username)


def pause_by(plan: ReplayPlan, actor: Actor, reason: str) -> None:
    """A person pauses a runnable plan (the caller checked it is runnable)."""
    ReplayPlan.objects.filter(pk=plan.pk).update(status=PlanStatus.PAUSED)
    plan.refresh_from_db()
    _person(plan, "pause", actor, reason)


def resume(plan: ReplayPlan, actor: Actor, reason: str) -> None:
    """PAUSED or HALTED → QUEUED; resuming a halted plan overrules its canary."""
    changes: dict[str, Any] = {"status": PlanStatus.QUEUED}
    if plan.status == PlanStatus.HALTED:
        changes["canary_passed_at"] = timezone.now()  # the person overrules the canary
    ReplayPlan.objects.filter(pk=plan.pk).update(**changes)
    plan.refresh_from_db()
    _person(plan, "resume", actor, reason)


def cancel(
    plan: ReplayPlan, actor: Actor, reason: str, release: Callable[[dt.datetime], int]
) -> None:
    """Any unfinished state → CANCELLED. ``release(now)`` gives back the items not yet sent
    (and returns how many); a freezing plan stops freezing (its freezer's next chunk finds it
    cancelled and rolls back) and its total becomes what was frozen."""
    now = timezone.now()
    was_freezing = plan.status == PlanStatus.FREEZING
    ReplayPlan.objects.filter(pk=plan.pk).update(
        status=PlanStatus.CANCELLED,
        finished_at=now,
        status_note=reason[:1000],
        **({"total": plan.frozen, "lease_owner": "", "lease_until": None} if was_freezing else {}),
    )
    cancelled = release(now)
    ReplayPlan.objects.filter(pk=plan.pk).update(cancelled=F("cancelled") + cancelled)
    plan.refresh_from_db()
    frozen = {"while_freezing": True, "frozen": plan.total} if was_freezing else {}
    _person(plan, "cancel", actor, reason, cancelled=cancelled, **frozen)


# -- the relay -------------------------------------------------------------------------------------


def start_plan(plan: ReplayPlan) -> None:
    """QUEUED → RUNNING, ``started_at`` set the first time (a resumed plan keeps it)."""
    if plan.status == PlanStatus.QUEUED:
        ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.QUEUED).update(
            status=PlanStatus.RUNNING, started_at=Coalesce(F("started_at"), timezone.now())
        )
        plan.refresh_from_db()


def enter_waiting(plan: ReplayPlan, reason: str, actor: Actor) -> bool:
    """Runnable → WAITING for its broker, one audit event per outage (outcome "failed").
    True when the plan is (now or already) WAITING."""
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
            _audit(plan, "broker_unreachable", actor, after, note[:1000], failed=True)
    return plan.status == PlanStatus.WAITING


def note_waiting(plan: ReplayPlan, note: str) -> None:
    """A WAITING plan's reason, as the latest probe tells it."""
    ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.WAITING).update(status_note=note)


def leave_waiting(plan: ReplayPlan, actor: Actor) -> bool:
    """WAITING → RUNNING once the broker answers, audited with how long it waited."""
    now = timezone.now()
    with transaction.atomic():
        changed = ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.WAITING).update(
            status=PlanStatus.RUNNING, status_note="", waiting_since=None
        )
        if changed:
            waited = (now - plan.waiting_since).total_seconds() if plan.waiting_since else None
            log.warning("replay plan %s: the broker answers again, resuming", plan.pk)
            after = {"status": PlanStatus.RUNNING, "waited_s": waited, "outage": plan.outages}
            _audit(plan, "broker_back", actor, after)
        plan.refresh_from_db()
    return bool(changed)


def pause(plan: ReplayPlan, note: str, actor: Actor) -> None:
    """The relay pauses a runnable plan with ``note`` on it, audited (outcome "failed")."""
    with transaction.atomic():
        paused = ReplayPlan.objects.filter(pk=plan.pk, status__in=RUNNABLE).update(
            status=PlanStatus.PAUSED, status_note=note[:1000]
        )
        if paused:
            after = {"status": PlanStatus.PAUSED}
            _audit(plan, "pause", actor, after, note[:1000], failed=True)


def halt(plan: ReplayPlan, recurred: int, actor: Actor) -> None:
    """RUNNING → HALTED: the canary's failure came back (in the caller's transaction)."""
    changed = ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.RUNNING).update(
        status=PlanStatus.HALTED,
        status_note=f"canary: {recurred} message(s) dead-lettered again",
    )
    if changed:
        halted = {"recurred": recurred, "canary_size": plan.canary_size}
        _audit(plan, "dlq.replay.halted", actor, halted, "canary: the failure recurred",
               failed=True)  # fmt: skip


def finish(plan: ReplayPlan, actor: Actor) -> None:
    """Every item of a replay resolved: DONE, or DONE_WITH_FAILURES (audit outcome "failed")
    when any entry failed for good."""
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
                "finished",
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


def finish_discard(plan: ReplayPlan) -> None:
    """Every item of a discard resolved: RUNNING → DONE."""
    ReplayPlan.objects.filter(pk=plan.pk, status=PlanStatus.RUNNING).update(
        status=PlanStatus.DONE, finished_at=timezone.now()
    )
    plan.refresh_from_db()
    after = {"total": plan.total, "discarded": plan.discarded, "skipped": plan.skipped}
    _audit(plan, "dlq.plans.discard.finished", Actor.system(), after)
    request_checkpoint()  # a burst ended: anchor it now, not at the next minute
