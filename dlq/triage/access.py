"""The one access helper per object type, used by every dead-letter view and the API."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.shortcuts import get_object_or_404

from dlq.models import DeadLetter, FailureGroup
from dlq.text.redaction import REVEAL_PERMISSION

VIEW_PERMISSION = "dlq.view_deadletter"


def entries_for_user(request: HttpRequest) -> QuerySet[DeadLetter]:
    if not request.user.has_perm(VIEW_PERMISSION):
        raise PermissionDenied("You need the viewer role to see dead letters.")
    return DeadLetter.objects.all()


def get_entry_for_user(request: HttpRequest, pk: int) -> DeadLetter:
    return get_object_or_404(
        entries_for_user(request).select_related("channel", "channel__broker", "group", "state"),
        pk=pk,
    )


def groups_for_user(request: HttpRequest) -> QuerySet[FailureGroup]:
    if not request.user.has_perm("dlq.view_failuregroup"):
        raise PermissionDenied("You need the viewer role to see failure groups.")
    return FailureGroup.objects.select_related("channel", "sample")


def can_reveal(user: Any) -> bool:
    return bool(user.has_perm(REVEAL_PERMISSION))


def require_reveal(request: HttpRequest, entry: DeadLetter, action: str) -> None:
    """Raise PermissionDenied unless the user may see ``entry``'s redacted payload (``action``
    is ``reveal`` or ``download``); the refusal is audited before the 403, as for replay."""
    from audit.actions import Actor, do_record_denial

    if can_reveal(request.user):
        return
    do_record_denial(
        f"dlq.{action}",
        actor=Actor.from_request(request),
        target_type="dlq.deadletter",
        target_repr=str(entry),
        details={"permission": REVEAL_PERMISSION, "method": request.method, "entry": entry.pk},
    )
    raise PermissionDenied(
        f"This channel redacts payloads: you need the compliance role to {action} them."
    )


# -- replay / discard plans ------------------------------------------------------------------

PLAN_VIEW_PERMISSION = "dlq.view_replayplan"
ACTION_PERMISSIONS = {
    "replay": "dlq.replay_deadletter",
    "discard": "dlq.discard_deadletter",
    "approve": "dlq.approve_bulk_action",
}


def require_action(request: HttpRequest, action: str, target: str = "") -> None:
    """Raise PermissionDenied unless the user may ``action`` (replay, discard, approve); the
    refusal is audited (who tried what) before the 403."""
    from audit.actions import Actor, do_record_denial

    if request.user.has_perm(ACTION_PERMISSIONS[action]):
        return
    do_record_denial(
        f"dlq.{action}",
        actor=Actor.from_request(request),
        target_type="dlq.deadletter" if action != "approve" else "dlq.replayplan",
        target_repr=target or request.path,
        details={"permission": ACTION_PERMISSIONS[action], "method": request.method},
    )
    raise PermissionDenied(f"You need the on-call role to {action} dead letters.")


def plans_for_user(request: HttpRequest) -> QuerySet[Any]:
    from dlq.models import ReplayPlan

    if not request.user.has_perm(PLAN_VIEW_PERMISSION):
        raise PermissionDenied("You need the viewer role to see replay plans.")
    return ReplayPlan.objects.select_related("channel")


def get_plan_for_user(request: HttpRequest, pk: int) -> Any:
    return get_object_or_404(plans_for_user(request), pk=pk)
