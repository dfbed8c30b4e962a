"""Recording a published batch's outcomes (step 4 of ``dlq.plans.relay``): confirmed, retried
after a capped exponential backoff with jitter, or failed for good, in one transaction with
one audit record for the batch.

The batch's record (``dlq.replay.outcomes``, target the plan) lists every message that reached
a terminal outcome in it: entry, item, replay id, attempt, outcome and the broker's refusal
text where there was one (``OUTCOME_FIELDS``). It is hashed, MACed and sealed as one event, so
it commits to each message's outcome as the per-entry events did; each item keeps the id of
the record that holds its outcome (``ReplayItem.outcome_event``), which is how an entry's page,
the audit filters (``target_id``) and ``audit export --target-id`` find it. One record per
batch instead of one per entry: recording and sealing an event per message cost more than the
message's own outcome (docs/performance.md, "Replay")."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from audit.actions import Actor, record
from audit.models import Outcome
from brokers.base import PublishOutcome
from dlq.models import ItemStatus, ReplayItem, ReplayPlan, Status, set_status
from dlq.models.plans import OUTCOME_ACTION, OUTCOME_FIELDS, stored_or_first_replay_id
from dlq.plans.relay_items import first_attempt, id_unstored

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
    """Step 4: one transaction for the batch's outcomes and their one audit record. Returns
    (confirmed, failed). The groups' open counts are not recounted here (see
    ``_Pipeline.recount``)."""
    now = timezone.now()
    batch = _sort_outcomes(plan, items, outcomes, now)
    slug = plan.channel.slug if slug is None else slug
    with transaction.atomic():
        # First attempts taken from the cursor are still PENDING in the database: the ones not
        # confirmed are written as the SENDING items they are in memory, for the paths below.
        confirmed = {i.id for i in batch.ok}
        _mark_sending(plan, [i for i in items if first_attempt(i) and i.id not in confirmed])
        event_id = _record_batch(plan, batch, actor, slug)
        n_ok = _record_confirmed(plan, batch.ok, now, event_id)
        _record_failed(batch.failed, now, event_id)
        if batch.retry:
            ReplayItem.objects.bulk_update(
                batch.retry, ["status", "next_attempt_at", "last_error", "replay_id", "attempts"]
            )
        ReplayPlan.objects.filter(pk=plan.pk).update(
            confirmed=F("confirmed") + n_ok, failed=F("failed") + len(batch.failed)
        )
    return n_ok, len(batch.failed)


def _record_batch(plan: ReplayPlan, batch: _Outcomes, actor: Actor, slug: str) -> int | None:
    """The batch's one audit record (see the module docstring); None when no message of the
    batch reached a terminal outcome (only retries)."""
    if not batch.ok and not batch.failed:
        return None
    messages: list[list[Any]] = [
        [i.entry_id, i.id, i.replay_id, i.attempts, "replayed", ""] for i in batch.ok
    ]
    messages += [[i.entry_id, i.pk, i.replay_id, i.attempts, "failed", reason]
                 for i, reason in batch.failed]  # fmt: skip
    messages.sort(key=lambda m: m[1])  # item order: the same text for the same outcomes
    reason = ""
    if batch.failed:
        reason = f"{len(batch.failed)} failed for good; first: {batch.failed[0][1]}"[:2000]
    event = record(
        OUTCOME_ACTION,
        actor=actor,
        target_type=ReplayPlan._meta.label_lower,
        target_id=plan.pk,
        target_repr=str(plan),
        channel_slug=slug,
        reason=reason,
        after={
            "plan": plan.pk,
            "target": plan.target_display,
            "replayed": len(batch.ok),
            "failed": len(batch.failed),
            "fields": list(OUTCOME_FIELDS),
            "messages": messages,
        },
        outcome=Outcome.FAILED if batch.failed else Outcome.SUCCESS,
    )
    return event.pk


def _mark_sending(plan: ReplayPlan, items: list[ReplayItem]) -> None:
    """First attempts (``first_attempt``) written as SENDING, attempt and publish counted,
    their replay id stored (an item frozen before the freeze wrote it has none)."""
    if items:
        ReplayItem.objects.filter(pk__any=[i.pk for i in items], publishes=0).update(
            status=ItemStatus.SENDING,
            attempts=1,
            publishes=1,
            replay_id=stored_or_first_replay_id(plan),
        )


def _record_confirmed(
    plan: ReplayPlan, ok: list[ReplayItem], now: dt.datetime, event_id: int | None
) -> int:
    """Confirmed items: item CONFIRMED (with its record), entry REPLAYED (set-based). The
    item row is written once here: a first attempt from the cursor was not written before."""
    if not ok:
        return 0
    first = [i.id for i in ok if first_attempt(i)]
    retried = [i.id for i in ok if not first_attempt(i)]
    n_ok = 0
    if first:
        # Only items with no publish recorded: still in flight (which a concurrent cancel
        # leaves alone, see actions), not taken over by another run since. No condition on
        # the status, whose index the planner would walk instead of the primary key.
        unstored = any(id_unstored(i) for i in ok)
        n_ok += ReplayItem.objects.filter(pk__any=first, publishes=0).update(
            status=ItemStatus.CONFIRMED,
            attempts=1,
            publishes=1,
            finished_at=now,
            outcome_event=event_id,
            **({"replay_id": stored_or_first_replay_id(plan)} if unstored else {}),
        )
    if retried:
        # Only items still SENDING (a concurrent cancel never touches those, see actions).
        n_ok += ReplayItem.objects.filter(pk__any=retried, status=ItemStatus.SENDING).update(
            status=ItemStatus.CONFIRMED, finished_at=now, last_error="", outcome_event=event_id
        )
    set_status([i.entry_id for i in ok], Status.REPLAYED)
    return n_ok


def _record_failed(
    failed: list[tuple[ReplayItem, str]], now: dt.datetime, event_id: int | None
) -> None:
    """Items failed for good: item and entry FAILED, the item with the reason."""
    for item, reason in failed:
        ReplayItem.objects.filter(pk=item.pk, status=ItemStatus.SENDING).update(
            status=ItemStatus.FAILED, finished_at=now, last_error=reason, outcome_event=event_id
        )
    if failed:
        set_status([i.entry_id for i, _ in failed], Status.FAILED)
