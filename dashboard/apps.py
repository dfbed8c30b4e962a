from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Health board"

    def ready(self) -> None:
        from dashboard import api_schema, receivers, scheduler

        _ = api_schema  # registers the bearer scheme with drf-spectacular
        _ = receivers  # revokes a user's API tokens on deactivation or a new password

        scheduler.start_if_enabled()
