"""Issue #12 item 4: the four-eyes threshold counts what one person asked for within a window
(splitting a large action into small plans still needs a second person), and an entry belongs
to one open plan at a time (a discard awaiting approval reserves its entries)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

from dlq.models import DeadLetter, PlanStatus, Status
from dlq.plans.actions import PlanRefused, do_approve_plan, do_create_plan
from dlq.plans.preview import Selection, build_preview
from dlq.triage.filters import EntryFilter
from tests.conftest import client_for, make_channel, make_user
from tests.dlq.conftest import letter, store
from tests.dlq.replay_helpers import plan_for

pytestmark = pytest.mark.django_db


def _entries(n: int) -> list[DeadLetter]:
    channel = make_channel()
    return store(
        channel,
        *[letter(headers={"Idempotency-Key": f"k-{i}", "order_id": i}) for i in range(n)],
    )


@override_settings(DLO_FOUR_EYES_THRESHOLD=10, DLO_FOUR_EYES_WINDOW_S=3600)
def test_splitting_a_discard_under_the_threshold_still_needs_approval(oncall: User) -> None:
    entries = _entries(25)
    first = plan_for(entries[:8], oncall, kind="discard")
    assert first.status != PlanStatus.AWAITING_APPROVAL  # 8 of 10
    second = plan_for(entries[8:16], oncall, kind="discard")
    assert second.status == PlanStatus.AWAITING_APPROVAL  # 16 asked within the window
    # Another person has their own budget.
    other = make_user("olive", "oncall")
    third = plan_for(entries[16:24], other, kind="discard")
    assert third.status != PlanStatus.AWAITING_APPROVAL


@override_settings(DLO_FOUR_EYES_THRESHOLD=10, DLO_FOUR_EYES_WINDOW_S=0)
def test_plans_outside_the_window_do_not_count(oncall: User) -> None:
    entries = _entries(20)
    plan_for(entries[:8], oncall, kind="discard")
    assert plan_for(entries[8:16], oncall, kind="discard").status != "awaiting_approval"


@override_settings(DLO_FOUR_EYES_THRESHOLD=10)
def test_approved_plans_do_not_use_up_the_budget(oncall: User) -> None:
    entries = _entries(30)
    big = plan_for(entries[:12], oncall, kind="discard")
    assert big.status == PlanStatus.AWAITING_APPROVAL
    approver = make_user("abe", "oncall")
    from audit.actions import Actor

    do_approve_plan(big.pk, actor=Actor.for_user(approver), reason="checked the list")
    assert plan_for(entries[12:20], oncall, kind="discard").status != "awaiting_approval"


@override_settings(DLO_FOUR_EYES_THRESHOLD=3)
def test_entries_of_a_discard_awaiting_approval_cannot_be_taken_by_another_plan(
    oncall: User,
) -> None:
    entries = _entries(6)
    waiting = plan_for(entries[:5], oncall, kind="discard")
    assert waiting.status == PlanStatus.AWAITING_APPROVAL
    other = make_user("olive", "oncall")
    selection = Selection(EntryFilter(), [e.pk for e in entries[:2]])
    for kind in ("discard", "replay"):
        with pytest.raises(PlanRefused, match="can be planned|can be"):
            do_create_plan(
                kind, selection, DeadLetter.objects.all(),
                actor=_actor(other), reason="sneak", velocity=None,
            )  # fmt: skip
        preview = build_preview(kind, selection, DeadLetter.objects.all())
        assert preview.eligible == 0 and preview.excluded == {"in another open plan": 2}
    # The page says so too, and nothing changed state.
    response = client_for(other).post(
        "/dead-letters/discard/", {"id": f"{entries[0].pk}", "action_reason": "sneak"}
    )
    assert response.status_code == 400
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {Status.NEW}
    # An entry outside the waiting plan is still free.
    free = plan_for([entries[5]], other, kind="discard")
    assert free.total == 1


def test_a_cancelled_plan_releases_its_entries(oncall: User) -> None:
    from dlq.plans.actions import do_cancel_plan

    entries = _entries(3)
    with override_settings(DLO_FOUR_EYES_THRESHOLD=1):
        waiting = plan_for(entries, oncall, kind="discard")
    do_cancel_plan(waiting.pk, actor=_actor(oncall), reason="wrong selection")
    assert plan_for(entries, oncall, kind="discard").total == 3


def _actor(user: User) -> Any:
    from audit.actions import Actor

    return Actor.for_user(user)


def test_plans_awaiting_approval_are_counted_for_approvers_but_never_their_requester(
    oncall: User, viewer: User
) -> None:
    """Issue 26.1: the top bar's count (and its 10 s poll) reaches the people who can approve;
    four-eyes keeps a requester's own plans out of their count; a viewer is never asked."""
    from dlq.models.plans import ReplayPlan

    other = make_user("olive", "oncall")
    channel = make_channel()
    ReplayPlan.objects.create(
        channel=channel, status=PlanStatus.AWAITING_APPROVAL, reason="r", total=5,
        requested_by=oncall, requested_by_username=oncall.get_username(), needs_approval=True,
    )  # fmt: skip
    ReplayPlan.objects.create(channel=channel, status=PlanStatus.DONE, reason="r", total=1)
    badge = client_for(other).get("/dead-letters/replays/awaiting/", HTTP_HX_REQUEST="true")
    assert badge.status_code == 200
    assert "1</span> plan awaits your approval" in badge.content.decode()
    assert "1</span> plan awaits your approval" in client_for(other).get("/").content.decode()
    own = client_for(oncall).get("/dead-letters/replays/awaiting/").content.decode()
    assert "0</span> plans await your approval" in own and "hidden" in own
    assert client_for(viewer).get("/dead-letters/replays/awaiting/").status_code == 286
    assert "approvals-badge" not in client_for(viewer).get("/").content.decode()
