"""An entry's lineage for its page: the replays it came from and went to, and its plans."""

from __future__ import annotations

from typing import Any

from dashboard.http import HtmxHttpRequest
from dlq.models import ReplayItem

LINEAGE_DEPTH = 20


def lineage_context(request: HtmxHttpRequest, entry: Any) -> dict[str, Any]:
    """For the entry page: its ancestors (bounded walk), its children (replays that came
    back), the plans it was in, and whether this user may replay or discard it."""
    ancestors: list[Any] = []
    current = entry
    while current.parent_id and len(ancestors) < LINEAGE_DEPTH:
        current = type(entry).objects.filter(pk=current.parent_id).first()
        if current is None:
            break
        ancestors.append(current)
    return {
        "ancestors": ancestors,
        "children": list(entry.children.order_by("id")[:50]),
        "plan_items": list(
            ReplayItem.objects.filter(entry=entry).select_related("plan").order_by("-id")[:20]
        ),
        "can_replay": request.user.has_perm("dlq.replay_deadletter"),
        "can_discard": request.user.has_perm("dlq.discard_deadletter"),
    }
