"""The dead-letter app's data: entries and their failure groups (``entries``), replay and
discard plans with their items (``plans``), the groups' hourly counts (``trends``), and the
``pk__any`` lookup. Every model is imported here so Django registers it with the app."""

from dlq.models.entries import (
    OPEN_Q,
    REPEAT_OFFENDER_REPLAYS,
    RESOLVED,
    DeadLetter,
    DeadLetterKey,
    EntryState,
    FailureGroup,
    SearchText,
    Source,
    Status,
    count_unresolved,
    refresh_group_counts,
    refresh_open_counts,
    set_status,
)
from dlq.models.plans import (
    FINISHED,
    HOLDING_ITEMS,
    RUNNABLE,
    ItemStatus,
    PlanKind,
    PlanStatus,
    ReplayItem,
    ReplayPlan,
)
from dlq.models.trends import GroupHour

__all__ = [
    "FINISHED",
    "HOLDING_ITEMS",
    "OPEN_Q",
    "REPEAT_OFFENDER_REPLAYS",
    "RESOLVED",
    "RUNNABLE",
    "DeadLetter",
    "DeadLetterKey",
    "EntryState",
    "FailureGroup",
    "GroupHour",
    "ItemStatus",
    "PlanKind",
    "PlanStatus",
    "ReplayItem",
    "ReplayPlan",
    "SearchText",
    "Source",
    "Status",
    "count_unresolved",
    "refresh_group_counts",
    "refresh_open_counts",
    "set_status",
]
