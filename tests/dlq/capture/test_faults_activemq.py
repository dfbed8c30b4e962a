"""Ingest under kill -9 on ActiveMQ Classic: the cases of ``test_faults.py`` (RabbitMQ), run on
an ActiveMQ DLQ (a kill -9 at a random point, a crash between commit and ack, the database lost
mid-drain).

10,000 dead letters (distinct bodies, a tenth binary) wait in a ``DLQ.<queue>``; the ingester
runs as a subprocess (``manage.py ingest --once``) on its own PostgreSQL database and is killed
for real. Afterwards a run to completion must leave exactly 10,000 distinct, byte-identical
entries and an empty DLQ: client-individual acks are sent only after the commit, and a message
whose ack never arrived is redelivered with the same JMS message id (the same dedupe key).
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from brokers.activemq import ActiveMQAdapter
from brokers.base import Address, OutgoingMessage
from tests.dlq.capture.test_faults import (
    COUNT,
    _pg,
    crash_after_commit_case,
    database_lost_case,
    drop_fault_database,
    fault_database,
    kill_9_case,
)

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(600)]

URL = "stomp://127.0.0.1:61613"
ADAPTER = ActiveMQAdapter(URL, timeout=10.0)


def _depth(queue: str) -> int:
    return ADAPTER.poll([Address(queue)]).stats[Address(queue)].retained or 0


def _wait_depth(queue: str, wanted: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    depth = _depth(queue)
    while depth != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        depth = _depth(queue)
    return depth


def _publish(queue: str) -> set[str]:
    rng = random.Random(28)
    messages, hashes = [], set()
    for i in range(COUNT):
        if i % 10 == 0:
            body = rng.randbytes(64) + i.to_bytes(4, "big")
        else:
            body = b'{"order": %d, "pad": "%s"}' % (i, rng.randbytes(8).hex().encode())
        hashes.add(hashlib.sha256(body).hexdigest())
        headers = {"x-exception-class": "OrderNotFound" if i % 2 else "Timeout", "n": str(i)}
        messages.append(OutgoingMessage(str(i), body, headers, {"body_type": "bytes"}))
    with ADAPTER.publisher(Address(queue)) as publisher:
        for start in range(0, COUNT, 1000):
            outcomes = publisher.publish(messages[start : start + 1000])
            assert all(o.confirmed for o in outcomes)
    assert _wait_depth(queue, COUNT) == COUNT
    return hashes


@pytest.fixture
def fault_env() -> Iterator[dict[str, Any]]:
    from tests.conftest import broker_required

    try:
        ADAPTER.ping()
        _pg().close()
    except Exception as exc:  # noqa: BLE001 - any connection failure means "not reachable"
        broker_required("ActiveMQ/PostgreSQL", exc)
    queue = f"DLQ.activemq.fault.{uuid.uuid4().hex[:8]}"
    fault = fault_database("activemq", URL, "activemq.fault", queue)
    fault["expected"] = _publish(queue)
    yield fault
    with ADAPTER.drain(Address(queue)) as session:  # leave nothing behind (bounded)
        for _ in range(COUNT // 100):
            batch = session.fetch(500, wait_s=1.0)
            if not batch:
                break
            session.ack(batch)
    drop_fault_database(fault["db"])


def test_activemq_kill_9_at_a_random_point_loses_and_duplicates_nothing(
    fault_env: dict[str, Any],
) -> None:
    kill_9_case(fault_env, _wait_depth)


def test_activemq_crash_between_commit_and_ack_is_deduplicated(fault_env: dict[str, Any]) -> None:
    crash_after_commit_case(fault_env, _wait_depth)


def test_activemq_database_lost_mid_drain_acks_nothing_uncommitted(
    fault_env: dict[str, Any],
) -> None:
    database_lost_case(fault_env, _wait_depth)
