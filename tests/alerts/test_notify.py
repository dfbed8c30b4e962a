"""Delivery: signed JSON webhooks to a loopback receiver, grouping per broker, retries with
backoff and a budget, permanent failures, Slack and email formats, lease recovery."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import random

import pytest
from django.core import mail
from django.core.exceptions import ValidationError

from alerts import notify
from alerts.evaluate import do_evaluate_alerts
from alerts.models import (
    DeliveryAttempt,
    Destination,
    DestinationKind,
    Notification,
    NotificationStatus,
)
from alerts.notify import do_deliver_notifications
from tests.alerts.conftest import SECRET, Receiver, closed_port_url, set_health, webhook
from tests.conftest import make_broker, make_channel

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def stopped_channels(n: int, broker_name: str = "main-rabbit") -> None:
    broker = make_broker(name=broker_name)
    for i in range(n):
        c = make_channel(
            broker, name=f"{broker_name}-{i}", slug=f"{broker_name}-{i}", address=f"q{i}"
        )
        # POISONED fires at once (for 0).
        set_health(c, at(0), state="poisoned", evidence=["9 redeliveries in 1 min"])


def test_one_signed_message_per_broker_group(receiver: Receiver) -> None:
    stopped_channels(3, "rabbit-a")
    stopped_channels(2, "rabbit-b")
    webhook(receiver.url)
    do_evaluate_alerts(at(0))
    assert Notification.objects.count() == 5
    # Inside the grouping wait nothing is sent; after it, one message per broker.
    assert do_deliver_notifications(at(10)).messages == 0
    result = do_deliver_notifications(at(31))
    assert (result.messages, result.sent) == (2, 5)
    assert len(receiver.requests) == 2
    for headers, body in receiver.requests:
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert headers["X-DLO-Signature"] == expected
        assert notify.verify_signature(SECRET, body, headers["X-DLO-Signature"])
    payloads = sorted(receiver.bodies(), key=lambda p: p["broker"])
    assert [p["broker"] for p in payloads] == ["rabbit-a", "rabbit-b"]
    assert [len(p["alerts"]) for p in payloads] == [3, 2]
    first = payloads[0]["alerts"][0]
    assert first["rule"] == "poisoned" and first["transition"] == "firing"
    assert first["evidence"] == ["channel poisoned", "9 redeliveries in 1 min"]
    assert first["dedupe_key"] == f"{first['alert_id']}:firing"
    assert {p["delivery_id"] for p in payloads} == {
        h["X-DLO-Delivery"] for h, _ in receiver.requests
    }
    # Nothing is sent twice.
    assert do_deliver_notifications(at(3600)).messages == 0
    assert len(receiver.requests) == 2
    assert set(Notification.objects.values_list("status", flat=True)) == {"sent"}


def test_server_error_retries_with_backoff_then_sends_once(receiver: Receiver) -> None:
    stopped_channels(1)
    webhook(receiver.url)
    do_evaluate_alerts(at(0))
    receiver.status = 503
    result = do_deliver_notifications(at(30))
    assert (result.messages, result.retrying) == (1, 1)
    n = Notification.objects.get()
    assert (n.status, n.attempts, n.last_error) == ("pending", 1, "HTTP 503")
    delay = (n.next_attempt_at - at(30)).total_seconds()
    assert 5 <= delay <= 10
    # Not due yet: no call.
    assert do_deliver_notifications(at(30 + delay / 2)).messages == 0
    receiver.status = 200
    assert do_deliver_notifications(n.next_attempt_at).sent == 1
    assert len(receiver.requests) == 2  # the failed attempt and the one that worked
    assert do_deliver_notifications(at(10_000)).messages == 0
    n.refresh_from_db()
    assert (n.status, n.attempts) == ("sent", 2)
    assert list(DeliveryAttempt.objects.order_by("id").values_list("ok", flat=True)) == [
        False,
        True,
    ]


def test_receiver_down_spends_the_retry_budget_then_fails_visibly(loopback_webhooks: None) -> None:
    stopped_channels(1)
    webhook(closed_port_url())
    do_evaluate_alerts(at(0))
    now = at(30)
    delays = []
    for _ in range(notify.MAX_ATTEMPTS):
        result = do_deliver_notifications(now)
        assert result.messages == 1
        n = Notification.objects.get()
        if n.status == NotificationStatus.FAILED:
            break
        delays.append((n.next_attempt_at - now).total_seconds())
        now = n.next_attempt_at
    n = Notification.objects.get()
    assert n.status == "failed" and n.attempts == notify.MAX_ATTEMPTS
    assert "ConnectError" in n.last_error
    # Capped exponential backoff with jitter: each ceiling doubles up to the cap.
    ceilings = [min(notify.BACKOFF_CAP_S, 10 * 2**i) for i in range(len(delays))]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert do_deliver_notifications(now + dt.timedelta(days=1)).messages == 0


def test_client_error_is_permanent(receiver: Receiver) -> None:
    stopped_channels(1)
    webhook(receiver.url)
    do_evaluate_alerts(at(0))
    receiver.status = 404
    do_deliver_notifications(at(30))
    n = Notification.objects.get()
    assert (n.status, n.attempts, n.last_error) == ("failed", 1, "HTTP 404")


def test_an_abandoned_send_is_recovered_after_its_lease(receiver: Receiver) -> None:
    stopped_channels(1)
    webhook(receiver.url)
    do_evaluate_alerts(at(0))
    # A worker claimed the row and died before sending.
    Notification.objects.update(status="sending", batch="dead", lease_until=at(60))
    assert do_deliver_notifications(at(45)).messages == 0
    assert do_deliver_notifications(at(61)).sent == 1
    assert len(receiver.requests) == 1


def test_slack_format(receiver: Receiver) -> None:
    stopped_channels(2)
    webhook(receiver.url, kind=DestinationKind.SLACK, secret="")
    do_evaluate_alerts(at(0))
    do_deliver_notifications(at(31))
    (payload,) = receiver.bodies()
    assert set(payload) == {"text"}
    assert payload["text"].startswith("*Dead Letter Office · main-rabbit: 2 firing*")
    assert "[FIRING] critical Poisoned · main-rabbit-0: channel poisoned" in payload["text"]
    assert "X-DLO-Signature" not in receiver.requests[0][0]


def test_email_goes_through_the_django_backend() -> None:
    stopped_channels(2)
    webhook("", name="mail", kind=DestinationKind.EMAIL, email_to="oncall@example.test", secret="")
    do_evaluate_alerts(at(0))
    assert do_deliver_notifications(at(31)).sent == 2
    (message,) = mail.outbox
    assert message.to == ["oncall@example.test"]
    assert message.subject == "Dead Letter Office · main-rabbit: 2 firing"
    assert "9 redeliveries in 1 min" in message.body


def test_backoff_is_capped_and_jittered() -> None:
    rng = random.Random(7)
    values = [notify.backoff_s(n, rng) for n in range(1, 12)]
    assert 5 <= values[0] <= 10
    assert max(values) <= notify.BACKOFF_CAP_S
    assert values[-1] >= notify.BACKOFF_CAP_S / 2


@pytest.mark.parametrize(
    "url", ["http://[::1", "https://hooks.example:0x/", "http://a\x00b/", "ftp://h/", "http:///x"]
)
def test_a_malformed_webhook_url_is_refused_with_a_message(url: str) -> None:
    dest = Destination(name="bad", kind=DestinationKind.WEBHOOK, url=url, secret=SECRET)
    with pytest.raises(ValidationError) as refused:
        dest.full_clean()
    assert refused.value.message_dict["url"] == [
        "Give an http:// or https:// URL with a host (and a valid port)."
    ]
    assert dest.target_display == "invalid URL"


def test_a_stored_malformed_url_fails_the_notification_at_once() -> None:
    stopped_channels(1)
    dest = webhook("http://127.0.0.1:9/hook")
    Destination.objects.filter(pk=dest.pk).update(url="http://[::1")  # saved before validation
    do_evaluate_alerts(at(0))
    result = do_deliver_notifications(at(30))
    n = Notification.objects.get()
    assert result.failed == 1 and n.status == "failed" and n.attempts == 1
    assert n.last_error.startswith("invalid URL:")
