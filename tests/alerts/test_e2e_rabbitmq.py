"""End to end on a real RabbitMQ queue: dead letters arrive → poll and ingest → the DLQ depth
alert fires → the loopback receiver gets exactly one signed notification → the dead letters are
discarded → the alert resolves → exactly one resolve notification. A second destination that is
down retries with backoff, then fails visibly, and nothing is sent twice."""

from __future__ import annotations

import contextlib
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from django.core.management import call_command
from django.utils import timezone

from alerts import notify
from alerts.evaluate import do_evaluate_alerts
from alerts.models import Alert, AlertState, Notification, NotificationStatus
from alerts.notify import do_deliver_notifications
from dlq.models import DeadLetter, Status
from tests.alerts.conftest import SECRET, Receiver, closed_port_url, webhook
from tests.conftest import broker_required, client_for, make_broker, make_channel, make_user

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

pytestmark = [pytest.mark.broker, pytest.mark.django_db]


@pytest.fixture
def queues() -> Iterator[tuple[Any, str, str]]:
    try:
        connection = pika.BlockingConnection(pika.URLParameters(RABBIT_URL))
    except Exception as exc:
        broker_required("RabbitMQ", exc)
    channel = connection.channel()
    main = f"dlo-alert-{uuid.uuid4().hex[:10]}"
    dlq = f"{main}.dlq"
    channel.queue_declare(dlq, arguments={"x-queue-type": "classic"})
    channel.queue_declare(
        main,
        arguments={
            "x-queue-type": "classic",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    yield channel, main, dlq
    for name in (main, dlq):
        with contextlib.suppress(Exception):
            channel.queue_delete(name)
    connection.close()


def dead_letter(channel: Any, queue: str, count: int) -> None:
    """Publish ``count`` messages and reject them: the broker dead-letters them."""
    channel.confirm_delivery()
    for i in range(count):
        channel.basic_publish(
            "",
            queue,
            b'{"order": {"id": %d}}' % i,
            pika.BasicProperties(
                delivery_mode=2,
                content_type="application/json",
                message_id=f"m-{i}",
                headers={"Idempotency-Key": f"k-{i}"},
            ),
        )
    for _ in range(count):
        method, _props, _body = channel.basic_get(queue)
        assert method is not None
        channel.basic_reject(method.delivery_tag, requeue=False)


def test_dead_letters_page_once_resolve_once_and_a_down_receiver_fails_visibly(
    queues: tuple[Any, str, str],
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    amqp, main, dlq = queues
    settings.DLO_ALERT_GROUP_WAIT_S = 0  # send right after the evaluation commits
    monkeypatch.setenv("DLO_BROKER_TEST_RABBIT_URL", RABBIT_URL)
    broker = make_broker(name="rabbit", url_env="DLO_BROKER_TEST_RABBIT_URL")
    channel = make_channel(
        broker,
        address=main,
        dlq_address=dlq,
        poison_address="",
        dlq_strategies=["ttl-with-backoff", "dlq-alert"],
        alert_dlq_depth=0,
    )
    up = webhook(receiver.url)
    down = webhook(closed_port_url(), name="down-hook")

    # 1. Dead letters arrive; a poll sees them on the broker, ingest moves them to the store.
    dead_letter(amqp, main, 3)
    call_command("poll", "--once")
    call_command("ingest", "--once")
    assert DeadLetter.objects.filter(channel=channel).count() == 3
    with django_capture_on_commit_callbacks(execute=True) as kicked:
        do_evaluate_alerts()  # after commit it kicks the delivery task (eager here)
    assert len(kicked) == 1
    alert = Alert.objects.get(rule="dlq-depth")
    assert alert.state == AlertState.FIRING and alert.value == 3
    assert Alert.objects.filter(state=AlertState.FIRING).count() == 1

    # 2. Exactly one signed notification at the receiver that is up.
    assert len(receiver.requests) == 1
    headers, body = receiver.requests[0]
    assert notify.verify_signature(SECRET, body, headers["X-DLO-Signature"])
    (payload,) = receiver.bodies()
    assert payload["status"] == "firing" and payload["broker"] == "rabbit"
    (entry,) = payload["alerts"]
    assert (entry["rule"], entry["channel"], entry["value"]) == ("dlq-depth", "orders", 3)
    assert entry["evidence"][0] == "DLQ depth 3 > 0"
    # The next evaluations and deliveries send nothing more.
    call_command("poll", "--once")
    do_evaluate_alerts()
    do_deliver_notifications()
    assert len(receiver.requests) == 1

    # 3. The down destination retried with backoff.
    failing = Notification.objects.get(destination=down, transition="firing")
    assert failing.status == NotificationStatus.PENDING and failing.attempts == 1
    assert "ConnectError" in failing.last_error
    assert failing.next_attempt_at > timezone.now()

    # 4. Drain: on-call discards the dead letters; the next poll and evaluation resolve.
    call_command("discard", "--channel", "orders", "--reason", "fixed upstream", "--yes")
    assert (
        not DeadLetter.objects.filter(channel=channel)
        .exclude(state__status=Status.DISCARDED)
        .exists()
    )
    call_command("poll", "--once")
    with django_capture_on_commit_callbacks(execute=True):
        do_evaluate_alerts()
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED
    assert len(receiver.requests) == 2
    resolved = receiver.bodies()[1]
    assert resolved["status"] == "resolved"
    assert [a["transition"] for a in resolved["alerts"]] == ["resolved"]
    assert resolved["alerts"][0]["alert_id"] == alert.pk
    assert notify.verify_signature(
        SECRET, receiver.requests[1][1], receiver.requests[1][0]["X-DLO-Signature"]
    )
    do_evaluate_alerts()
    do_deliver_notifications()
    assert len(receiver.requests) == 2
    assert Notification.objects.filter(destination=up, status="sent").count() == 2

    # 5. The down destination spends its retry budget, then the failure is visible.
    now = timezone.now()
    for _ in range(2 * notify.MAX_ATTEMPTS):
        due = Notification.objects.filter(destination=down, status="pending")
        if not due.exists():
            break
        now = max(n.next_attempt_at for n in due) + dt.timedelta(seconds=1)
        do_deliver_notifications(now)
    rows = Notification.objects.filter(destination=down)
    assert {(n.transition, n.status) for n in rows} == {
        ("firing", "failed"),
        ("resolved", "failed"),
    }
    assert all(n.attempts <= notify.MAX_ATTEMPTS for n in rows)
    page = client_for(make_user("vic", "viewer")).get(f"/alerts/{alert.pk}/").content.decode()
    assert "down-hook" in page and "ConnectError" in page and "Failed" in page
    # Nothing was sent twice to the receiver that was up.
    assert len(receiver.requests) == 2
