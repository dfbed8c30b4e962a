"""Celery tasks: thin wrappers over capture (ingest, retention, partitions, trends) and plans
(relay, freeze). An entry point: it may import every part of ``dlq``."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from dlq.capture import ingest, retention, trends


@shared_task(
    autoretry_for=(Exception,), retry_backoff=5, retry_backoff_max=300, retry_jitter=True,
    max_retries=5,
)  # fmt: skip
def ingest_channel_task(channel_id: int) -> dict[str, int]:
    """Idempotent on re-entry: already stored letters are deduplicated by their key."""
    result = ingest.do_ingest_channel(channel_id)
    return {"inserted": result.inserted, "duplicates": result.duplicates}


@shared_task
def enqueue_ingest_task() -> int:
    """Periodic: one ingest task per channel with a DLQ or poison address."""
    ids = ingest.channels_to_ingest()
    for channel_id in ids:
        ingest_channel_task.delay(channel_id)
    return len(ids)


@shared_task
def purge_expired_task() -> int:
    """Periodic: retention purge (bounded per run): entries purged or dropped; and the
    groups' trend hours past both windows (``dlq.capture.trends``)."""
    now = timezone.now()
    trends.prune(now)
    result = retention.do_purge_expired(now)
    return result.purged + result.entries_dropped


@shared_task
def ensure_partitions_task() -> int:
    """Periodic: keep dead-letter partitions ready ahead of the ids (PostgreSQL)."""
    from dlq.capture import partitions

    return len(partitions.ensure_partitions())


@shared_task(
    autoretry_for=(Exception,), retry_backoff=5, retry_backoff_max=300, retry_jitter=True,
    max_retries=20,
)  # fmt: skip
def run_replay_plan_task(plan_id: int) -> dict[str, int | str]:
    """Run a replay/discard plan for one time slice. Idempotent on re-entry: the plan's lease
    lets one relay at a time work on it, and items carry their own state. Re-enqueues itself
    while work is left; the periodic ``resume_replay_plans_task`` catches any that get lost."""
    from dlq.plans import relay

    result = relay.run_plan(plan_id)
    if result.more:
        run_replay_plan_task.apply_async((plan_id,), countdown=max(result.retry_in, 0.5))
    return {"published": result.published, "confirmed": result.confirmed, "status": result.status}


@shared_task
def resume_replay_plans_task() -> int:
    """Periodic: plans that should be running but have no live relay (a crashed worker, a lost
    task, or ``make run`` without Celery) are run again; in-process when tasks run eagerly."""
    from django.conf import settings

    from dlq.plans import relay
    from dlq.plans.relay_items import orphaned_plans

    ids = orphaned_plans()
    for plan_id in ids:
        if settings.CELERY_TASK_ALWAYS_EAGER:
            relay.run_plan(plan_id, max_seconds=10.0)  # the scheduler thread, bounded
        else:
            run_replay_plan_task.delay(plan_id)
    return len(ids)


@shared_task(
    autoretry_for=(Exception,), retry_backoff=5, retry_backoff_max=300, retry_jitter=True,
    max_retries=20,
)  # fmt: skip
def freeze_plan_task(plan_id: int) -> dict[str, int | str]:
    """Freeze a plan's entries for one time slice (``dlq.plans.freeze``). Idempotent on re-entry:
    the plan's lease lets one freezer at a time work on it, and it resumes from the plan's
    committed cursor. Re-enqueues itself while work is left."""
    from dlq.plans import freeze

    result = freeze.run_freeze(plan_id)
    if result.more:
        freeze_plan_task.delay(plan_id)
    return {"frozen": result.frozen, "chunks": result.chunks, "status": result.status}


@shared_task
def resume_freezing_plans_task() -> int:
    """Periodic: freezing plans no freezer holds (a crashed worker, a lost task, or
    ``make run`` without Celery) are frozen further; in-process, bounded, when tasks run
    eagerly."""
    from django.conf import settings

    from dlq.plans import freeze

    eager = settings.CELERY_TASK_ALWAYS_EAGER
    ids = freeze.orphaned_freezes(grace_s=0 if eager else 30)
    for plan_id in ids:
        if eager:
            freeze.run_freeze(plan_id, max_seconds=freeze.TICK_S)  # the scheduler thread
        else:
            freeze_plan_task.delay(plan_id)
    return len(ids)
