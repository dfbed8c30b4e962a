"""Celery tasks of polling: thin wrappers over ``channels_registry.polling``; they take ids."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from channels_registry.polling import do_poll_broker, due_brokers, poll_brokers, prune_samples


@shared_task(acks_late=True, ignore_result=True)
def poll_broker_task(broker_id: int) -> str:
    """One poll of one broker. Re-entry is safe: the lease makes an overlapping run a no-op
    (counted as an overrun), so no retry decorator is needed; the next tick polls again."""
    return do_poll_broker(broker_id).status


@shared_task(acks_late=True, ignore_result=True)
def poll_brokers_task(broker_ids: list[int]) -> list[str]:
    """One concurrent poll of these brokers (bounded pool): a hung broker holds one thread
    for its timeout, never the others' samples, whatever the worker's own concurrency."""
    return [outcome.status for outcome in poll_brokers(broker_ids)]


@shared_task(ignore_result=True)
def schedule_polls_task() -> int:
    """Enqueue one concurrent poll of the brokers that are due (jittered interval, backoff,
    circuit breaker)."""
    due = due_brokers(timezone.now())
    if due:
        poll_brokers_task.delay(due)
    return len(due)


@shared_task(ignore_result=True)
def prune_samples_task() -> list[int]:
    """Bounded storage: drop raw samples past their window and rollups past 30 days."""
    return list(prune_samples())
