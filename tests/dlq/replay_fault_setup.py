"""Run inside ``manage.py shell`` by test_replay_faults.py: a channel on a ``kind`` broker (at
``DLO_BROKER_FAULT_URL``) and N dead letters."""

from __future__ import annotations

import hashlib

from django.utils import timezone

from channels_registry.models import Broker, Channel
from dlq.models import DeadLetter


def _death(kind: str, queue: str, i: int) -> tuple[dict[str, object], dict[str, object]]:
    """(headers, properties) of a dead letter as each broker's ingest stores them, with the
    broker's death bookkeeping (which a replay must not carry) forged to name another queue."""
    if kind == "activemq":
        headers: dict[str, object] = {
            "Idempotency-Key": f"order-{i}",
            "dlqDeliveryFailureCause": "java.lang.Throwable: Delivery[7] exceeds policy",
            "originalExpiration": "0",
        }
        properties: dict[str, object] = {
            "message_id": f"ID:m-{i}",
            "original_destination": f"/queue/{queue}.evil",
            "persistent": True,
            "body_type": "text",
        }
        return headers, properties
    headers = {
        "Idempotency-Key": f"order-{i}",
        "x-death": [{"queue": queue, "count": 1}],
        "x-first-death-queue": f"{queue}.evil",
    }
    return headers, {"content_type": "application/json", "message_id": f"m-{i}"}


def setup(queue: str, count: int, kind: str = "rabbitmq") -> None:
    broker = Broker.objects.create(name="fault", kind=kind, url_env="DLO_BROKER_FAULT_URL")
    dlq = f"DLQ.{queue}" if kind == "activemq" else f"{queue}.dlq"
    channel = Channel.objects.create(
        broker=broker, name="Fault", slug="fault", address=queue, dlq_address=dlq,
        semantic="at-least-once", idempotency_source="header", idempotency_key="Idempotency-Key",
    )  # fmt: skip
    now = timezone.now()
    rows = []
    for i in range(count):
        body = b'{"order": %d}' % i
        headers, properties = _death(kind, queue, i)
        rows.append(
            DeadLetter(
                channel=channel,
                dedupe_key=f"fault:{i}",
                body=body,
                body_sha256=hashlib.sha256(body).hexdigest(),
                size=len(body),
                headers=headers,
                properties=properties,
                dead_lettered_at=now,
                ingested_at=now,
                idempotency_key=f"order-{i}",
            )
        )
    DeadLetter.objects.bulk_create(rows, batch_size=1000)
