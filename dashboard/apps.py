from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Health board"

    def ready(self) -> None:
        from dashboard import scheduler

        scheduler.start_if_enabled()
