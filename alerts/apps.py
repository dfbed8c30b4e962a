from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        from alerts.chart_events import alert_events
        from alerts.rules import alert_coverage
        from channels_registry.charts import register_event_source
        from channels_registry.checks import register_alert_coverage

        register_event_source(alert_events)
        # The registry's declaration checks read the alert rules a channel gets through this.
        register_alert_coverage(alert_coverage)
