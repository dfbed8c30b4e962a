"""Periodic jobs, shared by Celery beat and the in-process scheduler of ``make run``.

Each entry: name → (dotted path of a Celery task taking no arguments, interval in seconds).
Apps add their jobs here so that both schedulers run exactly the same work.
"""

from __future__ import annotations

import os
from typing import Any


def _seconds(name: str, default: float) -> float:
    """An interval from the environment (settings.py validates the same variable loudly)."""
    try:
        return max(float(os.environ.get(name) or default), 1.0)
    except ValueError:
        return default


PERIODIC_JOBS: dict[str, tuple[str, float]] = {
    "verify-audit-chain": ("audit.tasks.verify_audit_chain_task", 3600.0),
    "seal-audit-events": ("audit.tasks.seal_audit_events_task", 2.0),
    # A checkpoint when the log grew, at most DLO_AUDIT_CHECKPOINT_INTERVAL_S after it did.
    "audit-checkpoint": (
        "audit.tasks.write_audit_checkpoint_task",
        _seconds("DLO_AUDIT_CHECKPOINT_INTERVAL_S", 10.0),
    ),
    "schedule-polls": ("channels_registry.tasks.schedule_polls_task", 5.0),
    "prune-samples": ("channels_registry.tasks.prune_samples_task", 600.0),
    "dlq-ingest": ("dlq.tasks.enqueue_ingest_task", 30.0),
    "dlq-retention-purge": ("dlq.tasks.purge_expired_task", 3600.0),
    "dlq-partitions": ("dlq.tasks.ensure_partitions_task", 600.0),
    "evaluate-alerts": ("alerts.tasks.evaluate_alerts_task", 15.0),
    "deliver-notifications": ("alerts.tasks.deliver_notifications_task", 5.0),
    "prune-alerts": ("alerts.tasks.prune_alerts_task", 3600.0),
    "dlq-replay-relay": ("dlq.tasks.resume_replay_plans_task", 10.0),
    "dlq-freeze-plans": ("dlq.tasks.resume_freezing_plans_task", 2.0),
}


def beat_schedule() -> dict[str, dict[str, Any]]:
    return {
        name: {"task": task, "schedule": every} for name, (task, every) in PERIODIC_JOBS.items()
    }
