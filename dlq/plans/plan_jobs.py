"""What runs a plan once its state allows it: a small discard at once, anything else the relay
in a worker after the commit; and the background freezer.

The Celery tasks live above this module (``dlq.tasks`` imports the actions), so they are
registered here from ``DlqConfig.ready()`` (``register``) instead of imported: the plan
modules point down, never up to the tasks.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import transaction

from dlq.models import PlanKind, ReplayPlan
from dlq.plans import discard

_jobs: dict[str, Callable[[int], object]] = {}


def register(*, relay: Callable[[int], object], freeze: Callable[[int], object]) -> None:
    """Called once from ``DlqConfig.ready()`` with the tasks' ``delay``."""
    _jobs["relay"], _jobs["freeze"] = relay, freeze


def _after_commit(job: str, plan_id: int) -> None:
    """Run ``job`` in a worker after the commit. Without a Celery broker (``make run``: tasks
    would run eagerly, i.e. inside this request) the in-process scheduler's ticks pick the
    plan up instead."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return
    enqueue = _jobs[job]
    transaction.on_commit(lambda: enqueue(plan_id))


def enqueue_relay(plan_id: int) -> None:
    _after_commit("relay", plan_id)


def enqueue_freeze(plan_id: int) -> None:
    _after_commit("freeze", plan_id)


def launch(plan: ReplayPlan) -> None:
    """A queued plan (frozen without a second person, or approved): a small discard is done
    now, in the caller's transaction; anything else is enqueued for the relay after commit."""
    if plan.kind == PlanKind.DISCARD and plan.total <= discard.DISCARD_INLINE:
        discard.discard_now(plan)
    else:
        enqueue_relay(plan.pk)
