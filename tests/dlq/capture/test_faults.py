"""Ingest under faults, against the real RabbitMQ and PostgreSQL on loopback.

The ingester runs as a subprocess (``manage.py ingest --once``) on its own PostgreSQL database,
so it can be killed for real. Each test publishes 10,000 dead letters (distinct bodies, some
binary, x-death headers) straight into a DLQ queue, injects one fault, re-runs the ingester to
completion and checks: exactly 10,000 distinct entries, byte-identical bodies, empty DLQ.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
AMQP_URL = os.environ.get("DLO_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
PG = os.environ.get("DLO_TEST_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
COUNT = 10_000


def _pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(PG.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


def fault_database(kind: str, url: str, address: str, queue: str) -> dict[str, Any]:
    """A fresh PostgreSQL database migrated by a subprocess, with a ``kind`` broker at ``url``
    and a channel ``fault`` on ``address`` whose DLQ is ``queue`` (the kill -9 tests of every
    broker share it; ``drop_fault_database`` removes it)."""
    db = f"{kind[:4]}_fault_{uuid.uuid4().hex[:8]}"
    with _pg() as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    env = {
        **os.environ,
        "DATABASE_URL": PG.rsplit("/", 1)[0] + "/" + db,
        "DATABASE_CONN_MAX_AGE": "0",
        "DLO_BROKER_FAULT_URL": url,
        "DJANGO_SETTINGS_MODULE": "config.settings",
    }
    env.pop("DLO_TEST_CRASH_AFTER_COMMIT", None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, cwd=ROOT, check=True)
    setup = (
        "from channels_registry.models import Broker, Channel;"
        f"b = Broker.objects.create(name='fault', kind='{kind}', url_env='DLO_BROKER_FAULT_URL');"
        f"Channel.objects.create(broker=b, name='Fault', slug='fault', address='{address}',"
        f" dlq_address='{queue}', semantic='at-least-once', idempotency_source='message-id')"
    )
    subprocess.run([*manage, "shell", "-c", setup], env=env, cwd=ROOT, check=True)
    return {"env": env, "db": db, "queue": queue, "manage": manage}


def drop_fault_database(db: str) -> None:
    with _pg() as conn:
        conn.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


@pytest.fixture
def fault_env() -> Iterator[dict[str, Any]]:
    """A fresh database and a channel whose RabbitMQ DLQ holds ``COUNT`` dead letters."""
    from tests.conftest import broker_required

    try:
        import pika

        pika.BlockingConnection(pika.URLParameters(AMQP_URL)).close()
        _pg().close()
    except Exception as exc:  # noqa: BLE001 - any connection failure means "not reachable"
        broker_required("RabbitMQ/PostgreSQL", exc)
    queue = f"h4.fault.{uuid.uuid4().hex[:8]}.dlq"
    fault = fault_database("rabbitmq", AMQP_URL, "fault.main", queue)
    fault["expected"] = _publish(queue)
    yield fault
    _delete_queue(queue)
    drop_fault_database(fault["db"])


def _publish(queue: str) -> set[str]:
    """10,000 distinct dead letters; returns the sha256 of every body."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    rng = random.Random(4)
    hashes = set()
    for i in range(COUNT):
        if i % 10 == 0:
            body = rng.randbytes(64) + i.to_bytes(4, "big")  # binary, not UTF-8 text
        else:
            body = b'{"order": %d, "pad": "%s"}' % (i, rng.randbytes(8).hex().encode())
        hashes.add(hashlib.sha256(body).hexdigest())
        death = {
            "count": 3,
            "reason": "rejected",
            "queue": "fault.main",
            "exchange": "",
            "routing-keys": ["fault.main"],
            "time": dt.datetime.now(dt.UTC).replace(microsecond=0),
        }
        channel.basic_publish(
            "",
            queue,
            body,
            pika.BasicProperties(
                delivery_mode=2,
                message_id=f"m-{i}",
                content_type="application/json" if i % 10 else "application/octet-stream",
                headers={
                    "x-death": [death],
                    "x-first-death-queue": "fault.main",
                    "x-first-death-reason": "rejected",
                    "x-first-death-exchange": "",
                    "x-exception-class": "OrderNotFound" if i % 2 else "Timeout",
                    "x-exception-message": f"order {i} failed",
                },
            ),
        )
    connection.close()
    assert len(hashes) == COUNT
    _wait_depth(queue, COUNT)
    return hashes


