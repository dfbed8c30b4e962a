from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit trail"

    def ready(self) -> None:
        # Django's auth signals are the only hook that sees every login path (our form, the
        # admin, the API); the receivers only call actions.
        from audit import receivers  # noqa: F401
