"""Plans awaiting approval, as the people who can approve them see them.

Four-eyes (``do_approve_plan``) never lets a requester approve their own plan, so a user is
shown the plans awaiting approval that someone else requested, and only with the approve
permission. The top bar counts them (polled like the alert badge); the board lists them.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from dlq.models.plans import PlanStatus, ReplayPlan
from dlq.triage.access import ACTION_PERMISSIONS

#: Plans listed on the board; the count in the top bar is exact.
BOARD_SHOWN = 5


def can_approve(user: Any) -> bool:
    return bool(
        user is not None and user.is_authenticated and user.has_perm(ACTION_PERMISSIONS["approve"])
    )


def awaiting_approval_by(user: Any) -> QuerySet[ReplayPlan]:
    """The plans ``user`` may approve now (none without the permission), oldest first."""
    if not can_approve(user):
        return ReplayPlan.objects.none()
    return (
        ReplayPlan.objects.filter(status=PlanStatus.AWAITING_APPROVAL)
        .exclude(requested_by_id=user.pk)
        .select_related("channel")
        .order_by("id")
    )
