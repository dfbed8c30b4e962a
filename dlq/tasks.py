"""Celery tasks: thin wrappers over ``dlq.actions``."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from dlq import actions


@shared_task(
    autoretry_for=(Exception,), retry_backoff=5, retry_backoff_max=300, retry_jitter=True,
    max_retries=5,
)  # fmt: skip
def ingest_channel_task(channel_id: int) -> dict[str, int]:
    """Idempotent on re-entry: already stored letters are deduplicated by their key."""
    result = actions.do_ingest_channel(channel_id)
    return {"inserted": result.inserted, "duplicates": result.duplicates}


@shared_task
def enqueue_ingest_task() -> int:
    """Periodic: one ingest task per channel with a DLQ or poison address."""
    ids = actions.channels_to_ingest()
    for channel_id in ids:
        ingest_channel_task.delay(channel_id)
    return len(ids)


@shared_task
def purge_expired_task() -> int:
    """Periodic: retention purge (bounded per run)."""
    return actions.do_purge_expired(timezone.now()).purged
