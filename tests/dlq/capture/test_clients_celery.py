"""Issue 14, items 11 and 12: a Celery dead letter as Celery writes it.

A real Celery worker (in a thread, ``solo`` pool) consumes a quorum queue whose dead-letter
exchange routes to a DLQ, the way Celery's documentation sets up dead-lettering: ``acks_late``
tasks that ``self.retry()`` while they hope, then raise ``Reject(requeue=False)``. The dashboard
recognises the Celery protocol 2 job (task name, id, retries, args as Celery shows them),
groups failures per task, counts the deliveries Celery made (x-death only says "1"), and a
replay is consumed by the same worker with its headers intact.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from celery import Celery
from celery import _state as celery_state
from celery.contrib.testing.worker import start_worker
from celery.exceptions import Reject
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from kombu import Queue

from channels_registry.models import BrokerKind
from dlq.capture import ingest
from dlq.models import DeadLetter, FailureGroup, PlanStatus
from dlq.plans import relay
from tests.conftest import broker_required, make_broker, make_channel
from tests.dlq.replay_helpers import plan_for

pytestmark = [pytest.mark.broker, pytest.mark.django_db, pytest.mark.timeout(180)]

AMQP_URL = os.environ.get("DLO_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
RETRIES = 3


def _wait(condition: Callable[[], bool], what: str, attempts: int = 120) -> None:
    """Poll a bounded number of times (the worker runs in another thread)."""
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.25)
    raise AssertionError(f"gave up waiting for {what}")


@pytest.fixture(autouse=True)
def project_app_stays_current() -> Iterator[None]:
    """A worker makes its app the process's current and default one (Celery's worker set-up),
    so that afterwards the project's shared tasks (``.delay()``) would go to this test's
    broker instead of running eagerly in later tests of the same process. Put them back."""
    default, current = celery_state.default_app, celery_state.get_current_app()
    yield
    celery_state.set_default_app(default)
    celery_state._set_current_app(current)


@pytest.fixture
def queues() -> Iterator[tuple[str, str]]:
    try:
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    except Exception as exc:
        broker_required("RabbitMQ", exc)
    token = uuid.uuid4().hex[:10]
    work, dlq = f"celery-work-{token}", f"celery-work-{token}.dlq"
    channel = connection.channel()
    channel.queue_declare(dlq, durable=True)
    yield work, dlq
    for name in (work, dlq):
        with contextlib.suppress(Exception):
            channel.queue_delete(name)
    connection.close()


def _depth(queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def _celery_app(work: str, dlq: str, seen: dict[str, Any]) -> Celery:
    # fixups=[]: Celery's Django fixup would close the test's database connection when the
    # in-thread worker starts (a real worker is its own process).
    app = Celery(
        f"dlo-test-{work}", broker=AMQP_URL.replace("%2F", "/"), fixups=[], set_as_current=False
    )
    app.conf.update(
        task_default_queue=work,
        task_queues=[
            Queue(
                work,
                routing_key=work,
                queue_arguments={
                    "x-queue-type": "quorum",
                    "x-dead-letter-exchange": "",
                    "x-dead-letter-routing-key": dlq,
                },
            )
        ],
        task_acks_late=True,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=1,
    )
    lock = threading.Lock()

    def attempt(key: str) -> int:
        with lock:
            seen[key] = seen.get(key, 0) + 1
            return int(seen[key])

    @app.task(bind=True, name="billing.charge_card", acks_late=True)
    def charge_card(self: Any, order_id: str, amount: float) -> str:
        attempt(self.request.id)
        if seen.get("fixed"):
            seen.setdefault("done", []).append((self.request.id, order_id, amount))
            return "charged"
        # Retry while the gateway may recover, then give up: dead-letter, never retry forever.
        if self.request.retries < RETRIES:
            raise self.retry(countdown=0, max_retries=RETRIES)
        raise Reject("gateway down", requeue=False)

    @app.task(bind=True, name="billing.refund", acks_late=True)
    def refund(self: Any, order_id: str) -> str:
        raise Reject("refund window closed", requeue=False)

    return app


def test_celery_dead_letters_are_job_aware_and_replay_to_the_worker(
    queues: tuple[str, str], oncall: User, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, dlq = queues
    seen: dict[str, Any] = {}
    app = _celery_app(work, dlq, seen)
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
        charge = app.tasks["billing.charge_card"].apply_async(("ord-9", 12.5), queue=work)
        app.tasks["billing.refund"].apply_async(("ord-10",), queue=work)
        _wait(lambda: _depth(dlq) == 2, "both tasks to be dead-lettered")

    monkeypatch.setenv("DLO_BROKER_TEST_CELERY_RABBIT", AMQP_URL)
    broker = make_broker(
        name="rabbit", kind=BrokerKind.RABBITMQ, url_env="DLO_BROKER_TEST_CELERY_RABBIT"
    )
    channel = make_channel(
        broker,
        address=work,
        dlq_address=dlq,
        poison_address="",
        idempotency_source="header",
        idempotency_key="id",  # Celery's task id: one per message, kept by a replay
    )
    assert ingest.ingest_channel(channel).inserted == 2

    entry = DeadLetter.objects.get(channel=channel, message_type="billing.charge_card")
    assert entry.idempotency_key == charge.id
    assert entry.job["kind"] == "celery" and entry.job["id"] == charge.id
    assert entry.job["argsrepr"] == "('ord-9', 12.5)"
    # x-death says 1 death; Celery delivered the job 4 times (3 retries).
    assert entry.death_history and entry.death_history[0]["count"] == 1
    assert seen[charge.id] == RETRIES + 1
    assert entry.job["retries"] == RETRIES
    assert entry.redelivery_count == RETRIES
    # One failure group per task, not one for the whole channel.
    types = set(FailureGroup.objects.filter(channel=channel).values_list("message_type", flat=True))
    assert types == {"billing.charge_card", "billing.refund"}

    client.force_login(oncall)
    url = reverse("dlq:entry_list")
    listing = client.get(url, {"channel": channel.slug, "type": "billing.refund"})
    assert [e.message_type for e in listing.context["page"].rows] == ["billing.refund"]
    assert "<code>billing.refund</code>" in listing.content.decode()  # the Type column
    detail = client.get(entry.get_absolute_url()).content.decode()
    assert "Celery job" in detail and "(&#x27;ord-9&#x27;, 12.5)" in detail

    seen["fixed"] = True  # the gateway is back
    plan = plan_for([entry], oncall)
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
        _wait(lambda: bool(seen.get("done")), "the worker to run the replayed task")
    # Same task id, same arguments: the worker saw the job exactly as Celery wrote it.
    assert seen["done"] == [(charge.id, "ord-9", 12.5)]


def test_quorum_delivery_limit_death_counts_the_deliveries_not_one(
    queues: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain pika consumer nacks with requeue until the quorum queue's delivery-limit
    dead-letters the message. RabbitMQ drops x-delivery-count on the dead letter and x-death
    says count 1; the entry counts the limit's redeliveries (the limit read from the broker)."""
    from channels_registry.actions import do_poll_broker

    work, dlq = queues
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.queue_declare(
        work,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-delivery-limit": 3,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dlq,
        },
    )
    channel.basic_publish(
        "", work, b'{"order_id": "o-1"}', pika.BasicProperties(headers={"Idempotency-Key": "k-1"})
    )
    for _ in range(40):  # bounded: 4 deliveries are needed
        method, _props, _body = channel.basic_get(work)
        if method is None:
            if _depth(dlq) == 1:
                break
            time.sleep(0.25)
            continue
        channel.basic_nack(method.delivery_tag, requeue=True)
    connection.close()
    assert _depth(dlq) == 1

    monkeypatch.setenv("DLO_BROKER_TEST_CELERY_RABBIT", AMQP_URL)
    broker = make_broker(
        name="rabbit",
        kind=BrokerKind.RABBITMQ,
        url_env="DLO_BROKER_TEST_CELERY_RABBIT",
        management_url="http://127.0.0.1:15672",
    )
    declared = make_channel(broker, address=work, dlq_address=dlq, poison_address="")
    do_poll_broker(broker.pk)  # reads the queue's delivery-limit (3)
    assert ingest.ingest_channel(declared).inserted == 1
    entry = DeadLetter.objects.get(channel=declared)
    assert entry.death_history[0]["count"] == 1
    assert entry.death_history[0]["reason"] == "delivery_limit"
    assert entry.redelivery_count == 3
