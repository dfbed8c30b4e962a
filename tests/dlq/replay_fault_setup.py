"""Run inside ``manage.py shell`` by test_replay_faults.py: a channel and N dead letters."""

from __future__ import annotations

import hashlib

from django.utils import timezone

from channels_registry.models import Broker, Channel
from dlq.models import DeadLetter


def setup(queue: str, count: int) -> None:
    broker = Broker.objects.create(
        name="fault", kind="rabbitmq", url_env="DLO_BROKER_FAULT_RABBIT_URL"
    )
    channel = Channel.objects.create(
        broker=broker, name="Fault", slug="fault", address=queue, dlq_address=f"{queue}.dlq",
        semantic="at-least-once", idempotency_source="header", idempotency_key="Idempotency-Key",
    )  # fmt: skip
    now = timezone.now()
    rows = []
    for i in range(count):
        body = b'{"order": %d}' % i
        rows.append(
            DeadLetter(
                channel=channel,
                dedupe_key=f"fault:{i}",
                body=body,
                body_sha256=hashlib.sha256(body).hexdigest(),
                size=len(body),
                headers={
                    "Idempotency-Key": f"order-{i}",
                    "x-death": [{"queue": queue, "count": 1}],
                    "x-first-death-queue": f"{queue}.evil",
                },
                properties={"content_type": "application/json", "message_id": f"m-{i}"},
                dead_lettered_at=now,
                ingested_at=now,
                idempotency_key=f"order-{i}",
            )
        )
    DeadLetter.objects.bulk_create(rows, batch_size=1000)
