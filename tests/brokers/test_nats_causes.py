"""NATS faults and causes found under real traffic (issue 22, items 4 and 6), against the real
NATS on loopback and a private server without JetStream."""

# ruff: noqa: F811 - fixtures imported from the neighbouring modules
from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import nats
import pytest
from nats.aio.client import Client as NATS

from brokers.base import Address, BrokerError, OutgoingMessage
from brokers.nats_jetstream import NatsJetStreamAdapter
from tests.brokers.test_nats_jetstream import (  # noqa: F401 - fixtures
    NATS_SERVER,
    _free_port,
    _stream,
    _with_nats,
    adapter,
    nats_streams,
)

pytestmark = pytest.mark.broker


@pytest.fixture
def nats_without_jetstream() -> Iterator[str]:
    """A private nats-server with JetStream off: it accepts connections, JetStream is absent."""
    import os
    import socket
    import time

    if not (os.path.isfile(NATS_SERVER) and os.access(NATS_SERVER, os.X_OK)):
        pytest.skip(f"nats-server binary not found at {NATS_SERVER}")
    port = _free_port()
    process = subprocess.Popen(
        [NATS_SERVER, "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(400):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_publisher_without_jetstream_is_an_outage_not_a_refusal(
    nats_without_jetstream: str,
) -> None:
    adapter = NatsJetStreamAdapter(nats_without_jetstream, timeout=2.0)
    with pytest.raises(BrokerError) as caught:
        adapter.open_publisher(Address("orders.replay"))
    assert caught.value.connection_lost is True
    assert caught.value.permanent is False
    assert "JetStream does not answer" in str(caught.value)


def test_publisher_keeps_a_clients_own_nats_msg_id(
    adapter: NatsJetStreamAdapter, nats_streams: list[str]
) -> None:
    stream, prefix = _stream(nats_streams)
    own = f"client-{uuid.uuid4().hex}"
    message = OutgoingMessage(
        key="k", body=b"{}", headers={"Nats-Msg-Id": own, "x-dlq-replay-id": "replay-1"}
    )
    bare = OutgoingMessage(key="b", body=b"{}", headers={"x-dlq-replay-id": "replay-2"})
    with adapter.publisher(Address(f"{prefix}.replay")) as publisher:
        outcomes = publisher.publish([message, bare])
        again = publisher.publish([message])  # within duplicate_window: dropped by the server

    async def read_back(nc: NATS) -> list[dict[str, str]]:
        js = nc.jetstream()
        return [dict((await js.get_msg(stream, seq)).headers or {}) for seq in (1, 2)]

    first, second = _with_nats(read_back)
    assert [o.confirmed for o in outcomes] == [True, True]
    assert first["Nats-Msg-Id"] == own and first["x-dlq-replay-id"] == "replay-1"
    assert second["Nats-Msg-Id"] == "replay-2"  # no id of its own: the replay id dedups
    # Not delivered is not "replayed": the duplicate drop is reported as a refusal.
    assert again[0].confirmed is False and again[0].refused is True
    assert "duplicate_window" in again[0].reason
    assert _with_nats(lambda nc: nc.jetstream().stream_info(stream)).state.messages == 2


def test_publisher_to_a_subject_no_stream_captures_is_still_refused(
    adapter: NatsJetStreamAdapter,
) -> None:
    try:
        _with_nats(lambda nc: nc.jetstream().account_info())
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NATS JetStream not reachable: {exc!r}")
    with adapter.publisher(Address(f"nobody.listens.{uuid.uuid4().hex}")) as publisher:
        [outcome] = publisher.publish([OutgoingMessage(key="o", body=b"x", headers={})])
    assert outcome.refused and outcome.permanent and not outcome.connection_lost
    assert "no stream captures" in outcome.reason


_ = nats  # imported for the fixtures' module
