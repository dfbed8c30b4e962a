"""The plans a person asks for: create, approve, pause, resume, cancel. Their status changes
go through ``dlq.plans.plan_state``, their work through ``dlq.plans.plan_jobs``."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from audit.actions import Actor, EventSpec, record, record_many
from dlq.models import (
    ItemStatus,
    PlanKind,
    PlanStatus,
    ReplayItem,
    ReplayPlan,
    Status,
    set_status,
)
from dlq.models.plans import FINISHED, RUNNABLE
from dlq.plans import freeze, plan_jobs, plan_state
from dlq.plans.preview import build_preview

log = logging.getLogger(__name__)


class PlanRefused(Exception):
    """A bulk action that cannot be planned or changed, with the reason to show."""


def _existing_plan(request_key: str | None) -> ReplayPlan | None:
    if not request_key:
        return None
    return ReplayPlan.objects.filter(request_key=request_key).first()


def do_create_plan(
    kind: str,
    selection: Any,
    entries: Any,
    *,
    actor: Actor,
    reason: str,
    request_key: str | None = None,
    velocity: float | None = None,
    canary_size: int = 0,
    canary_wait_s: float = 30.0,
    override: bool = False,
    override_reason: str = "",
) -> tuple[Any, bool]:
    """Create a replay or discard plan over ``selection`` (within the caller's permitted
    ``entries``). Returns ``(plan, created)``; a repeated ``request_key`` (a double-submitted
    form) returns the plan the first submission created.

    1. Re-run the preview on the server (never trust what the form echoes back).
    2. Refuse without a reason, a blocked replay without an override and its reason.
    3. Save the plan (FREEZING) with the selection as confirmed and its id bound.
    4. Freeze the entries as items (``dlq.plans.freeze``; a replay reserves them, REPLAYING, even
       while it awaits approval, and audits one request per entry): a small selection at
       once in this transaction, then the plan's audit event with the ids' digest and the
       relay enqueued after commit (unless a second person must approve first, or a small
       discard is simply done now); a larger one audits the plan now and is frozen in the
       background, in short chunks, with its progress on the plan's page.
    """

    existing = _existing_plan(request_key)
    if existing is not None:
        return existing, False
    reason = reason.strip()
    if not reason:
        raise PlanRefused("Give a reason.")
    try:
        with transaction.atomic():
            preview, override = _plannable(
                kind, selection, override=override, override_reason=override_reason, entries=entries
            )
            plan = _new_plan(
                kind,
                selection,
                preview,
                freeze.snapshot(kind, selection, entries, actor),
                actor=actor,
                reason=reason,
                request_key=request_key,
                velocity=velocity,
                canary_size=canary_size,
                canary_wait_s=canary_wait_s,
                override=override,
                override_reason=override_reason,
            )
            if preview.eligible > settings.DLO_FREEZE_INLINE:
                _audit_plan_created(plan, preview, selection, actor, reason, None)
                plan_jobs.enqueue_freeze(plan.pk)
                return plan, True
            frozen = freeze.freeze_now(plan, selection, entries, actor)
            if not frozen.count:
                raise PlanRefused("None of the matching entries can be planned any more.")
            _audit_plan_created(plan, preview, selection, actor, reason, frozen)
            if plan.status == PlanStatus.QUEUED:
                plan_jobs.launch(plan)
    except IntegrityError:
        # A concurrent double submit won the unique request_key: answer with its plan.
        existing = _existing_plan(request_key)
        if existing is None:
            raise
        return existing, False
    return plan, True


def _plannable(
    kind: str, selection: Any, *, entries: Any, override: bool, override_reason: str
) -> tuple[Any, bool]:
    """Steps 1-2 of ``do_create_plan``: the server-side preview and the refusals. Returns
    ``(preview, override)`` with ``override`` kept only when the preview is blocked."""
    preview = build_preview(kind, selection, entries)
    if preview.errors:
        raise PlanRefused(" ".join(preview.errors))
    if preview.blocked and not (override and override_reason.strip()):
        raise PlanRefused(
            "Blocked by the channel's declaration: tick the override and give its reason."
        )
    return preview, bool(override and preview.blocked)


def _new_plan(
    kind: str,
    selection: Any,
    preview: Any,
    spec: dict[str, Any],
    *,
    actor: Actor,
    reason: str,
    request_key: str | None,
    velocity: float | None,
    canary_size: int,
    canary_wait_s: float,
    override: bool,
    override_reason: str,
) -> ReplayPlan:
    """Step 3 of ``do_create_plan``: the plan row, FREEZING, its total the entries selected
    now; it will await approval when overridden or when ``actor`` asked for more than the
    four-eyes threshold within its window."""
    asked = _recently_asked(kind, actor) + preview.eligible
    needs_approval = override or asked > settings.DLO_FOUR_EYES_THRESHOLD
    assert preview.channel is not None
    return ReplayPlan.objects.create(
        kind=kind,
        status=PlanStatus.FREEZING,
        channel=preview.channel,
        target_name=preview.target.name if preview.target else "",
        target_group=preview.target.group if preview.target else "",
        selection=selection.as_json(),
        freeze_spec=spec,
        total=preview.eligible,
        velocity=velocity,
        canary_size=max(canary_size, 0) if kind == PlanKind.REPLAY else 0,
        canary_wait_s=canary_wait_s,
        warnings=[w.as_json() for w in preview.warnings],
        override=override,
        override_reason=override_reason.strip() if override else "",
        requested_by_id=actor.user_id,
        requested_by_username=actor.username,
        reason=reason,
        request_key=request_key or None,
        needs_approval=needs_approval,
    )


def _audit_plan_created(
    plan: ReplayPlan,
    preview: Any,
    selection: Any,
    actor: Actor,
    reason: str,
    frozen: freeze.FrozenIds | None,
) -> None:
    """The plan's own audit event: with the frozen ids' digest when frozen in the request,
    else with the count selected and the id bound (the ``frozen`` event follows)."""
    facts = (
        frozen.as_json()
        if frozen is not None
        else {
            "entries": preview.eligible,
            "upto_id": plan.freeze_spec.get("upto_id"),
            "freezing": "background",
        }
    )
    record(
        f"dlq.{plan.kind}.plan",
        actor=actor,
        target=plan,
        channel_slug=plan.channel.slug,
        reason=reason,
        after={
            **facts,
            "matched": preview.matched,
            "excluded": preview.excluded,
            "selection": selection.as_json(),
            "target": plan.target_display,
            "velocity": plan.velocity,
            "canary_size": plan.canary_size,
            "warnings": [w.code for w in preview.warnings],
            "override": plan.override,
            "override_reason": plan.override_reason,
            "needs_approval": plan.needs_approval,
        },
    )


def _recently_asked(kind: str, actor: Actor) -> int:
    """Entries ``actor`` put into plans of ``kind`` that ran without a second person, within
    ``DLO_FOUR_EYES_WINDOW_S``: the four-eyes threshold counts what one person asked for in
    the window, so a large action split into small plans still needs an approval."""
    since = timezone.now() - dt.timedelta(seconds=settings.DLO_FOUR_EYES_WINDOW_S)
    mine = (
        Q(requested_by_id=actor.user_id)
        if actor.user_id is not None
        else Q(requested_by_id__isnull=True, requested_by_username=actor.username)
    )
    plans = ReplayPlan.objects.filter(mine, kind=kind, created_at__gte=since, needs_approval=False)
    return int(plans.exclude(status=PlanStatus.CANCELLED).aggregate(n=Sum("total"))["n"] or 0)


def _locked_plan(plan_id: int) -> ReplayPlan:

    return ReplayPlan.objects.select_for_update().select_related("channel").get(pk=plan_id)


@transaction.atomic
def do_approve_plan(plan_id: int, *, actor: Actor, reason: str = "") -> ReplayPlan:
    """A second person approves a plan awaiting approval; never its own requester."""

    plan = _locked_plan(plan_id)
    if plan.status == PlanStatus.FREEZING:
        raise PlanRefused(
            f"The plan is still freezing its entries ({plan.frozen:,} of {plan.total:,}): "
            "approve it once it is frozen and awaits approval."
        )
    if plan.status != PlanStatus.AWAITING_APPROVAL:
        state = plan.get_status_display().lower()
        raise PlanRefused(f"The plan is {state}, not awaiting approval.")
    if actor.user_id is None or actor.user_id == plan.requested_by_id:
        raise PlanRefused("The requester cannot approve their own plan: ask a second person.")
    plan_state.approve(plan, actor, reason)
    plan_jobs.launch(plan)
    return plan


@transaction.atomic
def do_pause_plan(plan_id: int, *, actor: Actor, reason: str = "") -> ReplayPlan:

    plan = _locked_plan(plan_id)
    if plan.status not in RUNNABLE:
        raise PlanRefused(f"A {plan.get_status_display().lower()} plan cannot be paused.")
    plan_state.pause_by(plan, actor, reason)
    return plan


@transaction.atomic
def do_resume_plan(plan_id: int, *, actor: Actor, reason: str = "") -> ReplayPlan:
    """Resume a paused plan, or one the canary halted (a person decided to go on)."""

    plan = _locked_plan(plan_id)
    if plan.status not in (PlanStatus.PAUSED, PlanStatus.HALTED):
        raise PlanRefused(f"A {plan.get_status_display().lower()} plan cannot be resumed.")
    plan_state.resume(plan, actor, reason)
    plan_jobs.enqueue_relay(plan.pk)
    return plan


@transaction.atomic
def do_cancel_plan(plan_id: int, *, actor: Actor, reason: str = "") -> ReplayPlan:
    """Cancel: items not yet sent become CANCELLED and their entries NEW again (one audit
    event each). Items in flight (SENDING, and first attempts below the relay's cursor with no
    outcome yet) keep their course: the relay records their real outcome, since the broker may
    already have them. The plan row's lock keeps the relay from taking more meanwhile."""

    plan = _locked_plan(plan_id)
    if plan.status in FINISHED:
        raise PlanRefused(f"The plan is already {plan.get_status_display().lower()}.")
    plan_state.cancel(plan, actor, reason, lambda now: _cancel_items(plan, actor, reason, now))
    return plan


