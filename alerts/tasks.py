"""Celery tasks of alerting: thin wrappers over ``alerts.evaluate`` and ``alerts.notify``."""

from __future__ import annotations

import datetime as dt

from celery import shared_task
from django.db.models import Q
from django.utils import timezone

from alerts.evaluate import do_evaluate_alerts
from alerts.models import Alert, AlertState, DeliveryAttempt, Silence
from alerts.notify import do_deliver_notifications

RETENTION = dt.timedelta(days=30)


@shared_task(ignore_result=True)
def evaluate_alerts_task() -> str:
    """Periodic (~15 s). Idempotent on re-entry: evaluations queue on a row lock and a second
    run at the same time changes nothing."""
    return do_evaluate_alerts(timezone.now()).summary()


@shared_task(ignore_result=True)
def deliver_notifications_task() -> str:
    """Periodic (5 s) and after each evaluation that queued rows. Retries are per row (backoff
    and budget in ``alerts.notify``), so the task itself needs no retry decorator: a crashed
    run leaves leased rows that the next run recovers."""
    return do_deliver_notifications(timezone.now()).summary()


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
