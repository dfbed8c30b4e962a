"""``GroupHour``: entries of one failure group dead-lettered in one hour. Only the model; the
counting and pruning are capture's (``dlq.capture.trends``)."""

from __future__ import annotations

from django.db import models


class GroupHour(models.Model):
    """Entries of one failure group dead-lettered in one hour (see the module docstring)."""

    group = models.ForeignKey(
        "dlq.FailureGroup", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    hour = models.DateTimeField(db_index=True)  # the hour's start, UTC
    count = models.BigIntegerField()

    class Meta:
        constraints = [
            # Also the read path: the rows of the groups shown, from a given hour on.
            models.UniqueConstraint(fields=["group", "hour"], name="dlq_grouphour_unique")
        ]

    def __str__(self) -> str:
        return f"group {self.group_id} at {self.hour:%Y-%m-%d %H}:00: {self.count}"
