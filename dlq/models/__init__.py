"""The dead-letter app's data: entries and their failure groups (``entries``), replay and
discard plans with their items (``plans``), the groups' hourly counts (``trends``), and the
``pk__any`` lookup. Every model is imported here so Django registers it with the app."""

from dlq.models.entries import (
    REPEAT_OFFENDER_REPLAYS,
    RESOLVED,
    UNRESOLVED_Q,
    DeadLetter,
    DeadLetterKey,
    FailureGroup,
    SearchText,
    Source,
    Status,
    count_unresolved,
    refresh_group_counts,
    refresh_open_counts,
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
    "REPEAT_OFFENDER_REPLAYS",
    "RESOLVED",
    "RUNNABLE",
    "UNRESOLVED_Q",
    "DeadLetter",
    "DeadLetterKey",
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
]