def _depth(queue: str) -> int:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def _wait_depth(queue: str, wanted: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    depth = _depth(queue)
    while depth != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        depth = _depth(queue)
    return depth


def _delete_queue(queue: str) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    connection.channel().queue_delete(queue)
    connection.close()


def _rows(db: str) -> int:
    with _pg(db) as conn:
        return int(conn.execute("SELECT count(*) FROM dlq_deadletter").fetchone()[0])


def ingest_process(fault: dict[str, Any], **extra_env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*fault["manage"], "ingest", "--once", "--channel", "fault"],
        env={**fault["env"], **extra_env},
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def assert_complete(fault: dict[str, Any], depth: Callable[[str, int], int] | None = None) -> None:
    """Exactly ``COUNT`` distinct, byte-identical entries, and the DLQ empty."""
    with _pg(fault["db"]) as conn:
        rows = conn.execute("SELECT dedupe_key, body, body_sha256 FROM dlq_deadletter").fetchall()
    assert len(rows) == COUNT
    assert len({r[0] for r in rows}) == COUNT
    assert {hashlib.sha256(bytes(r[1])).hexdigest() for r in rows} == fault["expected"]
    assert all(hashlib.sha256(bytes(r[1])).hexdigest() == r[2] for r in rows)
    assert (depth or _wait_depth)(fault["queue"], 0) == 0


def _run_to_completion(fault: dict[str, Any]) -> str:
    done = subprocess.run(
        [*fault["manage"], "ingest", "--once", "--channel", "fault"],
        env=fault["env"],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return done.stdout.decode()


def _wait_rows(db: str, proc: subprocess.Popen[bytes], at_least: int) -> int:
    deadline = time.monotonic() + 60
    rows = _rows(db)
    while rows < at_least and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
        rows = _rows(db)
    return rows


# -- the cases, shared by every broker's kill -9 tests (test_faults_activemq.py) --------------
#: ``depth(queue, wanted, timeout=20.0)``: the DLQ's depth once it is ``wanted`` (bounded).
Depth = Callable[..., int]


def kill_9_case(fault: dict[str, Any], depth: Depth) -> None:
    """The ingester killed -9 at a random point, then run to completion."""
    proc = ingest_process(fault)
    _wait_rows(fault["db"], proc, random.randint(1, 5000))
    time.sleep(random.uniform(0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the ingester finished before the kill"
    killed_at = _rows(fault["db"])
    assert 0 < killed_at < COUNT
    # The broker still has everything not acknowledged (at least what was not committed).
    assert depth(fault["queue"], -1, timeout=2) >= COUNT - killed_at
    _run_to_completion(fault)
    assert_complete(fault, depth)


def crash_after_commit_case(fault: dict[str, Any], depth: Depth) -> None:
    """The ingester dies between its first commit and the ack of that batch."""
    proc = ingest_process(fault, DLO_TEST_CRASH_AFTER_COMMIT="1")
    proc.wait(timeout=120)
    assert proc.returncode == 137
    committed = _rows(fault["db"])
    assert 0 < committed <= 500  # one batch committed ...
    assert depth(fault["queue"], COUNT) == COUNT  # ... and none acknowledged
    out = _run_to_completion(fault)
    assert f"{COUNT} fetched, {COUNT - committed} new, {committed} duplicates" in out
    assert_complete(fault, depth)


def database_lost_case(fault: dict[str, Any], depth: Depth) -> None:
    """The database goes away under the ingester: only committed batches are acknowledged."""
    db = fault["db"]
    proc = ingest_process(fault)
    _wait_rows(db, proc, 1000)
    with _pg() as conn:  # the database goes away under the ingester
        conn.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [db]
        )
    proc.wait(timeout=120)
    assert proc.returncode != 0
    with _pg() as conn:
        conn.execute(f'ALTER DATABASE "{db}" ALLOW_CONNECTIONS true')
    committed = _rows(db)
    assert 0 < committed < COUNT
    # Only committed batches were acknowledged: the broker kept every other message.
    assert depth(fault["queue"], COUNT - committed) == COUNT - committed
    _run_to_completion(fault)
    assert_complete(fault, depth)


def test_kill_9_at_a_random_point_loses_and_duplicates_nothing(fault_env: dict[str, Any]) -> None:
    kill_9_case(fault_env, _wait_depth)


def test_crash_between_commit_and_ack_is_deduplicated(fault_env: dict[str, Any]) -> None:
    crash_after_commit_case(fault_env, _wait_depth)


def test_database_lost_mid_drain_acks_nothing_uncommitted(fault_env: dict[str, Any]) -> None:
    database_lost_case(fault_env, _wait_depth)
