from __future__ import annotations

from django.apps import AppConfig


class DlqConfig(AppConfig):
    name = "dlq"
    verbose_name = "Dead letters"
