from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        from alerts.chart_events import alert_events
        from channels_registry.charts import register_event_source

        register_event_source(alert_events)
