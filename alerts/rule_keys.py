"""The rules' names and severities, and which rules an override may tune.

The bottom of the alerts app: ``alerts.models`` (a rule override's validation) and
``alerts.rules`` (the evaluation) both read these, and this module reads neither.
"""

from __future__ import annotations

from django.db import models


class RuleKey(models.TextChoices):
    DLQ_INFLOW = "dlq-inflow", "DLQ inflow"
    DLQ_DEPTH = "dlq-depth", "DLQ depth"
    DLQ_AGE = "dlq-age", "Oldest dead letter"
    POISON_INFLOW = "poison-inflow", "Poison inflow"
    POISON_DEPTH = "poison-depth", "Poison depth"
    DEAD_LETTER_MISSING = "dead-letter-missing", "DLQ / poison address missing"
    BACKLOG = "backlog", "Backlog"
    LAG = "lag", "Lag"
    MESSAGE_AGE = "message-age", "Oldest message"
    STALLED = "stalled", "Stalled"
    STOPPED = "stopped", "Stopped"
    POISONED = "poisoned", "Poisoned"
    NO_CONSUMERS = "no-consumers", "No active consumers"
    POLLER_STALE = "poller-stale", "Poller stale"
    APPROVAL_PENDING = "approval-pending", "Plan awaits approval"


class Severity(models.TextChoices):
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"


#: Rules whose threshold is not a channel field, so an override may set it.
THRESHOLD_RULES = {RuleKey.DLQ_AGE, RuleKey.DLQ_INFLOW, RuleKey.POISON_INFLOW}
#: Rules counting over a window.
WINDOW_RULES = {RuleKey.DLQ_INFLOW, RuleKey.POISON_INFLOW}
#: Rules that are not a channel's: a per-channel override of them means nothing.
NOT_CHANNEL_RULES = {RuleKey.POLLER_STALE, RuleKey.APPROVAL_PENDING}
