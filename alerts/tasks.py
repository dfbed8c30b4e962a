"""Celery tasks of alerting: thin wrappers over ``alerts.evaluate`` and ``alerts.notify``.

``deliver_notifications_task`` lives in ``alerts.notify_tasks`` (registered under its old name,
``alerts.tasks.deliver_notifications_task``) so that ``alerts.evaluate`` can enqueue it without
importing this module, which imports ``alerts.evaluate``.
"""

from __future__ import annotations

import datetime as dt

from celery import shared_task
from django.db.models import Q
from django.utils import timezone

from alerts.evaluate import do_evaluate_alerts
from alerts.models import Alert, AlertState, DeliveryAttempt, Silence
from alerts.notify_tasks import deliver_notifications_task

__all__ = [
    "deliver_notifications_task",
    "evaluate_alerts_task",
    "prune_alerts_task",
]

RETENTION = dt.timedelta(days=30)


@shared_task(ignore_result=True)
def evaluate_alerts_task() -> str:
    """Periodic (~15 s). Idempotent on re-entry: evaluations queue on a row lock and a second
    run at the same time changes nothing."""
    return do_evaluate_alerts(timezone.now()).summary()


@shared_task(ignore_result=True)
def prune_alerts_task(batch: int = 5000) -> int:
    """Bounded storage: resolved alerts (with their notifications), expired silences and
    delivery attempts older than 30 days, a bounded batch per run."""
    cutoff = timezone.now() - RETENTION
    deleted = 0
    ids = list(
        Alert.objects.filter(state=AlertState.RESOLVED, resolved_at__lt=cutoff).values_list(
            "pk", flat=True
        )[:batch]
    )
    deleted += Alert.objects.filter(pk__in=ids).delete()[0]
    ids = list(
        DeliveryAttempt.objects.filter(started_at__lt=cutoff).values_list("pk", flat=True)[:batch]
    )
    deleted += DeliveryAttempt.objects.filter(pk__in=ids).delete()[0]
    ids = list(Silence.objects.filter(Q(ends_at__lt=cutoff)).values_list("pk", flat=True)[:batch])
    deleted += Silence.objects.filter(pk__in=ids).delete()[0]
    return deleted
