"""Faults found under real traffic (issue 22, item 6) on the ingest and replay paths, against
the real brokers and PostgreSQL."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator

import pytest
import redis
from django.contrib.auth.models import User

from channels_registry.models import BrokerKind
from dlq.capture import ingest
from dlq.models import DeadLetter, PlanStatus, ReplayItem, SearchText
from dlq.plans import relay
from tests.conftest import broker_required, make_broker, make_channel
from tests.dlq.capture.test_clients_redis import GROUP, streams  # noqa: F401 - fixture
from tests.dlq.replay_helpers import plan_for

pytestmark = [pytest.mark.broker, pytest.mark.django_db, pytest.mark.timeout(120)]


def test_redis_reaper_fields_are_metadata_and_not_replayed(
    streams: tuple[redis.Redis, str],  # noqa: F811 - the fixture
    oncall: User,
) -> None:
    r, stream = streams
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    original = {"order_id": "ord-9", "amount": "5"}
    entry_id = r.xadd(stream, original)
    # A reaper in the common shape: the original fields plus where it came from and its count.
    r.xadd(
        f"{stream}:dlq",
        {**original, "x-original-id": entry_id, "x-delivery-count": "4", "reason": "budget"},
    )
    broker = make_broker(
        name="redis", kind=BrokerKind.REDIS, url_env="DLO_BROKER_TEST_CLIENTS_REDIS"
    )
    channel = make_channel(
        broker,
        address=stream,
        address_group=GROUP,
        dlq_address=f"{stream}:dlq",
        poison_address="",
        entry_layout="field-map",
        redact_json_paths=[],
    )
    assert ingest.ingest_channel(channel).inserted == 1

    entry = DeadLetter.objects.get(channel=channel)
    assert entry.body is not None and json.loads(bytes(entry.body)) == original
    assert entry.headers == {"x-original-id": entry_id, "x-delivery-count": "4", "reason": "budget"}
    assert entry.redelivery_count == 4

    plan = plan_for([entry], oncall)
    assert relay.run_plan(plan.pk).status == PlanStatus.DONE
    got = r.xreadgroup(GROUP, "worker", {stream: ">"}, count=10)
    fields = [f for _id, f in got[0][1]]
    replay_id = ReplayItem.objects.get(plan=plan).replay_id
    assert fields == [original, {**original, "x-dlq-replay-id": replay_id}]


@pytest.mark.django_db(transaction=True)
def test_search_indexer_logs_one_line_during_a_database_outage(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The indexer thread's connection meets a PostgreSQL that refuses connections (a closed
    port stands in for the outage; the shared server is never touched): one clear line, no
    traceback, no exception escaping the thread, and the entries are caught up later."""
    import socket

    from django.db import connection

    from dlq.capture import search
    from tests.dlq.conftest import letter, store

    if connection.vendor != "postgresql":
        pytest.skip("the indexer thread runs on PostgreSQL only")
    entries = store(make_channel(), letter(b"needle-a"), letter(b"needle-b"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    caplog.set_level(logging.DEBUG, logger="dlq.capture.search")
    # The main thread's connection is open already; only the indexer's new one meets the port.
    monkeypatch.setitem(connection.settings_dict, "HOST", "127.0.0.1")
    monkeypatch.setitem(connection.settings_dict, "PORT", str(closed))
    with search.BackgroundIndexer() as indexer:
        indexer.submit([entries[0].pk])
        indexer.submit([entries[1].pk])
    monkeypatch.undo()

    lines = [
        r for r in caplog.records if r.name == "dlq.capture.search" and r.levelno >= logging.INFO
    ]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "database unavailable" in lines[0].getMessage()
    assert lines[0].exc_info is None and "\n" not in lines[0].getMessage()
    assert indexer.indexed == 0
    search.index_missing()  # the catch-up indexes whatever the outage left
    indexed = SearchText.objects.filter(entry_id__in=[e.pk for e in entries]).count()
    assert indexed == 2


@pytest.fixture
def nats_without_jetstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Our own nats-server with JetStream off (it accepts connections; JetStream never
    answers), as a server still starting JetStream looks; the shared one is never touched."""
    import shutil
    import socket
    import subprocess
    import time

    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not os.path.exists(binary):
        broker_required("nats-server", FileNotFoundError(binary))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(400):  # bounded: up to 20 s for the port
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        url = f"nats://127.0.0.1:{port}"
        monkeypatch.setenv("DLO_BROKER_TEST_NOJS_NATS", url)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_replay_to_nats_without_jetstream_waits_and_spends_no_attempt(
    nats_without_jetstream: str, oncall: User
) -> None:
    from tests.dlq.conftest import letter, store

    broker = make_broker(name="nojs", kind=BrokerKind.NATS, url_env="DLO_BROKER_TEST_NOJS_NATS")
    channel = make_channel(
        broker, address="ORDERS", address_group="workers", dlq_address="", poison_address=""
    )
    entries = store(
        channel,
        *[
            letter(properties={"stream": "ORDERS", "stream_seq": i + 1, "subject": "orders.x"})
            for i in range(5)
        ],
    )
    plan = plan_for(entries, oncall)

    result = relay.run_plan(plan.pk, max_seconds=4)  # a slice: the plan waits past it

    plan.refresh_from_db()
    assert result.status == PlanStatus.WAITING == plan.status
    assert "JetStream does not answer" in plan.status_note
    items = ReplayItem.objects.filter(plan=plan)
    assert {i.attempts for i in items} == {0}
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {"replaying"}


@pytest.fixture
def silent_stomp(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A TCP listener that accepts and never answers STOMP's CONNECT, as an ActiveMQ still
    starting (or wedged) looks from a client; the shared broker is never touched."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # the kernel accepts; nobody ever answers
    url = f"stomp://127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.setenv("DLO_BROKER_TEST_SILENT_STOMP", url)
    try:
        yield url
    finally:
        server.close()


def test_replay_to_an_activemq_that_never_answers_waits_and_spends_no_attempt(
    silent_stomp: str, oncall: User, settings: object
) -> None:
    """The ActiveMQ counterpart of the NATS case above: the TCP connection opens, the STOMP
    CONNECTED never comes. The wait is bounded by the broker timeout, and the plan waits for
    the broker instead of failing its entries."""
    from tests.dlq.conftest import letter, store

    settings.DLO_BROKER_TIMEOUT_S = 1.0  # type: ignore[attr-defined]
    broker = make_broker(
        name="silent", kind=BrokerKind.ACTIVEMQ, url_env="DLO_BROKER_TEST_SILENT_STOMP"
    )
    channel = make_channel(broker, address="orders", dlq_address="DLQ.orders", poison_address="")
    entries = store(channel, *[letter() for _ in range(5)])
    plan = plan_for(entries, oncall)

    result = relay.run_plan(plan.pk, max_seconds=4)  # a slice: the plan waits past it

    plan.refresh_from_db()
    assert result.status == PlanStatus.WAITING == plan.status
    assert "no answer in time" in plan.status_note
    items = ReplayItem.objects.filter(plan=plan)
    assert {i.attempts for i in items} == {0}
    assert set(DeadLetter.objects.values_list("state__status", flat=True)) == {"replaying"}
