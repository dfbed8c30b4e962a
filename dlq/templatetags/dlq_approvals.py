"""``{% approvals_badge %}`` (the top bar) and ``{% approvals_board %}`` (the board): the plans
awaiting the user's approval (``dlq.plans.approvals``)."""

from __future__ import annotations

from typing import Any

from django import template

from dlq.plans.approvals import BOARD_SHOWN, awaiting_approval_by, can_approve

register = template.Library()


@register.inclusion_tag("dlq/_approvals_badge.html", takes_context=True)
def approvals_badge(context: template.Context) -> dict[str, Any]:
    user = context.get("user")
    allowed = can_approve(user)
    return {"allowed": allowed, "awaiting": awaiting_approval_by(user).count() if allowed else 0}


@register.inclusion_tag("dlq/_approvals_board.html", takes_context=True)
def approvals_board(context: template.Context) -> dict[str, Any]:
    user = context.get("user")
    plans = list(awaiting_approval_by(user)[: BOARD_SHOWN + 1])
    return {"plans": plans[:BOARD_SHOWN], "more": len(plans) > BOARD_SHOWN}
