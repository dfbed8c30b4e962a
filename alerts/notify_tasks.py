"""The notification delivery task, below both ``alerts.evaluate`` (which enqueues it after an
evaluation that queued rows) and ``alerts.tasks`` (which re-exports it with the other tasks)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from alerts.notify import do_deliver_notifications


# The name is the one the task had in ``alerts.tasks``: schedules and queued messages use it.
@shared_task(name="alerts.tasks.deliver_notifications_task", ignore_result=True)
def deliver_notifications_task() -> str:
    """Periodic (5 s) and after each evaluation that queued rows. Retries are per row (backoff
    and budget in ``alerts.notify``), so the task itself needs no retry decorator: a crashed
    run leaves leased rows that the next run recovers."""
    return do_deliver_notifications(timezone.now()).summary()
