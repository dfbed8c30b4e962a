"""Every adapter reports an unreachable broker in the one typed way (issue 10.3): a
``BrokerError`` with ``connection_lost=True`` from ``open_publisher`` and per-message
``PublishOutcome.connection_lost`` from a session whose broker went away — never a message text
the relay would have to parse. (Killing a live broker mid-publish is covered by
``tests/dlq/plans/test_replay_outages.py``.)"""

from __future__ import annotations

import socket

import pytest

from brokers import get_adapter
from brokers.base import Address, BrokerError, OutgoingMessage

pytestmark = [pytest.mark.broker]


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connecting is refused


URLS = {
    "rabbitmq": "amqp://guest:guest@127.0.0.1:{port}/%2F",
    "redis": "redis://127.0.0.1:{port}/0",
    "nats": "nats://127.0.0.1:{port}",
    "activemq": "stomp://127.0.0.1:{port}",
}


@pytest.mark.parametrize("kind", sorted(URLS))
def test_an_unreachable_broker_is_connection_lost_not_permanent(kind: str) -> None:
    adapter = get_adapter(kind, URLS[kind].format(port=_refused_port()), timeout=2.0)
    with pytest.raises(BrokerError) as caught:
        adapter.open_publisher(Address("dlo-nowhere"))
    assert caught.value.connection_lost and not caught.value.permanent


def test_a_redis_publisher_whose_server_went_away_reports_connection_lost() -> None:
    import redis

    from brokers.redis_streams import RedisPublisher

    publisher = RedisPublisher(redis.Redis(port=_refused_port(), socket_timeout=1), "s")
    [outcome] = publisher.publish([OutgoingMessage("k", b"x", {"h": "v"})])
    assert outcome.connection_lost and not outcome.refused and not outcome.confirmed
    publisher.close()


def test_an_activemq_publisher_whose_broker_went_away_reports_connection_lost() -> None:
    """The connection breaks under an open publisher (a proxy in front of the shared broker
    is cut): every message of the batch is ``connection_lost``, none refused or confirmed."""
    from brokers.activemq import ActiveMQAdapter
    from tests.brokers.test_activemq import require_activemq
    from tests.faultproxy import FaultProxy

    require_activemq()
    proxy = FaultProxy(("127.0.0.1", 61613))
    try:
        adapter = ActiveMQAdapter(f"stomp://127.0.0.1:{proxy.port}", timeout=2.0)
        publisher = adapter.open_publisher(Address("dlo-nowhere"))
        proxy.cut()
        outcomes = publisher.publish([OutgoingMessage(f"k{i}", b"x", {"h": "v"}) for i in range(3)])
        assert [o.key for o in outcomes] == ["k0", "k1", "k2"]
        assert all(o.connection_lost and not o.refused and not o.confirmed for o in outcomes)
        publisher.close()
    finally:
        proxy.close()


def test_a_bad_credential_is_permanent_not_connection_lost() -> None:
    error = BrokerError("auth", permanent=True, connection_lost=True)
    assert error.permanent and not error.connection_lost
