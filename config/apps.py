from __future__ import annotations

from django.apps import AppConfig


class ProjectConfig(AppConfig):
    """The wiring as an installed app, last in ``INSTALLED_APPS``: it starts the in-process
    scheduler of ``make run`` once every app is ready (no models, no migrations)."""

    name = "config"
    verbose_name = "Project wiring"

    def ready(self) -> None:
        from config import scheduler

        scheduler.start_if_enabled()
