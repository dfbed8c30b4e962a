from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit trail"

    def ready(self) -> None:
        # Django's auth signals are the only hook that sees every login path (our form, the
        # admin, the API); the receivers only call actions.
        from audit import (
            receivers,  # noqa: F401
            recording,
            sealer,
        )

        # Downward hook: recording an event wakes the sealer without importing it (the sealer
        # records its own refusals and checkpoints, so it sits above the writer).
        recording.on_record(sealer.after_record)
