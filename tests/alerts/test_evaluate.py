"""Evaluation against the database: facts from health rows and dead letters, transitions,
notifications queued once, inhibition by a stale poller, silences and overrides."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from alerts.actions import do_create_silence
from alerts.evaluate import do_evaluate_alerts, firing_count
from alerts.models import Alert, AlertState, Notification, RuleOverride, Transition
from audit.actions import Actor
from channels_registry.actions import refresh_findings
from channels_registry.models import BrokerPollState, Channel
from dlq.models import DeadLetter, Status
from tests.alerts.conftest import polled, set_health, webhook
from tests.conftest import make_broker, make_channel
from tests.dlq.conftest import letter, store, update_entries

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def stored(channel: Channel, n: int, ingested: dt.datetime) -> list[DeadLetter]:
    """``n`` unresolved dead letters, dead-lettered and ingested at ``ingested``."""
    rows = store(channel, *(letter() for _ in range(n)))
    DeadLetter.objects.filter(pk__in=[r.pk for r in rows]).update(
        dead_lettered_at=ingested, ingested_at=ingested
    )
    return rows


def active(rule: str) -> Alert | None:
    return Alert.objects.filter(rule=rule, state__in=["pending", "firing"]).first()


def test_unresolved_dead_letters_fire_dlq_depth_with_evidence_and_queue_one_notification() -> None:
    channel = make_channel()
    dest = webhook("http://127.0.0.1:9/hook")
    set_health(channel, at(0), evidence=["backlog 12, steady"])
    stored(channel, 3, at(-5))
    result = do_evaluate_alerts(at(10))
    alert = Alert.objects.get(rule="dlq-depth")
    assert alert.state == AlertState.FIRING and alert.fired_at == at(10)
    assert alert.value == 3 and alert.summary == "DLQ depth 3 > 0"
    assert alert.evidence == ["DLQ depth 3 > 0", "backlog 12, steady"]
    assert result.fired == 1
    (n,) = Notification.objects.all()
    assert (n.alert_id, n.transition, n.destination_id) == (alert.pk, "firing", dest.pk)
    assert n.next_attempt_at == at(40)  # grouping wait
    # Re-entry at the same time, and later evaluations: nothing new.
    do_evaluate_alerts(at(10))
    do_evaluate_alerts(at(25))
    assert Alert.objects.count() == 1 and Notification.objects.count() == 1
    assert firing_count() == 1


def test_letters_ingested_after_the_sample_are_not_counted_twice() -> None:
    channel = make_channel(alert_dlq_depth=4)
    # The poll at t=0 saw 3 letters on the broker; ingest moved them into the store after it.
    set_health(channel, at(0), dlq_depth=3)
    stored(channel, 3, at(5))
    do_evaluate_alerts(at(10))
    assert active("dlq-depth") is None  # 3, not 6
    set_health(channel, at(15), dlq_depth=2)  # two more arrived on the broker
    do_evaluate_alerts(at(20))
    alert = active("dlq-depth")
    assert alert is not None and alert.value == 5


def test_drained_dlq_resolves_and_queues_one_resolve_per_destination_that_got_the_firing() -> None:
    channel = make_channel()
    webhook("http://127.0.0.1:9/hook")
    set_health(channel, at(0))
    stored(channel, 2, at(-5))
    do_evaluate_alerts(at(10))
    # A destination added after the alert fired gets no resolve for it.
    webhook("http://127.0.0.1:9/other", name="late")
    update_entries(DeadLetter.objects.all(), status=Status.DISCARDED)
    set_health(channel, at(15))
    do_evaluate_alerts(at(20))
    alert = Alert.objects.get(rule="dlq-depth")
    assert alert.state == AlertState.RESOLVED and alert.resolved_at == at(20)
    assert alert.resolve_evidence[0] == "DLQ depth 0 > 0"
    assert sorted(Notification.objects.values_list("transition", "destination__name")) == [
        ("firing", "ops-webhook"),
        ("resolved", "ops-webhook"),
    ]
    do_evaluate_alerts(at(20))
    assert Notification.objects.count() == 2


def test_stopped_channel_pends_then_fires_and_no_consumers_inhibits_it() -> None:
    channel = make_channel()
    webhook("http://127.0.0.1:9/hook")
    for t in (0, 30, 60):
        set_health(channel, at(t), state="stopped", backlog=40, active_consumers=0, consumers=0)
        do_evaluate_alerts(at(t))
    stopped, no_consumers = active("stopped"), active("no-consumers")
    assert stopped is not None and no_consumers is not None
    assert stopped.state == no_consumers.state == AlertState.FIRING
    assert stopped.inhibited and not no_consumers.inhibited
    assert [n.alert.rule for n in Notification.objects.select_related("alert")] == ["no-consumers"]
    # Backlog over its threshold is muted by the same cause too.
    assert active("backlog") is None  # 40 < 10,000


def test_stale_poller_fires_once_and_inhibits_the_brokers_channel_alerts() -> None:
    broker = make_broker()
    channels = [make_channel(broker, name=f"C{i}", slug=f"c{i}", address=f"q{i}") for i in range(5)]
    webhook("http://127.0.0.1:9/hook")
    for c in channels:
        set_health(c, at(0), state="stopped", backlog=10, active_consumers=0, consumers=0)
    do_evaluate_alerts(at(0))
    # The broker stops answering: health goes STALE, the poller's last success ages.
    BrokerPollState.objects.filter(broker=broker).update(consecutive_failures=4, last_error="boom")
    for c in channels:
        set_health(c, at(0), state="stale", updated_at=at(100))
    polled(broker, at(0))
    BrokerPollState.objects.filter(broker=broker).update(consecutive_failures=4, last_error="boom")
    do_evaluate_alerts(at(100))
    stale = active("poller-stale")
    assert stale is not None and stale.state == AlertState.FIRING
    assert "4 failed poll(s) in a row: boom" in stale.evidence
    # The channel alerts hold (unknown), muted; only the broker page is queued.
    pending = Alert.objects.filter(rule="no-consumers")
    assert pending.count() == 5 and all(a.inhibited for a in pending)
    assert [n.alert.rule for n in Notification.objects.select_related("alert")] == ["poller-stale"]
    # The poller recovers: the stale alert resolves, the channels are judged again.
    for c in channels:
        set_health(c, at(130), state="ok", backlog=0)
    do_evaluate_alerts(at(130))
    assert active("poller-stale") is None
    assert Alert.objects.filter(rule="no-consumers", state="pending").count() == 0


def test_silence_mutes_notifications_until_it_ends() -> None:
    channel = make_channel()
    webhook("http://127.0.0.1:9/hook")
    set_health(channel, at(0))
    stored(channel, 1, at(-5))
    silence = do_create_silence(
        actor=Actor.system("test"),
        channel=channel,
        rule="dlq-depth",
        duration=dt.timedelta(minutes=5),
        reason="known replay in progress",
        now=at(0),
    )
    do_evaluate_alerts(at(10))
    alert = Alert.objects.get(rule="dlq-depth")
    assert alert.state == AlertState.FIRING and alert.silence_id == silence.pk
    assert not Notification.objects.exists()
    assert firing_count() == 0
    set_health(channel, at(300))
    do_evaluate_alerts(at(301))
    alert.refresh_from_db()
    assert alert.silence_id is None and alert.notified
    assert Notification.objects.get().transition == Transition.FIRING


def test_a_disabled_rule_retires_its_alert_and_the_checks_flag_it() -> None:
    channel = make_channel()
    set_health(channel, at(0))
    stored(channel, 1, at(-5))
    do_evaluate_alerts(at(10))
    assert active("dlq-depth") is not None
    RuleOverride.objects.create(channel=channel, rule="dlq-depth", enabled=False)
    set_health(channel, at(20))
    do_evaluate_alerts(at(20))
    alert = Alert.objects.get(rule="dlq-depth")
    assert alert.state == AlertState.RESOLVED
    assert "no longer applies" in alert.resolve_evidence[0]
    # Depth disabled and inflow off by default (threshold 0): a P10 error.
    refresh_findings(channel)
    codes = {f["code"]: f["severity"] for f in channel.findings}
    assert codes.get("dlq-no-alert") == "error"
    RuleOverride.objects.create(channel=channel, rule="dlq-inflow", enabled=True)
    refresh_findings(channel)
    codes = {f["code"]: f["severity"] for f in channel.findings}
    assert "dlq-no-alert" not in codes and codes["dlq-depth-alert-disabled"] == "warning"


def test_inflow_counts_new_letters_in_the_window_then_resolves() -> None:
    channel = make_channel(alert_dlq_depth=100)
    set_health(channel, at(0))
    rows = store(channel, letter(), letter())
    DeadLetter.objects.filter(pk__in=[r.pk for r in rows]).update(
        dead_lettered_at=at(-10), ingested_at=at(-5)
    )
    do_evaluate_alerts(at(0))
    alert = active("dlq-inflow")
    assert (
        alert is not None and alert.value == 2 and "2 new dead letter(s) in 5 min" in alert.summary
    )
    assert active("dlq-depth") is None
    set_health(channel, at(300))
    do_evaluate_alerts(at(300))
    assert active("dlq-inflow") is None


def test_oldest_dead_letter_past_its_slo() -> None:
    channel = make_channel(alert_dlq_depth=100)
    set_health(channel, at(0))
    store(channel, letter())
    DeadLetter.objects.update(dead_lettered_at=at(-7200), ingested_at=at(-7000))
    do_evaluate_alerts(at(0))
    alert = active("dlq-age")
    assert alert is not None and alert.value == 7200
    assert alert.summary == "oldest dead letter 2.0 h old (SLO 60 min)"


def test_deleted_or_disabled_channel_alerts_go_away() -> None:
    channel = make_channel()
    set_health(channel, at(0), state="poisoned")
    do_evaluate_alerts(at(0))
    assert active("poisoned") is not None
    channel.enabled = False
    channel.save()
    do_evaluate_alerts(at(15))
    assert active("poisoned") is None
    assert Alert.objects.get(rule="poisoned").state == AlertState.RESOLVED


def test_evaluation_uses_a_fixed_number_of_queries(django_assert_max_num_queries: object) -> None:
    broker = make_broker()
    for i in range(30):
        c = make_channel(broker, name=f"C{i}", slug=f"c{i}", address=f"q{i}")
        set_health(c, timezone.now(), state="stopped", backlog=5, active_consumers=0)
    webhook("http://127.0.0.1:9/hook")
    with django_assert_max_num_queries(40):  # type: ignore[operator]
        do_evaluate_alerts(timezone.now())
    assert Alert.objects.count() == 60  # stopped + no-consumers pending on 30 channels
