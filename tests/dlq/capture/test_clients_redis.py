"""Issue 14, item 10: Redis Streams entries as a plain redis-py client writes them.

The producer XADDs a field map (no ``body`` field); the worker reads through its consumer
group and fails; a reaper, written the way redis-py's documentation shows XAUTOCLAIM, claims
entries idle past the ack timeout and, past the retry budget, XADDs the original fields plus
its error fields to the DLQ stream and XACKs the original. The dashboard ingests the entry as
the message (JSON of the fields, idempotency key read from it), and a replay writes exactly the
original fields back, which the worker then consumes.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client

from channels_registry.models import BrokerKind
from dlq.capture import ingest
from dlq.models import DeadLetter, PlanStatus, ReplayItem
from dlq.plans import relay
from tests.conftest import broker_required, make_broker, make_channel
from tests.dlq.replay_helpers import plan_for

pytestmark = [pytest.mark.broker, pytest.mark.django_db, pytest.mark.timeout(120)]

REDIS_URL = os.environ.get("DLO_TEST_LAYER_REDIS_URL", "redis://127.0.0.1:6379/0")
GROUP, BUDGET = "workers", 3


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        broker_required("Redis", exc)
    stream = f"orders-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("DLO_BROKER_TEST_CLIENTS_REDIS", REDIS_URL)
    yield client, stream
    client.delete(stream, f"{stream}:dlq", f"{stream}:poison")
    client.close()


def _reap(client: redis.Redis, stream: str) -> int:
    """The usual reaper: XAUTOCLAIM what a crashed or failing worker left pending, and
    dead-letter it once its delivery count is past the budget. Returns letters written."""
    dead = 0
    _cursor, claimed, _deleted = client.xautoclaim(
        stream, GROUP, "reaper", min_idle_time=0, start_id="0-0", count=100
    )
    for entry_id, fields in claimed:
        pending = client.xpending_range(stream, GROUP, min=entry_id, max=entry_id, count=1)
        if pending and pending[0]["times_delivered"] > BUDGET:
            letter = {
                **fields,
                "reason": "retry-budget-exhausted",
                "x-error-class": "PaymentGatewayTimeout",
                "x-error-message": f"gateway timed out after {BUDGET} attempts",
                "x-error-delivery-count": str(pending[0]["times_delivered"]),
            }
            pipe = client.pipeline()
            pipe.xadd(f"{stream}:dlq", letter)
            pipe.xack(stream, GROUP, entry_id)
            pipe.execute()
            dead += 1
    return dead


def test_field_map_entry_is_the_message_and_replays_exactly_its_fields(
    streams: tuple[redis.Redis, str], oncall: User, client: Client
) -> None:
    r, stream = streams
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    original = {"order_id": "ord-42", "customer": "c-7", "amount": "19.90"}
    r.xadd(stream, original)
    # The worker keeps failing (it never acks); each XAUTOCLAIM/XCLAIM is another delivery.
    r.xreadgroup(GROUP, "worker-1", {stream: ">"}, count=10)
    for _ in range(BUDGET):
        r.xautoclaim(stream, GROUP, "worker-1", min_idle_time=0, start_id="0-0", count=10)
    assert _reap(r, stream) == 1

    broker = make_broker(
        name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_CLIENTS_REDIS"
    )
    channel = make_channel(
        broker,
        address=stream,
        address_group=GROUP,
        dlq_address=f"{stream}:dlq",
        poison_address=f"{stream}:poison",
        entry_layout="field-map",
        idempotency_source="json-path",
        idempotency_key="$.order_id",
        redact_json_paths=[],
    )
    assert ingest.ingest_channel(channel).inserted == 1

    entry = DeadLetter.objects.get(channel=channel)
    assert entry.body is not None
    assert json.loads(bytes(entry.body)) == original  # the fields are the message
    assert entry.idempotency_key == "ord-42" and not entry.missing_idempotency_key
    assert entry.reason == "retry-budget-exhausted"
    assert entry.error_class == "PaymentGatewayTimeout"
    # read once, claimed three times by the worker and once by the reaper
    assert entry.redelivery_count == BUDGET + 2 == int(entry.headers["x-error-delivery-count"])
    assert set(entry.headers) == {
        "reason",
        "x-error-class",
        "x-error-message",
        "x-error-delivery-count",
    }
    client.force_login(oncall)
    page = client.get(entry.get_absolute_url()).content.decode()
    assert "ord-42" in page and "missing" not in page.split("Idempotency key")[1][:200]

    plan = plan_for([entry], oncall)
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    # The original worker consumes the replay: exactly its fields, no body, no error fields.
    got = r.xreadgroup(GROUP, "worker-1", {stream: ">"}, count=10)
    assert len(got[0][1]) == 1
    _id, fields = got[0][1][0]
    replay_id = ReplayItem.objects.get(plan=plan).replay_id
    assert fields == {**original, "x-dlq-replay-id": replay_id}


def test_body_field_layout_keeps_the_dashboards_convention(
    streams: tuple[redis.Redis, str], oncall: User
) -> None:
    r, stream = streams
    r.xadd(f"{stream}:dlq", {"payload": '{"order_id": "o-1"}', "reason": "boom"})
    broker = make_broker(
        name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_CLIENTS_REDIS"
    )
    channel = make_channel(
        broker,
        address=stream,
        address_group=GROUP,
        dlq_address=f"{stream}:dlq",
        poison_address="",
        entry_body_field="payload",
        idempotency_source="json-path",
        idempotency_key="$.order_id",
    )
    assert ingest.ingest_channel(channel).inserted == 1
    entry = DeadLetter.objects.get(channel=channel)
    assert bytes(entry.body or b"") == b'{"order_id": "o-1"}'
    assert entry.idempotency_key == "o-1" and entry.headers == {"reason": "boom"}
    plan = plan_for([entry], oncall)
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    (_id, fields), *_ = r.xrange(stream)
    assert fields["payload"] == '{"order_id": "o-1"}' and "body" not in fields
