"""Recording a published batch's outcomes (step 4 of ``dlq.plans.relay``): confirmed, retried
after a capped exponential backoff with jitter, or failed for good, in one transaction with
one audit event per terminal outcome."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from audit.actions import Actor, EventSpec, record_many
from audit.batch import record_uniform
from brokers.base import PublishOutcome
from dlq.models import DeadLetter, ItemStatus, ReplayItem, ReplayPlan, Status

BACKOFF_BASE_S = 1.0


BACKOFF_CAP_S = 60.0


def backoff(attempt: int) -> float:
    """Capped exponential backoff with full jitter: 1 s, 2 s, 4 s … ≤ 60 s."""
    return random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1))


def _definite_refusal(outcome: PublishOutcome) -> bool:
    """The broker said no (nothing was enqueued): the next attempt may take a new replay id.
    Anything else unconfirmed (timeout, connection lost) is in doubt: same id again."""
    return outcome.refused or outcome.permanent


@dataclasses.dataclass
class _Outcomes:
    """One batch's outcomes, sorted for ``record_outcomes``."""

    ok: list[ReplayItem] = dataclasses.field(default_factory=list)
    failed: list[tuple[ReplayItem, str]] = dataclasses.field(default_factory=list)
    retry: list[ReplayItem] = dataclasses.field(default_factory=list)


def _sort_outcomes(
    plan: ReplayPlan, items: list[ReplayItem], outcomes: list[PublishOutcome], now: dt.datetime
) -> _Outcomes:
    """Confirmed, failed for good, or to be retried (the items updated to their next state)."""
    by_key = {o.key: o for o in outcomes}
    sorted_ = _Outcomes()
    for item in items:
        outcome = by_key.get(str(item.pk)) or PublishOutcome(str(item.pk), False, "no outcome")
        if outcome.confirmed:
            sorted_.ok.append(item)
            continue
        item.last_error = outcome.reason[:2000] or "not confirmed"
        if outcome.connection_lost:
            # Not the message's fault: the attempt is given back, the replay id kept (the
            # copy may be stored), and the plan waits for the broker (see ``_await_broker``).
            item.attempts = max(item.attempts - 1, 0)
            item.status = ItemStatus.PENDING
            item.next_attempt_at = None
            sorted_.retry.append(item)
            continue
        if outcome.permanent or item.attempts >= plan.max_attempts:
            sorted_.failed.append((item, item.last_error))
            continue
        if _definite_refusal(outcome):
            item.replay_id = ""  # nothing was enqueued: the next attempt gets its own id
        item.status = ItemStatus.PENDING
        item.next_attempt_at = now + dt.timedelta(seconds=backoff(item.attempts))
        sorted_.retry.append(item)
    return sorted_


def record_outcomes(
    plan: ReplayPlan,
    items: list[ReplayItem],
    outcomes: list[PublishOutcome],
    actor: Actor,
    slug: str | None = None,
) -> tuple[int, int]:
    """Step 4: one transaction for the batch's outcomes. Returns (confirmed, failed). The
    groups' open counts are not recounted here (see ``_Pipeline.recount``)."""
    now = timezone.now()
    batch = _sort_outcomes(plan, items, outcomes, now)
    slug = plan.channel.slug if slug is None else slug
    with transaction.atomic():
        n_ok = _record_confirmed(plan, batch.ok, now, actor, slug)
        _record_failed(plan, batch.failed, now, actor, slug)
        if batch.retry:
            ReplayItem.objects.bulk_update(
                batch.retry, ["status", "next_attempt_at", "last_error", "replay_id", "attempts"]
            )
        ReplayPlan.objects.filter(pk=plan.pk).update(
            confirmed=F("confirmed") + n_ok, failed=F("failed") + len(batch.failed)
        )
    return n_ok, len(batch.failed)


def _outcome_event(plan: ReplayPlan, action: str, slug: str, **extra: Any) -> EventSpec:
    """The shared part of a batch's per-entry outcome events (``record_uniform``)."""
    after = {"plan": plan.pk, "item": 0, "replay_id": "", "attempts": 0,
             "target": plan.target_display}  # fmt: skip
    return EventSpec(action, "dlq.deadletter", 0, "", slug, after=after, **extra)


_PER_ENTRY = ("item", "replay_id", "attempts")


def _record_confirmed(
    plan: ReplayPlan, ok: list[ReplayItem], now: dt.datetime, actor: Actor, slug: str
) -> int:
    """Confirmed items: item CONFIRMED, entry REPLAYED, one event each (set-based)."""
    if not ok:
        return 0
    # Only items still SENDING (a concurrent cancel never touches those, see actions).
    n_ok = ReplayItem.objects.filter(pk__any=[i.pk for i in ok], status=ItemStatus.SENDING).update(
        status=ItemStatus.CONFIRMED, finished_at=now, last_error=""
    )
    DeadLetter.objects.filter(pk__any=[i.entry_id for i in ok]).update(status=Status.REPLAYED)
    record_uniform(
        _outcome_event(plan, "dlq.replay.replayed", slug),
        _PER_ENTRY,
        [(i.entry_id, f"dead letter #{i.entry_id}", i.pk, i.replay_id, i.attempts) for i in ok],
        actor=actor,
    )
    return n_ok


def _record_failed(
    plan: ReplayPlan,
    failed: list[tuple[ReplayItem, str]],
    now: dt.datetime,
    actor: Actor,
    slug: str,
) -> None:
    """Items failed for good: item and entry FAILED with the reason, one event each."""
    for item, reason in failed:
        ReplayItem.objects.filter(pk=item.pk, status=ItemStatus.SENDING).update(
            status=ItemStatus.FAILED, finished_at=now, last_error=reason
        )
    if failed:
        DeadLetter.objects.filter(pk__any=[i.entry_id for i, _ in failed]).update(
            status=Status.FAILED
        )
    specs = [
        dataclasses.replace(
            _outcome_event(plan, "dlq.replay.failed", slug, reason=reason, outcome="failed"),
            target_id=i.entry_id,
            target_repr=f"dead letter #{i.entry_id}",
            after={
                "plan": plan.pk,
                "item": i.pk,
                "replay_id": i.replay_id,
                "attempts": i.attempts,
                "target": plan.target_display,
            },
        )  # fmt: skip
        for i, reason in failed
    ]
    record_many(specs, actor=actor)
