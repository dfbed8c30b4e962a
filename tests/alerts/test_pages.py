"""Alert pages, acknowledge and silence (audited), the live badge, and the admin pieces."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from alerts.evaluate import do_evaluate_alerts
from alerts.models import Alert, Destination, Notification, RuleOverride, Silence
from audit.models import AuditEvent
from tests.alerts.conftest import set_health, webhook
from tests.channels_registry.test_admin import channel_post
from tests.conftest import client_for, make_channel

pytestmark = pytest.mark.django_db


@pytest.fixture
def firing() -> Alert:
    channel = make_channel()
    set_health(channel, timezone.now(), state="poisoned", evidence=["12 redeliveries in 2 min"])
    webhook("http://127.0.0.1:9/hook")
    do_evaluate_alerts(timezone.now())
    return Alert.objects.get(rule="poisoned")


def test_viewer_sees_the_list_and_the_detail_with_evidence(viewer: object, firing: Alert) -> None:
    client = client_for(viewer)  # type: ignore[arg-type]
    page = client.get("/alerts/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Poisoned" in html and "orders" in html and "alert-state-firing" in html
    assert "Acknowledge" not in html and "silence-form" not in html
    partial = client.get("/alerts/", HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<div id="alerts"') and "<html" not in partial
    detail = client.get(f"/alerts/{firing.pk}/").content.decode()
    assert "12 redeliveries in 2 min" in detail and "ops-webhook" in detail
    assert client.post(f"/alerts/{firing.pk}/ack/").status_code == 403


def test_outsider_is_refused(outsider: object, firing: Alert) -> None:
    client = client_for(outsider)  # type: ignore[arg-type]
    assert client.get("/alerts/").status_code == 403
    assert client.get(f"/alerts/{firing.pk}/").status_code == 403


def test_oncall_acknowledges_with_a_note_audited(oncall: object, firing: Alert) -> None:
    client = client_for(oncall)  # type: ignore[arg-type]
    response = client.post(f"/alerts/{firing.pk}/ack/", {"note": "rolling back the consumer"})
    assert response.status_code == 302
    firing.refresh_from_db()
    assert firing.acknowledged_by == oncall and firing.ack_note == "rolling back the consumer"
    event = AuditEvent.objects.get(action="alert.acknowledge")
    assert event.reason == "rolling back the consumer" and event.channel_slug == "orders"
    # A second ack keeps the first and writes nothing.
    client.post(f"/alerts/{firing.pk}/ack/", {"note": "again"})
    assert AuditEvent.objects.filter(action="alert.acknowledge").count() == 1


def test_oncall_silences_a_channel_rule_with_a_reason_audited(
    oncall: object, firing: Alert
) -> None:
    client = client_for(oncall)  # type: ignore[arg-type]
    refused = client.post(
        "/alerts/silences/", {"channel": "orders", "rule": "poisoned", "minutes": "60"}
    )
    assert refused.status_code == 302 and not Silence.objects.exists()
    client.post(
        "/alerts/silences/",
        {"channel": "orders", "rule": "poisoned", "minutes": "60", "reason": "consumer fix"},
    )
    silence = Silence.objects.get()
    assert silence.rule == "poisoned" and silence.channel is not None
    assert dt.timedelta(minutes=59) < silence.ends_at - silence.starts_at <= dt.timedelta(hours=1)
    event = AuditEvent.objects.get(action="alert.silence")
    assert event.reason == "consumer fix"
    do_evaluate_alerts(timezone.now())
    firing.refresh_from_db()
    assert firing.silence_id == silence.pk
    client.post(f"/alerts/silences/{silence.pk}/expire/")
    assert AuditEvent.objects.filter(action="alert.silence.expire").count() == 1


@pytest.mark.parametrize(
    ("minutes", "message"),
    [
        ("99999999999999999999", "Pick a duration."),
        ("soon", "Pick a duration."),
        ("0", "A silence lasts between 1 minute and 7 days."),
        ("10081", "A silence lasts between 1 minute and 7 days."),
    ],
)
def test_a_bad_silence_duration_is_a_message_not_an_error(
    oncall: object, minutes: str, message: str
) -> None:
    response = client_for(oncall).post(  # type: ignore[arg-type]
        "/alerts/silences/",
        {"rule": "poisoned", "minutes": minutes, "reason": "deploy"},
        follow=True,
    )
    assert response.status_code == 200 and not Silence.objects.exists()
    assert f"Not silenced: {message}" in response.content.decode()


def test_ending_a_missing_silence_is_404(oncall: object) -> None:
    response = client_for(oncall).post("/alerts/silences/999999/expire/")  # type: ignore[arg-type]
    assert response.status_code == 404
    assert not AuditEvent.objects.filter(action="alert.silence.expire").exists()


def test_viewer_cannot_silence(viewer: object, firing: Alert) -> None:
    response = client_for(viewer).post(  # type: ignore[arg-type]
        "/alerts/silences/", {"channel": "orders", "minutes": "60", "reason": "x"}
    )
    assert response.status_code == 403


def test_badge_counts_firing_alerts_and_polls(viewer: object, firing: Alert) -> None:
    client = client_for(viewer)  # type: ignore[arg-type]
    badge = client.get("/alerts/badge/?variant=nav").content.decode()
    assert (
        'hx-trigger="every 10s"' in badge
        and '<span class="alert-count is-firing">1</span>' in badge
    )
    board = client.get("/").content.decode()
    assert "1 firing alert" in board and 'id="alert-badge"' in board
    # Anonymous (an expired session): htmx is told to stop polling.
    from django.test import Client

    assert Client().get("/alerts/badge/").status_code == 286


def test_failed_notifications_show_on_the_list_and_the_alert(viewer: object, firing: Alert) -> None:
    Notification.objects.update(status="failed", attempts=8, last_error="ConnectError: refused")
    client = client_for(viewer)  # type: ignore[arg-type]
    assert "1 notification failed" in client.get("/alerts/").content.decode()
    Notification.objects.update(status="pending", attempts=2)
    assert "1 notification retrying" in client.get("/alerts/").content.decode()
    Notification.objects.update(status="failed")
    detail = client.get(f"/alerts/{firing.pk}/").content.decode()
    assert "ConnectError: refused" in detail and "Failed" in detail


def test_registry_admin_edits_destinations_with_write_only_secrets(registry_admin: object) -> None:
    client = client_for(registry_admin)  # type: ignore[arg-type]
    response = client.post(
        "/admin/alerts/destination/add/",
        {
            "name": "hook",
            "kind": "webhook",
            "url": "https://hooks.example.test/abc",
            "secret": "topsecret",
            "min_severity": "warning",
            "send_resolved": "on",
            "enabled": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    dest = Destination.objects.get()
    page = client.get(f"/admin/alerts/destination/{dest.pk}/change/").content.decode()
    assert "topsecret" not in page and "hooks.example.test/abc" not in page
    # Saving with blank secret fields keeps them.
    client.post(
        f"/admin/alerts/destination/{dest.pk}/change/",
        {"name": "hook", "kind": "webhook", "min_severity": "critical", "enabled": "on"},
    )
    dest.refresh_from_db()
    assert (dest.secret, dest.url, dest.min_severity) == (
        "topsecret",
        "https://hooks.example.test/abc",
        "critical",
    )
    assert AuditEvent.objects.filter(action__startswith="alert.destination").count() == 2
    assert "topsecret" not in str(AuditEvent.objects.values_list("after", flat=True))


def test_rule_override_inline_on_the_channel_form_is_audited_and_rechecked(
    registry_admin: object,
) -> None:
    channel = make_channel()
    client = client_for(registry_admin)  # type: ignore[arg-type]
    data = channel_post(
        channel.broker,
        **{
            "alert_overrides-TOTAL_FORMS": "1",
            "alert_overrides-0-rule": "dlq-depth",
            "alert_overrides-0-for_s": "",
        },
    )
    response = client.post(f"/admin/channels_registry/channel/{channel.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    override = RuleOverride.objects.get()
    assert override.rule == "dlq-depth" and override.enabled is False
    channel.refresh_from_db()
    assert "dlq-no-alert" in {f["code"] for f in channel.findings}
    event = AuditEvent.objects.get(action="registry.channel.alert_rules")
    assert event.after["dlq-depth"]["enabled"] is False


def test_alert_text_shows_the_value_at_firing_and_now(viewer: object) -> None:
    channel = make_channel(alert_lag_messages=150)
    now = timezone.now()
    for seconds in (0, 121):  # pending, then firing after the rule's 120 s
        set_health(channel, now + dt.timedelta(seconds=seconds), backlog=166)
        do_evaluate_alerts(now + dt.timedelta(seconds=seconds))
    alert = Alert.objects.get(rule="backlog")
    assert alert.state == "firing" and alert.fired_value == 166
    # The backlog keeps growing; the alert row is not rewritten while it stays firing.
    set_health(channel, now + dt.timedelta(seconds=136), backlog=352)
    do_evaluate_alerts(now + dt.timedelta(seconds=136))
    client = client_for(viewer)  # type: ignore[arg-type]
    for url in ("/alerts/", f"/alerts/{alert.pk}/"):
        html = client.get(url).content.decode()
        assert "backlog 166 ≥ 150" in html and "at firing 166 · now 352" in html, url


def test_inflow_poison_and_age_alerts_show_their_value_now(viewer: object) -> None:
    """Issue 26.2: every firing alert's value now, not only at firing (inflow and poison rows
    too): new letters in the rule's window, poison on the broker plus stored."""
    from tests.dlq.conftest import letter, store

    channel = make_channel(poison_address="orders.poison")
    now = timezone.now()
    set_health(channel, now, poison_depth=2, poison_unresolved=1)
    store(channel, *[letter() for _ in range(3)])
    store(channel, letter(b"\xff"), source="poison")
    common = {"broker": channel.broker, "channel": channel, "state": "firing",
              "started_at": now, "fired_at": now, "last_evaluated_at": now}  # fmt: skip
    for rule, fired in (("dlq-inflow", 1), ("poison-inflow", 1), ("poison-depth", 1)):
        Alert.objects.create(rule=rule, key=f"{rule}:c{channel.pk}", severity="critical",
                             summary=rule, value=fired, fired_value=fired, **common)  # fmt: skip
    html = client_for(viewer).get("/alerts/").content.decode()  # type: ignore[arg-type]
    assert html.count("at firing 1 · now 3") == 2  # 3 new dead letters; poison 2 + 1 stored
    assert "at firing 1 · now 1" in html  # 1 new poison message


def test_an_oldest_dead_letter_alert_shows_its_age_now(viewer: object) -> None:
    from tests.dlq.conftest import letter, store

    channel = make_channel()
    now = timezone.now()
    set_health(channel, now, dlq_depth=0)
    store(channel, letter(dead_lettered_at=now.timestamp() - 2 * 3600))
    Alert.objects.create(
        rule="dlq-age", key=f"dlq-age:c{channel.pk}", broker=channel.broker, channel=channel,
        state="firing", severity="warning", summary="oldest dead letter 1 h old", value=3600,
        fired_value=3600, started_at=now, fired_at=now, last_evaluated_at=now,
    )  # fmt: skip
    html = client_for(viewer).get("/alerts/").content.decode()  # type: ignore[arg-type]
    assert "at firing 60 min · now 2.0 h" in html