def _cancel_items(plan: ReplayPlan, actor: Actor, reason: str, now: dt.datetime) -> int:
    """``do_cancel_plan``'s items: the pending ones CANCELLED, in chunks; a replay's entries
    NEW again, one audit event each. Returns how many."""
    cancelled = 0
    pending = ReplayItem.objects.filter(plan=plan, status=ItemStatus.PENDING).exclude(
        publishes=0,
        position__lt=plan.claimed_through,  # in flight (``dlq.plans.relay_items``)
    )
    while True:
        chunk = list(pending.order_by("position").values_list("pk", "entry_id")[:5000])
        if not chunk:
            break
        ReplayItem.objects.filter(pk__in=[pk for pk, _ in chunk]).update(
            status=ItemStatus.CANCELLED, finished_at=now
        )
        entry_ids = [e for _, e in chunk]
        if plan.kind == PlanKind.REPLAY:
            set_status(entry_ids, Status.NEW, only=Q(status=Status.REPLAYING))
            record_many(
                [
                    EventSpec(
                        "dlq.replay.cancelled",
                        "dlq.deadletter",
                        e,
                        f"dead letter #{e}",
                        plan.channel.slug,
                        reason=reason,
                        after={"plan": plan.pk, "item": pk},
                        outcome="failed",
                    )  # fmt: skip
                    for pk, e in chunk
                ],
                actor=actor,
            )
        cancelled += len(chunk)
    return cancelled
