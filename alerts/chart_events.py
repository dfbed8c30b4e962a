"""The channel page's chart marks from alerts: each alert's firing (registered with
``channels_registry.charts`` by ``AlertsConfig.ready``)."""

from __future__ import annotations

import datetime as dt

from alerts.models import Alert
from channels_registry.charts import ChartEvent
from channels_registry.models import Channel


def alert_events(channel: Channel, start: dt.datetime, end: dt.datetime) -> list[ChartEvent]:
    alerts = Alert.objects.filter(channel=channel, fired_at__gte=start, fired_at__lte=end)
    return [
        ChartEvent(a.fired_at.timestamp(), "alert", f"alert fired: {a.summary}")
        for a in alerts.order_by("-fired_at")[:20]
        if a.fired_at is not None
    ]
