"""``{% alert_badge "nav" %}``: the live count of firing alerts (htmx-polled every 10 s)."""

from __future__ import annotations

from typing import Any

from django import template

from alerts.access import VIEW_PERMISSION
from alerts.evaluate import firing_count

register = template.Library()

VARIANTS = ("nav", "board")


@register.inclusion_tag("alerts/_badge.html", takes_context=True)
def alert_badge(context: template.Context, variant: str = "nav") -> dict[str, Any]:
    user = context.get("user")
    allowed = user is not None and user.is_authenticated and user.has_perm(VIEW_PERMISSION)
    return {
        "allowed": allowed,
        "firing": firing_count() if allowed else 0,
        "variant": variant if variant in VARIANTS else "nav",
    }
