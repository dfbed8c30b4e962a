"""Replay and discard pages: the preview with its confirm form, the plan list, the plan page
(progress polled by htmx every 2 s) and the plan controls (approve, pause, resume, cancel).

Every view checks its permission itself (``dlq.triage.access``); refusals are audited."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from audit.actions import Actor
from audit.models import AuditEvent
from dashboard.http import HtmxHttpRequest
from dlq.models import ItemStatus, PlanKind, PlanStatus
from dlq.models.plans import RUNNABLE, first_items, items_with_errors
from dlq.plans.actions import (
    PlanRefused,
    do_approve_plan,
    do_cancel_plan,
    do_create_plan,
    do_pause_plan,
    do_resume_plan,
)
from dlq.plans.approvals import awaiting_approval_by, can_approve
from dlq.plans.preview import DEFAULT_VELOCITY, MAX_VELOCITY, Selection, build_preview
from dlq.triage.access import entries_for_user, get_plan_for_user, plans_for_user, require_action

PLANS_SHOWN = 100
# htmx stops polling an element that receives this status (an expired session, say).
STOP_POLLING = 286
# Not "reason": that is a filter parameter of the selection (the failure reason).
REASON_FIELD = "action_reason"
ITEMS_SHOWN = 50


def _number(raw: str, default: float, low: float, high: float) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return default
    return min(max(value, low), high) if value == value else default


def _plan_options(data: Any) -> dict[str, Any]:
    canary = int(_number(data.get("canary_size", ""), 0, 0, 10_000))
    return {
        "velocity": _number(data.get("velocity", ""), DEFAULT_VELOCITY, 0.1,
                            MAX_VELOCITY),
        "canary_size": canary,
        "canary_wait_s": _number(data.get("canary_wait_s", ""), 30.0, 1.0, 3600.0),
        "override": data.get("override") == "on",
        "override_reason": str(data.get("override_reason", ""))[:2000],
    }  # fmt: skip


@require_http_methods(["GET", "POST"])
def bulk_action(request: HtmxHttpRequest, kind: str) -> HttpResponse:
    """GET: the preview of replaying/discarding a selection. POST: confirm it (a plan)."""
    if kind not in PlanKind.values:
        raise Http404
    data = request.POST if request.method == "POST" else request.GET
    selection = Selection.from_params(data)
    require_action(request, kind, f"{kind} {selection.as_json()}")
    entries = entries_for_user(request)
    if request.method == "POST":
        try:
            plan, created = do_create_plan(
                kind,
                selection,
                entries,
                actor=Actor.from_request(request),
                reason=str(data.get(REASON_FIELD, ""))[:2000],
                request_key=str(data.get("request_key", ""))[:64] or None,
                **(_plan_options(data) if kind == PlanKind.REPLAY else {}),
            )
        except PlanRefused as exc:
            messages.error(request, str(exc))
        else:
            if not created:
                messages.info(request, "This form was already submitted: here is its plan.")
            elif plan.status == PlanStatus.FREEZING:
                then = "await a second person's approval" if plan.needs_approval else "start"
                messages.info(
                    request,
                    f"{plan.total:,} entries selected: the plan is freezing them in the "
                    f"background and will {then} once they are all frozen.",
                )
            elif plan.status == PlanStatus.AWAITING_APPROVAL:
                messages.warning(request, "The plan needs a second person's approval to run.")
            return redirect(plan)
    result = build_preview(kind, selection, entries)
    context = {
        "kind": kind,
        "p": result,
        "selection_params": selection.params(),
        "needs_approval": result.needs_approval(False),
        "threshold": settings.DLO_FOUR_EYES_THRESHOLD,
        "request_key": uuid.uuid4().hex,
        "form": _plan_options(data) | {"reason": data.get(REASON_FIELD, "")},
        "velocity_default": DEFAULT_VELOCITY,
    }
    status = 400 if request.method == "POST" else 200
    return render(request, "dlq/replay_preview.html", context, status=status)


@require_GET
def plan_list(request: HtmxHttpRequest) -> HttpResponse:
    plans = plans_for_user(request)
    status = request.GET.get("status", "")
    if status in PlanStatus.values:
        plans = plans.filter(status=status)
    shown = list(plans.order_by("-id")[: PLANS_SHOWN + 1])
    context = {
        "plans": shown[:PLANS_SHOWN],
        "more": len(shown) > PLANS_SHOWN,
        "status": status,
        "statuses": PlanStatus.choices,
    }
    return render(request, "dlq/replay_list.html", context)


@require_GET
@never_cache
@login_not_required
def approvals_badge(request: HtmxHttpRequest) -> HttpResponse:
    """The top bar's "N plans await your approval", polled every 10 s by htmx. Anonymous or
    not an approver: stop polling."""
    if not can_approve(request.user):
        return HttpResponse(status=STOP_POLLING)
    context = {"allowed": True, "awaiting": awaiting_approval_by(request.user).count()}
    return render(request, "dlq/_approvals_badge.html", context)


def _plan_context(request: HtmxHttpRequest, plan: Any) -> dict[str, Any]:
    user = request.user
    perm = "dlq.replay_deadletter" if plan.kind == PlanKind.REPLAY else "dlq.discard_deadletter"
    can_act = user.has_perm(perm)
    return {
        "plan": plan,
        "can_pause": can_act and plan.status in RUNNABLE,
        "can_resume": can_act and plan.status in (PlanStatus.PAUSED, PlanStatus.HALTED),
        "can_cancel": can_act and not plan.is_finished,
        "can_approve": plan.status == PlanStatus.AWAITING_APPROVAL
        and user.has_perm("dlq.approve_bulk_action")
        and user.pk != plan.requested_by_id,
        "own_plan": user.pk == plan.requested_by_id,
        "live": not plan.is_finished and plan.status != PlanStatus.AWAITING_APPROVAL,
    }


@require_GET
def plan_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    plan = get_plan_for_user(request, pk)
    context = _plan_context(request, plan)
    if request.htmx and not request.htmx.boosted:
        response = render(request, "dlq/replay_plan.html#progress", context)
        frozen_since = request.GET.get("freezing") and plan.status != PlanStatus.FREEZING
        if not context.get("live") or frozen_since:
            # The plan stopped moving (or finished freezing): reload once so its controls
            # and items are current too.
            response["HX-Refresh"] = "true"
        return response
    context.update(
        items=first_items(plan, ITEMS_SHOWN),
        problems=items_with_errors(plan)[:ITEMS_SHOWN],
        history=AuditEvent.objects.filter(
            target_type="dlq.replayplan", target_id=str(plan.pk)
        ).order_by("-seq")[:50],
        item_statuses=ItemStatus,
    )
    return render(request, "dlq/replay_plan.html", context)


PLAN_ACTIONS = {
    "approve": do_approve_plan,
    "pause": do_pause_plan,
    "resume": do_resume_plan,
    "cancel": do_cancel_plan,
}


@require_POST
def plan_action(request: HtmxHttpRequest, pk: int, action: str) -> HttpResponse:
    if action not in PLAN_ACTIONS:
        raise Http404
    plan = get_plan_for_user(request, pk)
    require_action(request, "approve" if action == "approve" else plan.kind, str(plan))
    reason = request.POST.get("reason", "").strip()[:1000]
    if action in ("approve", "cancel") and not reason:
        messages.error(request, f"Give a reason to {action} the plan.")
        return redirect(plan)
    try:
        PLAN_ACTIONS[action](plan.pk, actor=Actor.from_request(request), reason=reason)
    except PlanRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Plan #{plan.pk}: {action} recorded.")
    return redirect(plan)
