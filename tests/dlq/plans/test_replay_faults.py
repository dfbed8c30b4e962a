"""The relay under ``kill -9``, against the real RabbitMQ and ActiveMQ and PostgreSQL on loopback.

A five-batch replay runs as a subprocess (``manage.py replay --plan ID --run``) on its own
database; it is killed at a random point (or exactly between a publish and the commit of its
outcomes) and restarted. Afterwards: every entry REPLAYED or FAILED, none stuck; every replay id
arrived at the origin queue at least once; extra copies at most the relay's in-flight window and
carrying an id of the same item; exactly one request and one terminal audit event per entry.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlq.plans.relay import BATCH_SIZE, IN_FLIGHT

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
AMQP_URL = os.environ.get("DLO_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
STOMP_URL = os.environ.get("DLO_TEST_ACTIVEMQ_URL", "stomp://127.0.0.1:61613")
PG = os.environ.get("DLO_TEST_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
COUNT = 5 * BATCH_SIZE  # five batches: room to kill the relay between any two of them


def _pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(PG.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


class RabbitTarget:
    """The origin queue on the shared RabbitMQ."""

    url = AMQP_URL

    def __init__(self) -> None:
        import pika

        from tests.conftest import broker_required

        try:
            self.connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        except Exception as exc:  # noqa: BLE001 - any connection failure means "not reachable"
            broker_required("RabbitMQ", exc)
        self.queue = f"h6.fault.{uuid.uuid4().hex[:8]}"
        self.connection.channel().queue_declare(self.queue, durable=True)

    def received(self) -> list[str]:
        """The replay id of every copy that reached the queue (consumed)."""
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        channel = connection.channel()
        ids = []
        while True:
            method, props, _body = channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                break
            assert "x-death" not in props.headers and "x-first-death-queue" not in props.headers
            ids.append(props.headers["x-dlq-replay-id"])
        connection.close()
        return ids

    def close(self) -> None:
        self.connection.channel().queue_delete(self.queue)
        self.connection.close()


class ActiveMQTarget:
    """The origin queue on the shared ActiveMQ (created by the replay's first SEND)."""

    url = STOMP_URL

    def __init__(self) -> None:
        from brokers.activemq import ActiveMQAdapter
        from tests.brokers.test_activemq import require_activemq

        require_activemq(STOMP_URL)
        self.adapter = ActiveMQAdapter(STOMP_URL, timeout=10.0)
        self.queue = f"h6.fault.{uuid.uuid4().hex[:8]}"

    def received(self) -> list[str]:
        """Drained and acknowledged batch by batch (ActiveMQ pages 200 at a time), bounded."""
        from brokers.base import Address

        ids: list[str] = []
        with self.adapter.drain(Address(self.queue)) as session:
            for _ in range(4 * COUNT // 100):
                batch = session.fetch(500, wait_s=2.0)
                if not batch:
                    break
                for copy in batch:
                    assert "dlqDeliveryFailureCause" not in copy.headers
                    assert "original_destination" not in copy.properties
                    ids.append(str(copy.headers["x-dlq-replay-id"]))
                session.ack(batch)
        return ids

    def close(self) -> None:
        self.received()  # leave nothing behind: STOMP cannot delete the queue


TARGETS: dict[str, Any] = {"rabbitmq": RabbitTarget, "activemq": ActiveMQTarget}


@pytest.fixture(params=sorted(TARGETS))
def fault(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    from tests.conftest import broker_required

    try:
        _pg().close()
    except Exception as exc:  # noqa: BLE001 - any connection failure means "not reachable"
        broker_required("PostgreSQL", exc)
    kind = request.param
    target = TARGETS[kind]()
    queue = target.queue
    db = f"h6_fault_{uuid.uuid4().hex[:8]}"
    with _pg() as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    env = {
        **os.environ,
        "DATABASE_URL": PG.rsplit("/", 1)[0] + "/" + db,
        "DATABASE_CONN_MAX_AGE": "0",
        "DLO_BROKER_FAULT_URL": target.url,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DLO_REPLAY_LEASE_S": "1",
        "DLO_FOUR_EYES_THRESHOLD": str(COUNT),  # the plan runs without a second person
    }
    for name in ("DLO_TEST_RELAY_CRASH_AFTER", "CELERY_BROKER_URL"):
        env.pop(name, None)
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, cwd=ROOT, check=True)
    subprocess.run(
        [*manage, "shell", "-c",
         f"from tests.dlq.replay_fault_setup import setup; setup({queue!r}, {COUNT}, {kind!r})"],
        env=env, cwd=ROOT, check=True,
    )  # fmt: skip
    out = subprocess.run(
        [*manage, "replay", "--channel", "fault", "--reason", "fault test", "--rate", "500",
         "--yes"],
        env=env, cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()  # fmt: skip
    plan_id = int(out.split("replay plan #", 1)[1].split(":", 1)[0])
    yield {"env": env, "db": db, "queue": queue, "manage": manage, "plan": plan_id,
           "target": target}  # fmt: skip
    target.close()
    with _pg() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def _relay(fault: dict[str, Any], **extra_env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*fault["manage"], "replay", "--plan", str(fault["plan"]), "--run"],
        env={**fault["env"], **extra_env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _confirmed(db: str) -> int:
    with _pg(db) as conn:
        return int(conn.execute("SELECT confirmed FROM dlq_replayplan").fetchone()[0])


def _restart_to_completion(fault: dict[str, Any]) -> None:
    time.sleep(1.2)  # the killed relay's lease expires
    done = subprocess.run(
        [*fault["manage"], "replay", "--plan", str(fault["plan"]), "--run"],
        env=fault["env"], cwd=ROOT, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert "status done" in done.stdout.decode(), done.stdout.decode()


def _assert_every_entry_accounted_for(fault: dict[str, Any], crashes: int) -> int:
    """Returns the number of extra copies that reached the queue."""
    with _pg(fault["db"]) as conn:
        statuses = dict(
            conn.execute("SELECT status, count(*) FROM dlq_entrystate GROUP BY status").fetchall()
        )
        items = conn.execute("SELECT id, status, replay_id FROM dlq_replayitem").fetchall()
        audit = [
            (str(message[0]), message[4])
            for (after,) in conn.execute(
                "SELECT after FROM audit_auditevent WHERE action = 'dlq.replay.outcomes'"
            ).fetchall()
            for message in after["messages"]
        ]
        [(requested,)] = conn.execute(
            "SELECT sum((after->>'entries')::int) FROM audit_auditevent "
            "WHERE action = 'dlq.replay.request'"
        ).fetchall()
    assert set(statuses) <= {"replayed", "failed"} and sum(statuses.values()) == COUNT
    assert {s for _, s, _ in items} <= {"confirmed", "failed"}
    received = fault["target"].received()
    final_ids = {r for _, _, r in items}
    counts = collections.Counter(received)
    assert final_ids <= set(counts)  # every replay id arrived at least once
    assert set(counts) <= final_ids  # no copy carries a foreign id
    extra = len(received) - len(final_ids)
    assert 0 <= extra <= crashes * IN_FLIGHT  # duplicates bounded by the in-flight window
    per_entry = collections.Counter((t, a) for t, a in audit)
    assert requested == COUNT  # the chunks' request events cover every entry once
    for entry_id in {t for t, _ in audit}:
        terminal = per_entry[(entry_id, "replayed")] + per_entry[(entry_id, "failed")]
        assert terminal == 1
    assert len({t for t, _ in audit}) == COUNT
    verify = subprocess.run(
        [*fault["manage"], "audit", "verify"], env=fault["env"], cwd=ROOT, capture_output=True
    )
    assert verify.returncode == 0, verify.stdout.decode() + verify.stderr.decode()
    return extra


def test_kill_9_at_a_random_point_then_restart(fault: dict[str, Any]) -> None:
    target = random.randint(50, COUNT - 2 * BATCH_SIZE)
    proc = _relay(fault)
    deadline = time.monotonic() + 120
    while _confirmed(fault["db"]) < target and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert _confirmed(fault["db"]) < COUNT, "the relay finished before the kill"
    _restart_to_completion(fault)
    _assert_every_entry_accounted_for(fault, crashes=1)


def test_crash_between_publish_and_outcome_republishes_the_same_ids(
    fault: dict[str, Any],
) -> None:
    proc = _relay(fault, DLO_TEST_RELAY_CRASH_AFTER=str(random.randint(1, 4)))
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 137, err.decode()[-2000:]
    with _pg(fault["db"]) as conn:
        # In doubt: published, outcome not recorded. A first attempt taken from the plan's
        # cursor is still PENDING with no publish recorded; a retry is SENDING.
        in_doubt = conn.execute(
            "SELECT count(*) FROM dlq_replayitem i JOIN dlq_replayplan p ON p.id = i.plan_id "
            "WHERE i.status = 'sending' OR (i.status = 'pending' AND i.publishes = 0 "
            "AND i.position < p.claimed_through)"
        ).fetchone()[0]
    assert 0 < in_doubt <= BATCH_SIZE
    _restart_to_completion(fault)
    extra = _assert_every_entry_accounted_for(fault, crashes=1)
    assert extra == in_doubt  # the in-doubt batch went out twice, with the same ids
