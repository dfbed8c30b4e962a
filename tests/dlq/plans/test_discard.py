"""Discard: a state change with a reason, audited per batch (each entry listed); the payload
stays."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

from audit.models import AuditEvent
from dlq.models import DeadLetter, ItemStatus, PlanStatus, ReplayPlan, Status
from dlq.models.plans import DISCARD_OUTCOME_ACTION, outcome_in, outcome_line
from dlq.plans import discard, relay
from dlq.plans.preview import Selection, build_preview
from tests.conftest import client_for, make_channel, make_user
from tests.dlq.conftest import letter, store, update_entries
from tests.dlq.replay_helpers import plan_for

pytestmark = pytest.mark.django_db


def _entries(n: int) -> list[DeadLetter]:
    return store(make_channel(), *[letter() for _ in range(n)])


def _discard(client: Any, ids: str, **data: Any) -> Any:
    return client.post(
        "/dead-letters/discard/",
        {"id": ids, "action_reason": "known bad", "request_key": "d1", **data},
    )


def test_discarding_one_entry_is_a_state_change_audited_with_its_reason(oncall: User) -> None:
    [entry, other] = _entries(2)
    response = _discard(client_for(oncall), str(entry.pk))
    assert response.status_code == 302
    entry.refresh_from_db()
    assert entry.status == Status.DISCARDED and entry.body is not None  # payload kept
    assert DeadLetter.objects.get(pk=other.pk).status == Status.NEW
    # One record for the batch, the person's reason and name on it, the entry's line in it.
    [event] = AuditEvent.objects.filter(action=DISCARD_OUTCOME_ACTION)
    plan = ReplayPlan.objects.get()
    assert event.target_id == str(plan.pk) and event.reason == "known bad"
    assert event.actor_username == "otto"
    item = plan.items.get()
    assert outcome_in(event.after, entry.pk) == {
        "entry": entry.pk,
        "item": item.pk,
        "outcome": "discarded",
        "was": "new",
    }
    assert item.outcome_event_id == event.pk
    assert outcome_line(event.action, event.after, entry.pk) == "discarded (was new)"
    assert plan.status == PlanStatus.DONE


def test_discarding_a_filter_audits_every_entry(oncall: User) -> None:
    entries = _entries(4)
    client = client_for(oncall)
    page = client.get("/dead-letters/discard/?channel=orders")
    assert (
        page.status_code == 200
        and '<strong class="replay-count">4</strong>' in page.content.decode()
    )
    client.post("/dead-letters/discard/", {"channel": "orders", "action_reason": "cleanup",
                                           "request_key": "d2"})  # fmt: skip
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.DISCARDED}
    audited = AuditEvent.objects.filter(action=DISCARD_OUTCOME_ACTION)
    listed = [m[0] for e in audited for m in _after(e)["messages"] if m[2] == "discarded"]
    assert sorted(listed) == sorted(e.pk for e in entries)


def test_discard_needs_a_reason(oncall: User) -> None:
    [entry] = _entries(1)
    assert _discard(client_for(oncall), str(entry.pk), action_reason="").status_code == 400
    assert DeadLetter.objects.get().status == Status.NEW
    assert not AuditEvent.objects.filter(action=DISCARD_OUTCOME_ACTION).exists()


def _awaiting_approval(oncall: User, n: int) -> tuple[list[DeadLetter], ReplayPlan]:
    """A discard of ``n`` entries above the threshold, waiting for a second person."""
    entries = _entries(n)
    _discard(client_for(oncall), ",".join(str(e.pk) for e in entries))
    plan = ReplayPlan.objects.get()
    assert plan.status == PlanStatus.AWAITING_APPROVAL
    return entries, plan


@override_settings(DLO_FOUR_EYES_THRESHOLD=2)
def test_bulk_discard_above_the_threshold_waits_for_a_second_person(oncall: User) -> None:
    entries, plan = _awaiting_approval(oncall, 3)
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.NEW}
    url = f"/dead-letters/replays/{plan.pk}/approve/"
    client_for(oncall).post(url, {"reason": "self"})
    assert ReplayPlan.objects.get().status == PlanStatus.AWAITING_APPROVAL
    client_for(make_user("olivia", "oncall")).post(url, {"reason": "agreed"})
    plan.refresh_from_db()
    assert plan.status == PlanStatus.DONE and plan.discarded == 3
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.DISCARDED}
    events = AuditEvent.objects.filter(action=DISCARD_OUTCOME_ACTION)
    assert sum(_after(e)["discarded"] for e in events) == 3
    assert {_after(e)["approved_by"] for e in events} == {"olivia"}


@override_settings(DLO_FOUR_EYES_THRESHOLD=2)
def test_an_entry_that_changed_state_is_listed_as_skipped(oncall: User) -> None:
    entries, plan = _awaiting_approval(oncall, 3)
    # Another path changed one entry while the plan waited for its approval.
    update_entries(DeadLetter.objects.filter(pk=entries[0].pk), status=Status.REPLAYING)
    url = f"/dead-letters/replays/{plan.pk}/approve/"
    client_for(make_user("olivia", "oncall")).post(url, {"reason": "agreed"})
    [event] = AuditEvent.objects.filter(action=DISCARD_OUTCOME_ACTION)
    assert outcome_in(event.after, entries[0].pk)["outcome"] == "skipped"  # type: ignore[index]
    assert outcome_line(event.action, event.after, entries[0].pk) == "skipped (was replaying)"
    assert outcome_line(event.action, event.after, entries[1].pk) == "discarded (was new)"
    assert _after(event)["discarded"] == 2 and _after(event)["skipped"] == 1


def _after(event: AuditEvent) -> dict[str, Any]:
    assert isinstance(event.after, dict)
    return event.after


def test_entries_being_replayed_are_skipped_not_discarded(oncall: User) -> None:
    entries = _entries(2)
    plan_for(entries[:1], oncall)  # entry 0 is now REPLAYING
    preview = build_preview("discard", Selection.from_params({"channel": "orders"}),
                             DeadLetter.objects.all())  # fmt: skip
    assert preview.eligible == 1 and preview.excluded == {"being replayed": 1}


def test_a_large_approved_discard_runs_in_the_relay_in_batches(oncall: User) -> None:
    entries = _entries(3)
    with override_settings(DLO_FOUR_EYES_THRESHOLD=1):
        plan = plan_for(entries, oncall, kind="discard")
    from audit.actions import Actor
    from dlq.plans import actions

    original = discard.DISCARD_INLINE
    discard.DISCARD_INLINE = 1
    try:
        actions.do_approve_plan(plan.pk, actor=Actor.for_user(make_user("olivia", "oncall")))
    finally:
        discard.DISCARD_INLINE = original
    assert ReplayPlan.objects.get().status == PlanStatus.QUEUED
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    assert set(plan.items.values_list("status", flat=True)) == {ItemStatus.DISCARDED}
