"""Issue #26 item 1: a plan awaiting a second person's approval reaches the alert channels.

The plan-awaits-approval rule fires while a replay/discard plan awaits approval and resolves
once it is approved or cancelled; its notification goes to the destinations like every alert
(routed by their filters, muted by silences), and names the plan, its requester, its size and
the link to the plan page."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import override_settings
from django.utils import timezone

from alerts import rules
from alerts.evaluate import do_evaluate_alerts, plan_key
from alerts.models import (
    Alert,
    AlertState,
    DestinationKind,
    Notification,
    RuleKey,
    RuleOverride,
    Silence,
)
from alerts.notify import do_deliver_notifications
from audit.actions import Actor
from dlq.models import PlanStatus
from dlq.models.plans import ReplayPlan
from dlq.plans.actions import do_approve_plan, do_cancel_plan
from tests.alerts.conftest import Receiver, set_health, webhook
from tests.conftest import client_for, make_channel, make_user
from tests.dlq.conftest import letter, store
from tests.dlq.replay_helpers import plan_for

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("four_eyes_at_3"),
]


@pytest.fixture
def four_eyes_at_3() -> object:
    with override_settings(DLO_FOUR_EYES_THRESHOLD=3, DLO_BASE_URL="https://dlo.example.test"):
        yield


def _waiting_plan(requester: User, kind: str = "replay", **options: object) -> ReplayPlan:
    channel = make_channel()
    entries = store(channel, *[letter() for _ in range(5)])
    set_health(channel, timezone.now())  # a fresh poller: only the plan's alert is news
    plan = plan_for(entries, requester, kind=kind, **options)
    assert plan.status == PlanStatus.AWAITING_APPROVAL
    return plan


def _approval_alert(plan: ReplayPlan) -> Alert:
    return Alert.objects.get(key=plan_key(plan.pk))


def _approval_payloads(receiver: Receiver) -> list[dict[str, object]]:
    return [
        a for body in receiver.bodies() for a in body["alerts"] if a["rule"] == "approval-pending"
    ]


def test_a_plan_awaiting_approval_notifies_and_resolves_once_approved(
    receiver: Receiver, oncall: User
) -> None:
    webhook(receiver.url)
    plan = _waiting_plan(oncall)
    now = timezone.now()
    do_evaluate_alerts(now)
    alert = _approval_alert(plan)
    assert alert.state == AlertState.FIRING
    assert alert.rule == RuleKey.APPROVAL_PENDING
    assert alert.channel_id == plan.channel_id
    do_deliver_notifications(now + dt.timedelta(seconds=31))
    (fired,) = _approval_payloads(receiver)
    assert fired["transition"] == "firing"
    assert fired["summary"] == (
        f"replay plan #{plan.pk} of 5 entries by otto awaits approval:"
        f" https://dlo.example.test{plan.get_absolute_url()}"
    )
    assert "reason: fixed the consumer" in fired["evidence"]

    do_approve_plan(plan.pk, actor=Actor.for_user(make_user("abe", "oncall")), reason="ok")
    later = now + dt.timedelta(seconds=60)
    do_evaluate_alerts(later)
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED
    do_deliver_notifications(later + dt.timedelta(seconds=31))
    resolved = [a for a in _approval_payloads(receiver) if a["transition"] == "resolved"]
    assert len(resolved) == 1
    # The summary stays the one that fired; the resolving evidence says why it resolved.
    assert "no longer awaits approval (queued)" in str(resolved[0]["evidence"])
    # Evaluating again sends nothing new and raises no second alert for the plan.
    do_evaluate_alerts(later + dt.timedelta(seconds=120))
    assert Alert.objects.filter(rule=RuleKey.APPROVAL_PENDING).count() == 1


def test_a_cancelled_plan_resolves_its_alert(oncall: User) -> None:
    plan = _waiting_plan(oncall, kind="discard")
    now = timezone.now()
    do_evaluate_alerts(now)
    assert _approval_alert(plan).state == AlertState.FIRING
    do_cancel_plan(plan.pk, actor=Actor.for_user(oncall), reason="wrong selection")
    do_evaluate_alerts(now + dt.timedelta(seconds=15))
    alert = _approval_alert(plan)
    assert alert.state == AlertState.RESOLVED
    assert alert.resolve_evidence[0].startswith(
        f"discard plan #{plan.pk} of 5 entries by otto no longer awaits approval (cancelled)"
    )


def test_the_requesters_name_cannot_mention_everyone_on_slack(receiver: Receiver) -> None:
    webhook(receiver.url, kind=DestinationKind.SLACK, secret="")
    requester = make_user("<!channel> & <https://evil.test|click>", "oncall")
    _waiting_plan(requester)
    now = timezone.now()
    do_evaluate_alerts(now)
    do_deliver_notifications(now + dt.timedelta(seconds=31))
    (payload,) = receiver.bodies()
    text = payload["text"]
    assert "<!channel>" not in text and "<https://evil.test" not in text
    assert "by &lt;!channel&gt; &amp; &lt;https://evil.test|click&gt; awaits approval" in text


def test_a_silence_of_the_rule_mutes_the_notification(oncall: User) -> None:
    webhook("http://127.0.0.1:9/hook")
    now = timezone.now()
    Silence.objects.create(
        rule=RuleKey.APPROVAL_PENDING,
        starts_at=now - dt.timedelta(minutes=1),
        ends_at=now + dt.timedelta(hours=1),
        reason="approvals are watched on the board today",
    )
    plan = _waiting_plan(oncall)
    do_evaluate_alerts(now)
    alert = _approval_alert(plan)
    assert alert.state == AlertState.FIRING and alert.muted
    assert not Notification.objects.filter(alert=alert).exists()


def test_a_destination_for_another_team_does_not_get_it(oncall: User) -> None:
    webhook("http://127.0.0.1:9/hook", owner_team="someone-else")
    plan = _waiting_plan(oncall)
    do_evaluate_alerts(timezone.now())
    assert not Notification.objects.filter(alert=_approval_alert(plan)).exists()


def test_a_stale_poller_does_not_inhibit_a_plan_awaiting_approval() -> None:
    active = [
        (RuleKey.POLLER_STALE.value, 1, None),
        (RuleKey.APPROVAL_PENDING.value, 1, 7),
        (RuleKey.STOPPED.value, 1, 7),
    ]
    assert rules.inhibited(active) == {(RuleKey.STOPPED.value, 1, 7)}


def test_the_approval_rule_is_not_overridden_per_channel() -> None:
    override = RuleOverride(channel=make_channel(), rule=RuleKey.APPROVAL_PENDING)
    with pytest.raises(ValidationError, match="silence it instead"):
        override.full_clean()


def test_the_alert_page_shows_the_plan_with_hostile_text_escaped(oncall: User) -> None:
    plan = _waiting_plan(oncall, reason="<script>alert(1)</script> the consumer is fixed")
    do_evaluate_alerts(timezone.now())
    alert = _approval_alert(plan)
    html = client_for(oncall).get(alert.get_absolute_url()).content.decode()
    assert f"replay plan #{plan.pk} of 5 entries by otto awaits approval" in html
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; the consumer is fixed" in html
    listing = client_for(oncall).get("/alerts/").content.decode()
    assert "Plan awaits approval" in listing
