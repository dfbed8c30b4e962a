"""The channel page's chart marks from dead letters: failure groups first seen, replay and
discard plans run (registered with ``channels_registry.charts`` by ``DlqConfig.ready``)."""

from __future__ import annotations

import datetime as dt

from django.db.models import Q

from channels_registry.charts import ChartEvent
from channels_registry.models import Channel
from dlq.models import FailureGroup, ReplayPlan
from dlq.text.render import visible


def dead_letter_events(channel: Channel, start: dt.datetime, end: dt.datetime) -> list[ChartEvent]:
    events = [
        ChartEvent(
            g.first_seen.timestamp(),
            "group",
            f"failure group #{g.pk} first seen: "
            + visible(g.error_class or g.reason or "unknown error")[:120],
        )
        for g in FailureGroup.objects.filter(
            channel=channel, first_seen__gte=start, first_seen__lte=end
        ).order_by("first_seen")[:20]
    ]
    plans = (
        ReplayPlan.objects.filter(channel=channel, created_at__lte=end)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=start))
        .order_by("-created_at")[:20]
    )
    for p in plans:
        # A discard runs at once (no started_at); a plan still running reaches "now".
        began = p.started_at or p.created_at
        finished = p.finished_at or end
        events.append(
            ChartEvent(
                max(began, start).timestamp(),
                "plan",
                f"{p.get_kind_display().lower()} plan #{p.pk} ({p.get_status_display().lower()})",
                end=finished.timestamp(),
            )
        )
    return events
