"""Ingest under kill -9 on ActiveMQ Classic (the RabbitMQ version: ``test_faults.py``).

10,000 dead letters (distinct bodies, a tenth binary) wait in a ``DLQ.<queue>``; the ingester
runs as a subprocess (``manage.py ingest --once``) on its own PostgreSQL database and is killed
for real. Afterwards a run to completion must leave exactly 10,000 distinct, byte-identical
entries and an empty DLQ: client-individual acks are sent only after the commit, and a message
whose ack never arrived is redelivered with the same JMS message id (the same dedupe key).
"""

from __future__ import annotations

import hashlib
import random
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from brokers.activemq import ActiveMQAdapter
from brokers.base import Address, OutgoingMessage
from tests.dlq.test_faults import (
    COUNT,
    _pg,
    _rows,
    _run_to_completion,
    _wait_rows,
    assert_complete,
    drop_fault_database,
    fault_database,
    ingest_process,
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
    proc = ingest_process(fault_env)
    _wait_rows(fault_env["db"], proc, random.randint(1, 5000))
    time.sleep(random.uniform(0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the ingester finished before the kill"
    killed_at = _rows(fault_env["db"])
    assert 0 < killed_at < COUNT
    # Everything not acknowledged is back on the broker (at least what was not committed).
    assert _wait_depth(fault_env["queue"], -1, timeout=2) >= COUNT - killed_at
    _run_to_completion(fault_env)
    assert_complete(fault_env, _wait_depth)


def test_activemq_crash_between_commit_and_ack_is_deduplicated(fault_env: dict[str, Any]) -> None:
    proc = ingest_process(fault_env, DLO_TEST_CRASH_AFTER_COMMIT="1")
    proc.wait(timeout=120)
    assert proc.returncode == 137
    committed = _rows(fault_env["db"])
    assert 0 < committed <= 500  # one batch committed ...
    assert _wait_depth(fault_env["queue"], COUNT) == COUNT  # ... and none acknowledged
    out = _run_to_completion(fault_env)
    assert f"{COUNT} fetched, {COUNT - committed} new, {committed} duplicates" in out
    assert_complete(fault_env, _wait_depth)
